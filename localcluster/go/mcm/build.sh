#!/usr/bin/env bash
# Builds, for one machine-controller-manager version (default: the first in versions.env), MCM's
# controller-manager and our provider machine controller (MCM's provider framework with the in-memory
# driver in provider/) into a cache directory outside the work tree, keyed by version, go.mod/go.sum and the
# driver source, and prints that directory. A warm cache returns at once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.env"
version=${1:-${MCM_VERSIONS%% *}}
mod="$here/$version"
if [ ! -f "$mod/go.mod" ] || [ ! -f "$mod/go.sum" ]; then
  echo "build.sh: no $mod/go.mod; known versions: $MCM_VERSIONS (./regen-gomod.sh VERSION adds one)" >&2
  exit 1
fi
key="${version}-$(cat "$mod/go.mod" "$mod/go.sum" "$here"/provider/*.go | sha256sum | cut -c1-12)"
out="${MP_CACHE_DIR:-$HOME/.cache/machine-preservation}/mcm-bin/$key"
if [ -x "$out/machine-controller-manager" ] && [ -x "$out/machine-controller" ]; then
  echo "$out"; exit 0
fi
command -v go >/dev/null || { echo "build.sh: Go (>= the go line in $mod/go.mod) is required" >&2; exit 1; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly"
tmp="$out.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp/src/cmd/machine-controller" "$tmp/bin"
trap 'rm -rf "$tmp"' EXIT
# The module is assembled in a scratch directory: go.mod/go.sum of this version plus the shared driver.
cp "$mod/go.mod" "$mod/go.sum" "$tmp/src/"
cp "$here"/provider/*.go "$tmp/src/cmd/machine-controller/"
cd "$tmp/src"
echo "build.sh: building machine-controller-manager $version into $out (a cold build takes minutes)" >&2
ldflags="-s -w -X $MCM_MODULE/pkg/version.Version=$version"
# One invocation so the packages both binaries share compile once.
go build -ldflags="$ldflags" -o "$tmp/bin/" ./cmd/machine-controller "$MCM_MODULE/cmd/machine-controller-manager"
rm -rf "$out"; mv "$tmp/bin" "$out"
echo "$out"

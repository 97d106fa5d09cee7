#!/usr/bin/env bash
# Builds Gardener's gardener-resource-manager (GRM_VERSION in versions.env) into a cache directory outside the
# work tree, keyed by version and go.mod/go.sum, and prints that directory. A warm cache returns at once; a cold
# build takes several minutes on 2 cores (Gardener is a large module).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.env"
if [ ! -f "$here/go.mod" ] || [ ! -f "$here/go.sum" ]; then
  echo "build.sh: no $here/go.mod; ./regen-gomod.sh writes it" >&2
  exit 1
fi
key="${GRM_VERSION}-$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)"
out="${MP_CACHE_DIR:-$HOME/.cache/machine-preservation}/grm-bin/$key"
if [ -x "$out/gardener-resource-manager" ]; then
  echo "$out"; exit 0
fi
command -v go >/dev/null || { echo "build.sh: Go (>= the go line in $here/go.mod) is required" >&2; exit 1; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly"
tmp="$out.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp/src" "$tmp/bin"
trap 'rm -rf "$tmp"' EXIT
cp "$here/go.mod" "$here/go.sum" "$tmp/src/"
cd "$tmp/src"
echo "build.sh: building gardener-resource-manager $GRM_VERSION into $out (a cold build takes minutes)" >&2
go build -ldflags="-s -w" -o "$tmp/bin/" "$GARDENER_MODULE/cmd/gardener-resource-manager"
rm -rf "$out"; mv "$tmp/bin" "$out"
echo "$out"

#!/usr/bin/env bash
# Writes go.mod and go.sum for the gardener-resource-manager build: our own module that requires Gardener at
# GRM_VERSION and names its command as a tool. It requires github.com/gardener/gardener/pkg/apis at the same
# version explicitly: Gardener's go.mod replaces that nested module with a relative path, which does not apply to
# a dependency, so without the explicit line Go would pick an older pkg/apis than the one Gardener was built with.
# Run it after changing GRM_VERSION in versions.env; commit the result.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
upstream_gomod=$(go mod download -json "$GARDENER_MODULE@$GRM_VERSION" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
goline=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$upstream_gomod")
goline=$(printf '%s\n1.24.0\n' "$goline" | sort -V | tail -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
go mod init example.invalid/grm-testbin >/dev/null 2>&1
go mod edit -go="$goline" -require="$GARDENER_MODULE@$GRM_VERSION" -require="$GARDENER_MODULE/pkg/apis@$GRM_VERSION" \
  -tool="$GARDENER_MODULE/cmd/gardener-resource-manager"
go mod tidy
# tidy may move pkg/apis to the indirect block; it must stay required at GRM_VERSION.
go mod edit -require="$GARDENER_MODULE/pkg/apis@$GRM_VERSION"
grep -q "$GARDENER_MODULE/pkg/apis $GRM_VERSION" go.mod || { echo "regen-gomod.sh: pkg/apis not at $GRM_VERSION" >&2; exit 1; }
cp go.mod go.sum "$here/"
echo "wrote $here/go.mod and go.sum (go $goline)"

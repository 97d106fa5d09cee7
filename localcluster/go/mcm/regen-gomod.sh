#!/usr/bin/env bash
# Writes VERSION/go.mod and VERSION/go.sum for one machine-controller-manager version: our own module that
# requires MCM at that version, tidied against provider/ (our driver) and MCM's controller-manager main.
# Run it when adding a version to versions.env or when provider/ imports something new; commit the result.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.env"
version=${1:?usage: regen-gomod.sh VERSION (one of: $MCM_VERSIONS)}
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
upstream_gomod=$(go mod download -json "$MCM_MODULE@$version" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
# MCM's own go line sets the GODEBUG defaults it was built for; the tool directive needs at least 1.24.
goline=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$upstream_gomod")
goline=$(printf '%s\n1.24.0\n' "$goline" | sort -V | tail -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cmd/machine-controller"
cp "$here"/provider/*.go "$tmp/cmd/machine-controller/"
cd "$tmp"
go mod init example.invalid/mcm-testbin >/dev/null 2>&1
go mod edit -go="$goline" -require="$MCM_MODULE@$version" -tool="$MCM_MODULE/cmd/machine-controller-manager"
go mod tidy
mkdir -p "$here/$version"
cp go.mod go.sum "$here/$version/"
echo "wrote $here/$version/go.mod and go.sum (go $goline)"

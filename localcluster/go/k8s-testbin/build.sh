#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and etcd from the Go module proxy into a cache
# directory outside the work tree, keyed by version and go.sum, and prints that directory.
# A warm cache returns at once; a cold build takes ~10-25 minutes on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.env"
key="${K8S_VERSION}-$(sha256sum "$here/go.sum" | cut -c1-12)"
out="${MP_CACHE_DIR:-$HOME/.cache/machine-preservation}/k8s-bin/$key"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ] && [ -x "$out/kube-controller-manager" ]; then
  echo "$out"; exit 0
fi
command -v go >/dev/null || { echo "build.sh: Go (>= the go line in go.mod) is required" >&2; exit 1; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly"
minor=${K8S_VERSION#1.}; minor=${minor%%.*}
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=v${K8S_VERSION} -X $p.gitMajor=1 -X $p.gitMinor=${minor}"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
tmp="$out.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
cd "$here"
echo "build.sh: building Kubernetes v${K8S_VERSION} control plane into $out (cold builds take minutes)" >&2
# One invocation so the packages the three binaries share compile once.
go build -tags=selinux,notest,grpcnotrace -ldflags="$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager go.etcd.io/etcd/server/v3
# go names the etcd main package after its path element before the /v3 suffix.
mv "$tmp/server" "$tmp/etcd"
rm -rf "$out"; mv "$tmp" "$out"
echo "$out"

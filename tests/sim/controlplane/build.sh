#!/usr/bin/env bash
# Build the test control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok) from the Go modules pinned in tests/cluster/build,
# into a cache outside the clone keyed by the Kubernetes version and a hash of the
# recipe. Prints the directory that holds the binaries. A second run, or another
# clone on the same machine, reuses them.
#
#   GPUFLEET_BUILD_CACHE   where built binaries live (default ~/.cache/gpufleet)
#
# The Go checksum database is not reachable from the machines this runs on, so the
# checksums committed in go.sum are what every download is held
# to (GOFLAGS=-mod=readonly: a module whose hash differs fails the build).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
module="$here"
cache_root="${GPUFLEET_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet}"

command -v go >/dev/null || { echo "build.sh: Go is needed to build the control plane (apt-get install golang-go, or Go >= 1.26)" >&2; exit 1; }

export GOFLAGS=-mod=readonly GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=0

cd "$module"
version_of() { go list -m -f '{{.Version}}' "$1"; }
kube="$(version_of k8s.io/kubernetes)"
recipe="$(cat go.mod go.sum "$here/build.sh" | sha256sum | cut -c1-12)"
out="$cache_root/controlplane/$kube-$recipe"
tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)

complete=1
for tool in "${tools[@]}"; do [ -x "$out/bin/$tool" ] || complete=0; done
if [ "$complete" = 1 ]; then
  echo "$out/bin"
  exit 0
fi

# Every staging module of the pinned k8s.io/kubernetes must be replaced by its
# published release of the same version, or the build would take another one.
staging_version="v0.${kube#v1.}"
kube_mod="$(go mod download -json "k8s.io/kubernetes@$kube" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
want="$(sed -n 's#^\s*\(k8s\.io/[A-Za-z0-9-]*\) => \./staging/.*#\1#p' "$kube_mod" | sort)"
have="$(go mod edit -json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    print(r["Old"]["Path"], r["New"]["Path"], r["New"].get("Version", ""))' | sort)"
expected="$(for m in $want; do echo "$m $m $staging_version"; done)"
if [ "$have" != "$expected" ]; then
  echo "build.sh: the replace block of $module/go.mod does not match the staging modules of" >&2
  echo "k8s.io/kubernetes $kube (each must be replaced by its own $staging_version):" >&2
  diff <(echo "$expected") <(echo "$have") >&2 || true
  exit 1
fi

released="$(go mod download -json "k8s.io/kubernetes@$kube" | sed -n 's/^\s*"Time": "\(.*\)",$/\1/p')"
minor="${kube#v1.}"; minor="${minor%%.*}"
ldflags=()
# What Kubernetes' own build (hack/lib/version.sh) stamps into both version packages.
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=("-X $pkg.gitVersion=$kube" "-X $pkg.gitMajor=1" "-X $pkg.gitMinor=$minor"
            "-X $pkg.gitTreeState=clean" "-X $pkg.buildDate=$released")
done

echo "building the control plane $kube into $out (cold: tens of minutes on 2 cores)" >&2
start=$SECONDS
tmp="$out.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp/bin"
trap 'rm -rf "$tmp"' EXIT
go build -trimpath -ldflags "-s -w ${ldflags[*]}" -o "$tmp/bin/" tool
# The etcd server module's main package is named after its path (…/server/v3).
mv "$tmp/bin/server" "$tmp/bin/etcd"
for tool in "${tools[@]}"; do [ -x "$tmp/bin/$tool" ] || { echo "build.sh: $tool was not built" >&2; exit 1; }; done
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "built in $((SECONDS - start)) s" >&2
echo "$out/bin"

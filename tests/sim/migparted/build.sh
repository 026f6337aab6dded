#!/usr/bin/env bash
# Build NVIDIA's nvidia-mig-parted from its published Go module at the version go.mod pins,
# once, into a cache outside the clone keyed by the version and a hash of the recipe, with
# the files upstream packages beside it (its deployments/systemd: the nvidia-mig-manager
# service, hooks and Debian maintainer scripts, taken from the same module). Prints the
# directory: bin/nvidia-mig-parted and systemd/. A second run, or another clone on the
# same machine, reuses it.
#
#   GPUFLEET_BUILD_CACHE   where built binaries live (default ~/.cache/gpufleet)
#
# The Go checksum database is not reachable from the machines this runs on, so the
# checksums committed in go.sum are what every download is held to
# (GOFLAGS=-mod=readonly: a module whose hash differs fails the build). The binary is
# stamped like upstream's Makefile stamps it (internal/info.version); the proxy records
# no release commit for it, so none is stamped.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${GPUFLEET_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet}"
module=github.com/NVIDIA/mig-parted

command -v go >/dev/null || { echo "migparted/build.sh: Go is needed to build mig-parted (Go >= 1.26)" >&2; exit 1; }
# cgo: go-nvml reaches libnvidia-ml.so.1 through dlopen from C.
export GOFLAGS="-mod=readonly -buildvcs=false" GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=1

cd "$here"
version="$(go list -m -f '{{.Version}}' "$module")"
recipe="$( (cat go.mod go.sum build.sh; go env GOVERSION) | sha256sum | cut -c1-12)"
out="$cache_root/migparted/$version-$recipe"
if [ -x "$out/bin/nvidia-mig-parted" ] && [ -f "$out/systemd/nvidia-mig-manager.service" ]; then
  echo "$out"
  exit 0
fi

echo "building nvidia-mig-parted $version into $out" >&2
tmp="$out.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
# What upstream's Makefile passes (NVML's symbols are resolved at dlopen).
go build -trimpath -o "$tmp/bin/" \
  -ldflags "-s -w -extldflags=-Wl,-z,lazy -X $module/internal/info.version=$version" \
  "$module/cmd/nvidia-mig-parted"
source_dir="$(go list -m -f '{{.Dir}}' "$module")"
cp -r "$source_dir/deployments/systemd" "$tmp/systemd"
chmod -R u+w "$tmp/systemd"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "$out"

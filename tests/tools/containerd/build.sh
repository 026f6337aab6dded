#!/usr/bin/env bash
# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
# Build containerd 2.x from its published Go module at the version go.mod pins, once,
# into a cache outside the clone keyed by the version and a hash of the recipe: what
# upstream's release archive holds (bin/containerd, bin/ctr, bin/containerd-shim-runc-v2)
# and its systemd unit (containerd.service, from the same module). Prints the directory.
# A second run, or another clone on the same machine, reuses it. Nothing is installed or
# started on this machine: the unit tests run the daemon on configs of theirs, and the
# adoption e2e installs it in a simulated node as a site installs a release.
#
#   GPUFLEET_BUILD_CACHE   where built binaries live (default ~/.cache/gpufleet)
#
# The Go checksum database is not reachable from the machines this runs on, so the
# checksums committed in go.sum are what every download is held to
# (GOFLAGS=-mod=readonly: a module whose hash differs fails the build).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${GPUFLEET_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet}"
module=github.com/containerd/containerd/v2

command -v go >/dev/null || { echo "containerd/build.sh: Go is needed to build containerd (Go >= 1.26.6)" >&2; exit 1; }
export GOFLAGS="-mod=readonly -buildvcs=false" GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=0

cd "$here"
version="$(go list -m -f '{{.Version}}' "$module")"
recipe="$( (cat go.mod go.sum build.sh; go env GOVERSION) | sha256sum | cut -c1-12)"
out="$cache_root/containerd/$version-$recipe"
if [ -x "$out/bin/containerd" ] && [ -f "$out/containerd.service" ]; then
  echo "$out"
  exit 0
fi

echo "building containerd $version into $out" >&2
tmp="$out.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
# The build tags and version stamp upstream's Makefile uses for a static release build
# (without cgo, and so without the btrfs snapshotter: no_btrfs); the shim, as upstream
# builds it, without the gRPC server.
tags="urfave_cli_no_docs no_btrfs osusergo netgo static_build"
stamp="-s -w -X $module/version.Version=$version -X $module/version.Package=$module"
go build -trimpath -o "$tmp/bin/" -tags "$tags" -ldflags "$stamp" \
  "$module/cmd/containerd" "$module/cmd/ctr"
go build -trimpath -o "$tmp/bin/" -tags "$tags no_grpc" -ldflags "$stamp" \
  "$module/cmd/containerd-shim-runc-v2"
cp "$(go list -m -f '{{.Dir}}' "$module")/containerd.service" "$tmp/"
chmod u+w "$tmp/containerd.service"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "$out"

#!/usr/bin/env bash
# The real programs that must accept the configs gpufleet writes, for the unit
# tests: Debian's containerd, unpacked into .cache/consumers (not installed, so no
# daemon starts on this machine). Skips what is already there.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)/.cache/consumers"
[ -x "$root/usr/bin/containerd" ] && exit 0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get download containerd >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get download containerd; }
mkdir -p "$root"
dpkg-deb -x containerd_*.deb "$root"
echo "consumers: $("$root/usr/bin/containerd" --version)"

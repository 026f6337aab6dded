#!/usr/bin/env bash
# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
# The real programs the unit tests feed gpufleet's output to, unpacked into
# .cache/consumers (not installed, so no daemon starts on this machine):
#   - Debian's containerd, which must accept the configs gpufleet writes;
#   - Debian's nvidia-smi (non-free), which runs on the mock NVML (tests/sim/nvml);
#   - Debian's Prometheus (promtool), which checks and unit-tests the alert rules.
# Skips what is already there.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)/.cache/consumers"
[ -x "$root/usr/bin/containerd" ] && [ -x "$root/usr/lib/nvidia/current/nvidia-smi" ] \
  && [ -x "$root/usr/bin/promtool" ] && exit 0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
# A private apt state with bookworm's non-free component; the host's sources are untouched.
mirror="${GPUFLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p lists/partial cache/archives/partial
echo "deb $mirror bookworm main non-free" > sources.list
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o APT::Sandbox::User=root -q)
apt-get "${apt_opts[@]}" update >/dev/null
apt-get "${apt_opts[@]}" download containerd nvidia-smi prometheus >/dev/null
mkdir -p "$root"
for deb in containerd_*.deb nvidia-smi_*.deb prometheus_*.deb; do dpkg-deb -x "$deb" "$root"; done
echo "consumers: $("$root/usr/bin/containerd" --version); nvidia-smi $(dpkg-deb -f nvidia-smi_*.deb Version);" \
  "prometheus $(dpkg-deb -f prometheus_*.deb Version)"

#!/usr/bin/env bash
# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
# The real programs the unit tests feed gpufleet's output to, unpacked into
# .cache/consumers (not installed, so no daemon starts on this machine):
#   - Debian 12's containerd (1.6), which must accept the configs gpufleet writes;
#   - Debian 12's nvidia-smi (non-free), which runs on the mock NVML (tests/sim/nvml);
#   - Debian 12's Prometheus (promtool), which checks and unit-tests the alert rules;
#   - Debian 13's containerd (1.7) and Docker (docker.io 26, whose dockerd --validate
#     checks daemon.json), and its nvidia-smi (550), under .cache/consumers/trixie.
# Skips what is already there.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)/.cache/consumers"
[ -x "$root/usr/bin/containerd" ] && [ -x "$root/usr/lib/nvidia/current/nvidia-smi" ] \
  && [ -x "$root/usr/bin/promtool" ] && [ -x "$root/trixie/usr/bin/containerd" ] \
  && [ -x "$root/trixie/usr/sbin/dockerd" ] \
  && [ -x "$root/trixie/usr/lib/nvidia/current/nvidia-smi" ] && exit 0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mirror="${GPUFLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# fetch RELEASE COMPONENTS INTO PACKAGE...: a private apt state for one release (the
# host's sources are untouched); the packages downloaded and unpacked into INTO.
fetch() {
  local release="$1" components="$2" into="$3" state="$work/$1"
  shift 3
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$into"
  echo "deb $mirror $release $components" > "$state/sources.list"
  local apt_opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
                  -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
                  -o APT::Sandbox::User=root -q)
  apt-get "${apt_opts[@]}" update >/dev/null
  (cd "$state" && apt-get "${apt_opts[@]}" download "$@" >/dev/null)
  for package in "$@"; do dpkg-deb -x "$state/${package}"_*.deb "$into"; done
}

fetch bookworm "main non-free" "$root" containerd nvidia-smi prometheus
fetch trixie "main non-free" "$root/trixie" containerd docker.io nvidia-smi
version() { dpkg-deb -f "$work/$1/$2"_*.deb Version; }
echo "consumers: Debian 12's containerd $(version bookworm containerd)," \
  "nvidia-smi $(version bookworm nvidia-smi), prometheus $(version bookworm prometheus);" \
  "Debian 13's containerd $(version trixie containerd), docker.io $(version trixie docker.io)," \
  "nvidia-smi $(version trixie nvidia-smi)"

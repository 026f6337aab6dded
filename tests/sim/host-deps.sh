#!/usr/bin/env bash
# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
# Install what the simulated fleet and the test suite need on this machine, from
# Debian's packages, and only what is missing. Needs root (or passwordless sudo) on a
# Debian or Ubuntu host.
set -euo pipefail

# command -> package providing it
declare -A wanted=(
  [podman]=podman [runc]=runc [conmon]=conmon [netavark]=netavark
  [aardvark-dns]=aardvark-dns [iptables]=iptables [slirp4netns]=slirp4netns
  [debootstrap]=debootstrap [gpg]=gnupg [apt-ftparchive]=apt-utils
  [dpkg-deb]=dpkg [gcc]=gcc [tar]=tar [make]=make
  [ssh]=openssh-client
)

missing=()
for cmd in "${!wanted[@]}"; do
  if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/lib/podman/$cmd" ] \
     && [ ! -x "/usr/libexec/podman/$cmd" ]; then
    missing+=("${wanted[$cmd]}")
  fi
done
# The interpreter the controller's virtualenv is made with (the Makefile's PYTHON).
python=${PYTHON:-python3}
if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "host-deps: Python 3.11 or newer is needed (ansible-core 2.19); found $("$python" -V)" >&2
  exit 1
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "host-deps: run as root to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "host-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"

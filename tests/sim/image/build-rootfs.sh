#!/usr/bin/env bash
# Recipe of the simulated-node image: a Debian minbase root file system (12
# "bookworm" or 13 "trixie") with systemd, python3 and the gpusim kit. Called by
# `tests/sim/fleet.py image`, which tags the result with a hash of this file and the
# kit, so a change to either rebuilds the image and nothing else does.
#
#   build-rootfs.sh ROOTFS_DIR KIT_DIR MIRROR MOCK_NVML [SUITE]
#
# MOCK_NVML is the mock libnvidia-ml.so.1 built by tests/sim/nvml/build.sh.
set -euo pipefail

rootfs=$1 kit=$2 mirror=$3 mock_nvml=$4 suite=${5:-bookworm}

packages=(
  systemd systemd-sysv dbus          # a real init, so services really start and stop
  python3 python3-yaml python3-apt   # Ansible's interpreter and its apt module
  iproute2 procps kmod curl ca-certificates gnupg
  openssh-server                     # Ansible's transport (inetd mode over podman exec)
)

debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
  "$suite" "$rootfs" "$mirror"

# A stock Debian source list (main only): enabling contrib/non-free is the
# driver role's job, as it would be on a fresh server.
cat > "$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror $suite main
deb $mirror $suite-updates main
deb ${mirror%/debian}/debian-security $suite-security main
SOURCES

# Ansible logs in as root through a per-session `sshd -i` started by podman exec
# (inventories/sim/group_vars/all/connection.yml), which alone is told to accept an
# empty password; the listening sshd keeps Debian's defaults and refuses it.
chroot "$rootfs" passwd -d root >/dev/null

# Containers get their hostname and machine id when they start.
rm -f "$rootfs/etc/hostname"
: > "$rootfs/etc/machine-id"
# Services that make no sense in a container.
# (systemd-logind stays: `shutdown -r` needs it, and a reboot must work.)
for unit in getty@tty1.service serial-getty@.service \
            systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
ln -sf /lib/systemd/system/multi-user.target "$rootfs/etc/systemd/system/default.target"

# The simulation kit and the marker that makes it impossible to mistake this node
# for a real one.
mkdir -p "$rootfs/opt/gpusim"
cp -a "$kit/." "$rootfs/opt/gpusim/"
find "$rootfs/opt/gpusim" -name __pycache__ -prune -exec rm -rf {} +
install -D -m 0755 "$mock_nvml" "$rootfs/opt/gpusim/lib/libnvidia-ml.so.1"
# A bytecode cache for Ansible's module payloads, loaded at every Python start
# (kit/python/gpusim_pyc.py says why): it makes the test fleet faster, nothing else.
python_lib=$rootfs/usr/lib/python3/dist-packages
install -m 0644 "$kit/python/gpusim_pyc.py" "$python_lib/"
echo 'import gpusim_pyc; gpusim_pyc.install()' > "$python_lib/gpusim-pyc.pth"
cat > "$rootfs/etc/gpusim-node" <<MARKER
This is a SIMULATED gpufleet GPU node (a podman container built by tests/sim).
Its PCI devices, kernel modules and NVML library are simulated by /opt/gpusim.
Nothing here is real GPU hardware.
MARKER
install -m 0644 "$kit/systemd/gpusim-boot.service" "$rootfs/etc/systemd/system/"
ln -sf /etc/systemd/system/gpusim-boot.service \
  "$rootfs/etc/systemd/system/sysinit.target.wants/gpusim-boot.service"
ln -sf /opt/gpusim/bin/modprobe "$rootfs/usr/local/sbin/modprobe"
ln -sf /opt/gpusim/bin/rmmod "$rootfs/usr/local/sbin/rmmod"

# Move aside what the driver packages install that needs the driver itself: the
# NVML library (the mock answers in its place, so Debian's nvidia-smi and every
# other NVML program run on the simulated GPUs) and the persistence daemon; and
# mig-parted (nvidia-mig-manager), which gpusim runs with the node's view of the
# kernel interfaces it reads besides NVML. gpusim keeps the replacements in step
# after every dpkg run.
chroot "$rootfs" dpkg-divert --local --rename \
  --divert /usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1.gpusim-real \
  --add /usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1
chroot "$rootfs" dpkg-divert --local --rename \
  --divert /usr/bin/nvidia-persistenced.gpusim-real --add /usr/bin/nvidia-persistenced
chroot "$rootfs" dpkg-divert --local --rename \
  --divert /usr/bin/nvidia-mig-parted.gpusim-real --add /usr/bin/nvidia-mig-parted
install -D -m 0644 "$kit/systemd/nvidia-mig-manager-kernel-view.conf" \
  "$rootfs/etc/systemd/system/nvidia-mig-manager.service.d/gpusim-kernel-view.conf"

# A profile with a driver installed outside any package (NVIDIA's .run installer)
# gets NVIDIA's nvidia-smi at /usr/bin: Debian's build of it, kept in the kit.
echo "deb $mirror $suite non-free" > "$rootfs/etc/apt/sources.list.d/gpusim-non-free.list"
chroot "$rootfs" apt-get update -q
# DKMS and the compiler it builds with, as on the provisioned servers of most GPU
# sites: the driver packages pull them in where they are missing (about 90 packages
# and 35 s of CPU on every node's first driver install here), and nothing of
# gpufleet's asks for them itself.
chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends dkms
chroot "$rootfs" sh -c 'cd /tmp && apt-get download -q nvidia-smi && dpkg-deb -x nvidia-smi_*.deb /tmp/nvidia-smi-deb'
install -D -m 0755 "$rootfs/tmp/nvidia-smi-deb/usr/lib/nvidia/current/nvidia-smi" \
  "$rootfs/opt/gpusim/preinstalled/nvidia-smi"
rm -rf "$rootfs"/tmp/nvidia-smi* "$rootfs/etc/apt/sources.list.d/gpusim-non-free.list"
echo 'post-invoke=test ! -x /opt/gpusim/bin/gpusim || /opt/gpusim/bin/gpusim sync' \
  > "$rootfs/etc/dpkg/dpkg.cfg.d/gpusim"

chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
# No package lists ship in the image: make them look stale, so that apt's
# "update if older than N seconds" logic (and Ansible's cache_valid_time) updates.
touch -d @0 "$rootfs/var/lib/apt/lists"

"""The simulated node: its profile, its simulated sysfs, and its driver state.

State that a reboot clears lives under /run/gpusim (tmpfs, like /sys): the chosen
profile, the simulated sysfs tree, which simulated kernel modules are loaded, and
what the mock NVML (tests/sim/nvml, installed as libnvidia-ml.so.1) reads about the
GPUs and the loaded module, and the GPUs' MIG instances. The device files the
loaded module provides live in /dev (a tmpfs too). What survives a reboot is real:
the dpkg database and the files on disk, and what the boards themselves keep (their
MIG mode) under /var/lib/gpusim.
"""

from __future__ import annotations

import contextlib
import filecmp
import glob
import json
import os
import re
import shutil
import socket
import stat
import struct
import subprocess
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import profiles

HOME = Path(os.environ.get("GPUSIM_HOME", "/opt/gpusim"))
RUN = Path(os.environ.get("GPUSIM_RUN", "/run/gpusim"))
MARKER = Path(os.environ.get("GPUSIM_MARKER", "/etc/gpusim-node"))
PROFILE_DIR = HOME / "profiles"
SYS = RUN / "sys"
STATE = Path(os.environ.get("GPUSIM_STATE", "/var/lib/gpusim"))
# The driver's /proc entries: a node's /proc/driver is a tmpfs its creator mounts (a
# container cannot add files to /proc otherwise); where it is not writable they are
# left out.
PROC_DRIVER = Path(os.environ.get("GPUSIM_PROC_DRIVER", "/proc/driver"))
DEV = Path(os.environ.get("GPUSIM_DEV", "/dev"))
# Where each driver version's GSP firmware is (Debian's firmware-nvidia-gsp installs
# /lib/firmware/nvidia/<version>/gsp_ga10x.bin and gsp_tu10x.bin): the real files,
# which the simulated module looks for as the real one does when it starts a GPU.
FIRMWARE = Path(os.environ.get("GPUSIM_FIRMWARE", "/lib/firmware/nvidia"))
# The real driver's device files are character devices of major 195 (and a dynamic
# major for nvidia-uvm), which the host kernel under a container has no driver for:
# opening one fails. A simulated node's are character devices numbered like
# /dev/null (1:3), the one kind a container may both create and open, so that
# programs can hold them open as they hold the real ones.
DEVICE_NUMBERS = (1, 3)

# EFI global-variable GUID under which firmware publishes SecureBoot.
EFI_GLOBAL_GUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"

# Packages whose presence means "an NVIDIA kernel module is installed for this
# kernel" on the distributions gpufleet supports (Debian, Ubuntu, RHEL family).
_KMOD_PACKAGE_GLOBS = (
    "nvidia-kernel-dkms",
    "nvidia-open-kernel-dkms",
    "nvidia-dkms-*",
    "linux-modules-nvidia-*",
    "kmod-nvidia*",
)

MODULE_ALIASES = {
    "nvidia": "nvidia",
    "nvidia-current": "nvidia",
    "nvidia_current": "nvidia",
    "nvidia-uvm": "nvidia_uvm",
    "nvidia_uvm": "nvidia_uvm",
    "nvidia-current-uvm": "nvidia_uvm",
    "nvidia-modeset": "nvidia_modeset",
    "nvidia_modeset": "nvidia_modeset",
    "nvidia-current-modeset": "nvidia_modeset",
    "nvidia-drm": "nvidia_drm",
    "nvidia_drm": "nvidia_drm",
    "nvidia-current-drm": "nvidia_drm",
    "nouveau": "nouveau",
}
NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")


class NotASimulatedNode(RuntimeError):
    pass


class ModuleError(RuntimeError):
    """A module operation failed; the message is what modprobe would print."""


def require_simulated_node() -> None:
    if not MARKER.is_file():
        raise NotASimulatedNode(
            f"gpusim: {MARKER} is missing: this is not a simulated gpufleet node; refusing to run"
        )


@dataclass(frozen=True)
class InstalledDriver:
    version: str
    module_type: str  # "open" | "proprietary"
    source: str  # "package:<name>" | "preinstalled"


def node_name() -> str:
    return os.environ.get("GPUSIM_NODE_NAME") or socket.gethostname()


def profile_name() -> str:
    path = RUN / "profile"
    if path.is_file():
        return path.read_text(encoding="utf-8").strip()
    return "none"


def profile() -> profiles.Profile:
    return profiles.load(PROFILE_DIR, profile_name(), node_name())


def _upstream_version(debian_version: str) -> str:
    version = debian_version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def installed_driver(prof: profiles.Profile) -> InstalledDriver | None:
    """Which NVIDIA kernel module is installed (packages first, then a pre-installed one)."""
    try:
        out = subprocess.run(
            [
                "dpkg-query",
                "-W",
                "-f=${db:Status-Abbrev}|${Package}|${Version}\n",
                *_KMOD_PACKAGE_GLOBS,
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    except FileNotFoundError:
        out = ""
    for line in out.splitlines():
        status, package, version = [*line.split("|"), "", ""][:3]
        # db:Status-Abbrev: wanted state, then current state ("i" = installed); a
        # held package reads "hi".
        if status[1:2] == "i":
            module_type = "open" if "open" in package else "proprietary"
            return InstalledDriver(_upstream_version(version), module_type, f"package:{package}")
    if prof.preinstalled_driver:
        return InstalledDriver(
            prof.preinstalled_driver, prof.preinstalled_module_type, "preinstalled"
        )
    return None


def nouveau_blacklisted() -> bool:
    pattern = re.compile(r"^\s*blacklist\s+nouveau\s*$", re.MULTILINE)
    for directory in (
        "/etc/modprobe.d",
        "/run/modprobe.d",
        "/usr/lib/modprobe.d",
        "/lib/modprobe.d",
    ):
        for conf in glob.glob(f"{directory}/*.conf"):
            try:
                if pattern.search(Path(conf).read_text(encoding="utf-8", errors="replace")):
                    return True
            except OSError:
                continue
    return False


# --- loaded modules, recorded in the simulated sysfs --------------------------------


def _module_dir(name: str) -> Path:
    return SYS / "module" / name


def loaded(name: str) -> bool:
    return _module_dir(name).is_dir()


def loaded_driver() -> dict[str, str] | None:
    """Version and type of the loaded nvidia module, or None."""
    if not loaded("nvidia"):
        return None
    meta = json.loads((RUN / "nvidia-module.json").read_text(encoding="utf-8"))
    return {"version": meta["version"], "module_type": meta["module_type"]}


def _bind(prof: profiles.Profile, driver: str | None) -> None:
    for gpu in prof.gpus:
        link = SYS / "bus" / "pci" / "devices" / gpu.sysfs_name / "driver"
        if link.is_symlink():
            link.unlink()
        if driver:
            link.symlink_to(SYS / "bus" / "pci" / "drivers" / driver)


def proc_modules() -> str:
    """/proc/modules as the kernel would write it for the loaded simulated modules."""
    lines = []
    for name in sorted(set(MODULE_ALIASES.values())):
        if loaded(name):
            taint = (_module_dir(name) / "taint").read_text().strip()
            lines.append(f"{name} 0 0 - Live 0x0000000000000000" + (f" ({taint})" if taint else ""))
    return "".join(line + "\n" for line in lines)


# NVIDIA's MIG tools read two kernel interfaces besides NVML: /proc/modules (is
# `nvidia` loaded?) and the GPUs' directories under /sys/bus/pci/devices. A simulated
# node has neither (the machine's kernel may have no module support at all, so no
# /proc/modules to show a module in), so they run in a user and mount namespace of
# their own in which /proc is a tmpfs of links to the real one plus a `modules` file,
# and /sys/bus/pci/devices is the simulated PCI tree. Everything else is the node's.
# Inside that user namespace other processes' file descriptors cannot be read, so the
# mock NVML cannot see who holds a GPU (the driver's test before it makes a MIG mode
# change current): it asks the process that started the view (held_gpus_service).
_KERNEL_VIEW = r"""
set -e
real_proc="$1" modules="$2" pci="$3" proc_driver="$4"; shift 4
mkdir -p "$real_proc"
mount --rbind /proc "$real_proc"
mount -t tmpfs -o mode=0555 gpusim-proc /proc
for entry in "$real_proc"/*; do ln -s "$entry" "/proc/${entry##*/}"; done
printf %s "$modules" > /proc/modules
if [ -n "$proc_driver" ]; then rm -f /proc/driver && ln -s "$proc_driver" /proc/driver; fi
mount -t tmpfs gpusim-sys-bus /sys/bus
mkdir /sys/bus/pci && ln -s "$pci" /sys/bus/pci/devices
exec "$@"
"""


def kernel_view_argv(command: Sequence[str], proc_driver: Path | None = None) -> list[str]:
    """`command` run in the node's view of the kernel (above). `proc_driver`: a
    directory to show as /proc/driver (a node's is already there; a test node's not)."""
    return [
        "unshare", "--user", "--map-root-user", "--mount", "--propagation", "private",
        "sh", "-c", _KERNEL_VIEW, "sh", str(RUN / "proc-view"), proc_modules(),
        str(SYS / "bus" / "pci" / "devices"), str(proc_driver or ""), *command,
    ]  # fmt: skip


def _mark_loaded(name: str, version: str | None = None, taint: str = "") -> None:
    directory = _module_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "initstate").write_text("live\n")
    (directory / "taint").write_text(taint + "\n")
    if version:
        (directory / "version").write_text(version + "\n")
    (SYS / "bus" / "pci" / "drivers" / name).mkdir(parents=True, exist_ok=True)


def _mark_unloaded(name: str) -> None:
    shutil.rmtree(_module_dir(name), ignore_errors=True)


# --- device files and who holds them -----------------------------------------------


def device_files(name: str, prof: profiles.Profile) -> list[Path]:
    """The /dev entries a loaded module provides (what nvidia-modprobe and udev create)."""
    if name == "nvidia":
        names = ["nvidiactl", *(f"nvidia{gpu.index}" for gpu in prof.gpus)]
        if any(gpu.mig_capable for gpu in prof.gpus):
            # MIG's config and monitor capabilities (nvidia-cap1, nvidia-cap2), and
            # those of instances, which NVML creates as it creates the instances.
            names += ["nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2"]
            names += sorted(
                {f"nvidia-caps/{p.name}" for p in (DEV / "nvidia-caps").glob("nvidia-cap*")}
                - set(names)
            )
    elif name == "nvidia_uvm":
        names = ["nvidia-uvm", "nvidia-uvm-tools"]
    elif name == "nvidia_modeset":
        names = ["nvidia-modeset"]
    else:
        names = []
    return [DEV / n for n in names]


def _create_device_files(paths: list[Path]) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*DEVICE_NUMBERS))
            path.chmod(0o666)  # mknod's mode is filtered by the umask


def _remove_device_files(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
        if path.parent != DEV:
            with contextlib.suppress(OSError):
                path.parent.rmdir()


def holders(paths: list[Path]) -> list[tuple[int, str]]:
    """Processes (pid, name) with one of `paths` open, as the kernel counts a module's users."""
    wanted = {str(p) for p in paths}
    found = []
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        pid = int(fd_dir.split("/")[2])
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to look at
        targets = set()
        for fd in fds:
            with contextlib.suppress(OSError):  # closed meanwhile
                targets.add(os.readlink(os.path.join(fd_dir, fd)))
        if targets & wanted:
            try:
                name = Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip()
            except OSError:
                name = "?"
            found.append((pid, name))
    return sorted(found)


# Driver daemons whose handles do not keep a GPU from being reset: NVIDIA's
# nvidia-mig-manager service runs after both and its hooks leave them running
# (deployments/systemd of mig-parted). Names as /proc/PID/comm has them.
RESET_TOLERATED = ("nvidia-persiste", "nv-fabricmanage")


def held_gpus(exclude_pid: int | None = None) -> list[int]:
    """Indexes of the GPUs that a process other than `exclude_pid` (and the driver
    daemons of RESET_TOLERATED) holds open, so that the driver cannot reset them."""
    held = []
    for path in DEV.glob("nvidia[0-9]*"):
        index = path.name[len("nvidia") :]
        users = [
            pid
            for pid, name in holders([path])
            if pid != exclude_pid and name not in RESET_TOLERATED
        ]
        if index.isdigit() and users:
            held.append(int(index))
    return sorted(held)


@contextlib.contextmanager
def held_gpus_service() -> Iterator[dict[str, str]]:
    """While open, answers a program in the kernel view which GPUs are held.

    Each connection to the socket (named in the environment yielded, for the mock
    NVML) gets the indexes of the GPUs that processes other than the connecting one
    hold at that moment, comma-separated: what the kernel driver knows when it
    decides whether it can reset a GPU.
    """
    path = RUN / f"held-gpus-{os.getpid()}.sock"
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    credentials = struct.Struct("3i")  # struct ucred: pid, uid, gid

    def serve() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # closed
            with client, contextlib.suppress(OSError):
                peer = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, credentials.size)
                pid = credentials.unpack(peer)[0]
                client.sendall(",".join(map(str, held_gpus(exclude_pid=pid))).encode())

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield {"GPUSIM_GPUS_HELD_SOCKET": str(path)}
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        path.unlink(missing_ok=True)


# --- what the mock NVML reads --------------------------------------------------------


def _nvml_dir() -> Path:
    return RUN / "nvml"


def nvml_snapshot() -> bytes:
    """What the mock NVML reads of the node, for the library inside a container.

    A container has none of the node's files under RUN, so the mock asks the
    simulated persistence daemon, which answers with this (format in
    tests/sim/nvml/remote.c): the module's files, NVML's files, persistence mode,
    and the MIG modes a reboot keeps (as "state/mig-mode").
    """
    files = [
        path
        for top in (RUN / "sys" / "module", _nvml_dir())
        for path in sorted(top.rglob("*"))
        if path.is_file() and not path.name.endswith((".lock", ".tmp"))
    ]
    out = bytearray()
    for path, name in [(path, str(path.relative_to(RUN))) for path in files] + [
        (RUN / "persistence-mode", "persistence-mode"),
        (STATE / "mig-mode", "state/mig-mode"),
    ]:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        out += f"{name} {len(data)}\n".encode() + data
    return bytes(out)


def _cuda_number(version: str) -> int:
    """NVML's CUDA version number: 12.2 -> 12020."""
    major, _, minor = version.partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


def write_nvml_gpus(
    prof: profiles.Profile, directory: Path | None = None, local: dict[int, str] | None = None
) -> None:
    """The GPUs as the kernel module would describe them to NVML (read by the mock);
    `local`: the CPUs of each NUMA node (a cpulist, "0-15"), the GPUs' CPU affinity."""
    directory = directory or _nvml_dir()
    lines = []
    for gpu in prof.gpus:
        fields: dict[str, object] = {
            "index": gpu.index,
            "name": gpu.product_name,
            "uuid": gpu.uuid,
            "serial": gpu.serial,
            "vbios": gpu.vbios_version,
            "architecture": gpu.architecture,
            "bus": gpu.bus,
            "device_id": f"{gpu.device_id:04x}",
            "subsystem_id": f"{gpu.subsystem_id:04x}",
            "pci_class": f"{gpu.pci_class:06x}",
            "memory_mib": gpu.memory_mib,
            "compute_cap": gpu.compute_cap,
            "mig_capable": int(gpu.mig_capable),
            "power_limit_w": gpu.power_limit_w,
            "numa_node": gpu.numa_node,
        }
        if local and gpu.numa_node in local:
            fields["local_cpus"] = local[gpu.numa_node]
        lines.append("\t".join(f"{key}={value}" for key, value in fields.items()))
    offers = [
        f"gpu={gpu.index} name={p.name} index={p.index} id={p.id} slices={p.slices} "
        f"size={p.size} starts={','.join(map(str, p.starts))} instances={p.instances} "
        f"memory_mib={p.memory_mib} sm={p.sm_count} ce={p.copy_engines} dec={p.decoders} "
        f"enc={p.encoders} jpeg={p.jpeg} ofa={p.ofa}"
        for gpu in prof.gpus
        for p in gpu.mig_profiles
    ]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "gpus").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    (directory / "mig-profiles").write_text("".join(o + "\n" for o in offers), encoding="utf-8")


# NVML_COMPUTE_INSTANCE_PROFILE_* of a compute instance as large as its GPU instance.
_WHOLE_COMPUTE_INSTANCE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


def _first_boot_instances(gpu: profiles.Gpu) -> list[str]:
    """A board's MIG layout from the profile as nvml/mig-instances lines: GPU instances
    in the order given, each at its first free placement, with one whole-size compute
    instance."""
    offered = {p.name: p for p in gpu.mig_profiles}
    taken: set[int] = set()
    lines = []
    for gi_id, name in enumerate(gpu.mig, start=1):
        p = offered[name]
        # a profile's layout that does not fit is a broken fixture: next() fails loudly
        start = next(s for s in p.starts if not taken & set(range(s, s + p.size)))
        taken |= set(range(start, start + p.size))
        lines.append(f"gi {gpu.index} {gi_id} {p.index} {start}")
        lines.append(f"ci {gpu.index} {gi_id} 0 {_WHOLE_COMPUTE_INSTANCE[p.slices]} 0")
    return lines


def reset_mig(prof: profiles.Profile) -> None:
    """MIG at power-on: each board keeps its MIG mode (by UUID), a pending one now
    applied, and has no instances. A board seen for the first time comes as the
    profile describes it: its MIG mode and the layout set up on it beforehand."""
    modes = STATE / "mig-mode"
    kept: dict[str, str] = {}
    if modes.exists():
        for line in modes.read_text(encoding="utf-8").splitlines():
            uuid, _current, pending = line.split()
            kept[uuid] = pending
    lines, instances = [], []
    for gpu in prof.gpus:
        if not gpu.mig_capable:
            continue
        if gpu.uuid in kept:
            mode = kept[gpu.uuid]
        else:
            mode = str(int(bool(gpu.mig)))
            instances += _first_boot_instances(gpu)
        lines.append(f"{gpu.uuid} {mode} {mode}")
    (_nvml_dir() / "mig-instances").write_text("".join(x + "\n" for x in instances))
    STATE.mkdir(parents=True, exist_ok=True)
    modes.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def mig_minors(prof: profiles.Profile) -> str:
    """/proc/driver/nvidia-caps/mig-minors: the device minor of each MIG capability
    (config, monitor, then per GPU each GPU instance's and compute instance's access),
    in the layout NVIDIA's MIG user guide describes."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for gpu in prof.gpus:
        for gi in range(15):
            lines.append(f"gpu{gpu.index}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{gpu.index}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "".join(line + "\n" for line in lines)


def _instance_cap_files(prof: profiles.Profile) -> list[Path]:
    """The capability device files of the MIG instances that exist (a profile's layout
    at first boot), which NVML would have had nvidia-modprobe create."""
    instances = _nvml_dir() / "mig-instances"
    if not instances.exists():
        return []
    minors = dict(line.split() for line in mig_minors(prof).splitlines())
    caps = []
    for fields in (line.split() for line in instances.read_text(encoding="utf-8").splitlines()):
        if fields[0] == "gi":
            caps.append(f"gpu{fields[1]}/gi{fields[2]}/access")
        elif fields[0] == "ci":
            caps.append(f"gpu{fields[1]}/gi{fields[2]}/ci{fields[3]}/access")
    return [DEV / "nvidia-caps" / f"nvidia-cap{minors[cap]}" for cap in caps]


def _write_proc_driver(prof: profiles.Profile | None) -> None:
    """The nvidia module's /proc/driver entries (None: the module is gone)."""
    caps = PROC_DRIVER / "nvidia-caps"
    try:
        if prof is None:
            shutil.rmtree(caps, ignore_errors=True)
            return
        caps.mkdir(parents=True, exist_ok=True)
        (caps / "mig-minors").write_text(mig_minors(prof), encoding="utf-8")
    except OSError:
        pass  # a real /proc: the node was started without its /proc/driver tmpfs


def load_module(requested: str) -> None:
    name = MODULE_ALIASES.get(requested, requested)
    prof = profile()
    if loaded(name):
        return
    if name == "nouveau":
        if prof.gpus:
            _mark_loaded("nouveau", taint="")
            _bind(prof, "nouveau")
        return
    kernel = os.uname().release
    driver = installed_driver(prof)
    if driver is None:
        raise ModuleError(
            f"modprobe: FATAL: Module {requested} not found in directory /lib/modules/{kernel}"
        )
    if name != "nvidia":
        load_module("nvidia")
        _mark_loaded(name, driver.version, "POE" if driver.module_type == "proprietary" else "OE")
        _create_device_files(device_files(name, prof))
        return
    if prof.secure_boot and driver.source != "preinstalled":
        raise ModuleError(
            f"modprobe: ERROR: could not insert '{requested}': Key was rejected by service"
        )
    if not prof.gpus or loaded("nouveau"):
        # The module loads only if it can bind a GPU; nouveau holding them means
        # the probe finds none.
        raise ModuleError(f"modprobe: ERROR: could not insert '{requested}': No such device")
    taint = "POE" if driver.module_type == "proprietary" else "OE"
    _mark_loaded("nvidia", driver.version, taint)
    (RUN / "nvidia-module.json").write_text(
        json.dumps(
            {"version": driver.version, "module_type": driver.module_type, "source": driver.source}
        ),
        encoding="utf-8",
    )
    _bind(prof, "nvidia")
    from . import faults

    kind = "Open Kernel Module" if driver.module_type == "open" else "Kernel Module"
    faults.log_kernel(f"NVRM: loading NVIDIA UNIX x86_64 {kind}  {driver.version}  Release Build")
    failed = _gpus_without_firmware(prof, driver)
    for gpu in failed:
        said = f"NVRM: GPU {gpu.sysfs_name}: "
        faults.log_kernel(said + "RmFetchGspRmImages: No firmware image found")
        faults.log_kernel(said + "RmInitAdapter failed! (0x61:0x56:1697)", 3)
    _nvml_dir().mkdir(parents=True, exist_ok=True)
    (_nvml_dir() / "driver").write_text(
        f"cuda={_cuda_number(prof.cuda_version(driver.version))}\n", encoding="utf-8"
    )
    # A real GPU that failed to start keeps its device file, and opening it fails; a
    # simulated one cannot fail to open (see DEVICE_NUMBERS), so it has none.
    absent = {DEV / f"nvidia{gpu.index}" for gpu in failed}
    _create_device_files([path for path in device_files("nvidia", prof) if path not in absent])
    _write_proc_driver(prof)
    _create_device_files(_instance_cap_files(prof))


def _gpus_without_firmware(prof: profiles.Profile, driver: InstalledDriver) -> list[profiles.Gpu]:
    """The GPUs the module cannot start for want of its version's GSP firmware: every
    GPU under the open module, Hopper and later under the proprietary one (which
    runs the others without GSP). A pre-installed driver brought its own."""
    if driver.source == "preinstalled" or any((FIRMWARE / driver.version).glob("gsp_*.bin")):
        return []
    return [
        gpu
        for gpu in prof.gpus
        if driver.module_type == "open" or gpu.architecture in ("Hopper", "Blackwell")
    ]


def create_instance_device_files() -> None:
    """The capability device files of the MIG instances that exist now, where missing."""
    if loaded("nvidia"):
        _create_device_files(_instance_cap_files(profile()))


def unload_module(requested: str) -> None:
    """Unload like the kernel: refused while another module or an open file uses it."""
    name = MODULE_ALIASES.get(requested, requested)
    if not loaded(name):
        return
    in_use = ModuleError(f"modprobe: FATAL: Module {name} is in use.")
    if name == "nouveau":
        raise in_use
    prof = profile()
    files = device_files(name, prof)
    if holders(files):
        raise in_use
    if name == "nvidia":
        if any(loaded(m) for m in NVIDIA_MODULES[1:]) or (RUN / "persistence-mode").exists():
            raise in_use
        (RUN / "nvidia-module.json").unlink(missing_ok=True)
        (_nvml_dir() / "driver").unlink(missing_ok=True)
        _write_proc_driver(None)
        _bind(prof, None)
    _remove_device_files(files)
    _mark_unloaded(name)


def set_loaded_version(version: str) -> None:
    """Drift helper: pretend a different driver version is loaded."""
    meta_path = RUN / "nvidia-module.json"
    if not loaded("nvidia"):
        raise ModuleError("gpusim: the nvidia module is not loaded")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta["version"] = version
    meta_path.write_text(json.dumps(meta), encoding="utf-8")
    (_module_dir("nvidia") / "version").write_text(version + "\n")


# --- boot ---------------------------------------------------------------------------

_OTHER_PCI_DEVICES = (
    # (address, vendor, device, class): a host bridge, a BMC VGA controller that
    # must not be mistaken for a GPU, and a network card.
    ("0000:00:00.0", 0x8086, 0x09A2, 0x060000),
    ("0000:02:00.0", 0x1A03, 0x2000, 0x030000),
    ("0000:4b:00.0", 0x15B3, 0x101B, 0x020700),
)


# The kernel's `resource` file of a device that is not a bridge: one line per region
# (six BARs, the expansion ROM, six SR-IOV virtual function BARs), "start end flags" in
# hex, unused regions all zero. Flags as the kernel sets them (IORESOURCE_MEM, _PREFETCH, _MEM_64,
# _SIZEALIGN).
_MMIO = 0x40200
_PREFETCH_64 = 0x14220C


def _resource_file(bus: int, pci_class: int) -> str:
    """An NVIDIA GPU's BARs: 0 registers (16 MiB), 1 framebuffer aperture (64 GiB) and
    3 (32 MiB); any other device one 32 MiB register BAR. Placed by bus number."""
    if pci_class >> 16 == 0x03:
        bars = {
            0: (0xA0000000 + (bus << 24), 16 << 20, _MMIO),
            1: (0x200000000000 + (bus << 36), 64 << 30, _PREFETCH_64),
            3: (0x300000000000 + (bus << 25), 32 << 20, _PREFETCH_64),
        }
    else:
        bars = {0: (0x90000000 + (bus << 25), 32 << 20, _PREFETCH_64)}
    lines = []
    for index in range(13):
        start, size, flags = bars.get(index, (0, 0, 0))
        end = start + size - 1 if size else 0
        lines.append(f"0x{start:016x} 0x{end:016x} 0x{flags:016x}")
    return "\n".join(lines)


# The machine's own CPU topology, which the simulated sysfs copies (programs such as
# slurmd read the real one, so CPU and core numbers must agree with it).
HOST_CPUS = Path(os.environ.get("GPUSIM_HOST_CPUS", "/sys/devices/system/cpu"))


def _cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def _host_cores() -> list[list[int]]:
    """The machine's online cores, each as its CPUs (hyperthreads), in the order
    Slurm and hwloc number cores: package by package, each in order of first CPU."""
    try:
        online = _cpulist((HOST_CPUS / "online").read_text(encoding="ascii"))
    except OSError:
        return [[0]]
    cores: dict[tuple[int, ...], str] = {}
    for cpu in online:
        topology = HOST_CPUS / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text(encoding="ascii").strip()
            siblings = (topology / "core_cpus_list").read_text(encoding="ascii")
        except OSError:
            package, siblings = "0", str(cpu)
        cores[tuple(_cpulist(siblings))] = package
    first = {
        package: min(c[0] for c, p in cores.items() if p == package) for package in cores.values()
    }
    ordered = sorted(cores, key=lambda core: (first[cores[core]], core[0]))
    return [list(core) for core in ordered] or [[0]]


def numa_cpus(nodes: Sequence[int], cores: Sequence[Sequence[int]]) -> dict[int, str]:
    """{NUMA node: its cpulist}: the machine's cores (with their hyperthreads) dealt
    out to the profile's NUMA nodes in runs, as a board's firmware groups them (one
    core may serve several nodes when there are more nodes than cores)."""
    ordered = sorted(set(nodes))
    if len(cores) < len(ordered):
        runs = {node: [cores[rank % len(cores)]] for rank, node in enumerate(ordered)}
    else:
        share = len(cores) // len(ordered)
        runs = {
            node: cores[rank * share : (rank + 1) * share if rank < len(ordered) - 1 else None]
            for rank, node in enumerate(ordered)
        }
    return {
        node: ",".join(str(cpu) for cpu in sorted(cpu for core in run for cpu in core))
        for node, run in runs.items()
    }


def _write_cpu_topology(cpus: Sequence[int]) -> None:
    """Each CPU's topology files, copied from the machine's."""
    for cpu in cpus:
        real = HOST_CPUS / f"cpu{cpu}" / "topology"
        mine = SYS / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        mine.mkdir(parents=True, exist_ok=True)
        for name in ("physical_package_id", "core_id", "core_cpus_list", "thread_siblings_list"):
            with contextlib.suppress(OSError):
                (mine / name).write_text((real / name).read_text(encoding="ascii"))
        if not (mine / "physical_package_id").exists():
            (mine / "physical_package_id").write_text("0\n")
            (mine / "core_cpus_list").write_text(f"{cpu}\n")


def _write_pci_device(
    address: str,
    vendor: int,
    device: int,
    subsystem: int,
    pci_class: int,
    numa_node: int,
    local_cpus: str,
) -> None:
    bus = address.split(":")[1]
    real = SYS / "devices" / f"pci0000:{bus}" / address
    real.mkdir(parents=True, exist_ok=True)
    files = {
        "vendor": f"0x{vendor:04x}",
        "device": f"0x{device:04x}",
        "subsystem_vendor": f"0x{vendor:04x}",
        "subsystem_device": f"0x{subsystem:04x}",
        "class": f"0x{pci_class:06x}",
        "numa_node": str(numa_node),
        "local_cpulist": local_cpus,
        "enable": "1",
        "resource": _resource_file(int(bus, 16), pci_class),
    }
    for filename, value in files.items():
        (real / filename).write_text(value + "\n")
    if pci_class >> 16 == 0x03:
        # A function-level reset, as a GPU on bare metal offers (write-only); upstream's
        # MIG service reboots the host instead where it is missing (passthrough VMs).
        reset = real / "reset"
        reset.touch()
        reset.chmod(0o200)
    link = SYS / "bus" / "pci" / "devices" / address
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(real)


def _write_profile_from_environment() -> str:
    """The container's creator chose the profile (GPUSIM_PROFILE in PID 1's environment)."""
    chosen = None
    try:
        environ = Path("/proc/1/environ").read_bytes().split(b"\0")
        for item in environ:
            if item.startswith(b"GPUSIM_PROFILE="):
                chosen = item.split(b"=", 1)[1].decode()
    except OSError:
        pass
    chosen = chosen or os.environ.get("GPUSIM_PROFILE") or "none"
    RUN.mkdir(parents=True, exist_ok=True)
    (RUN / "profile").write_text(chosen + "\n", encoding="utf-8")
    return chosen


def boot() -> profiles.Profile:
    """Lay out the simulated hardware at boot and autoload modules as udev would."""
    require_simulated_node()
    _write_profile_from_environment()
    prof = profile()
    shutil.rmtree(SYS, ignore_errors=True)
    cores = _host_cores()
    _write_cpu_topology([cpu for core in cores for cpu in core])
    local = numa_cpus([0, *(d.numa_node for d in (*prof.gpus, *prof.nvswitches))], cores)
    for address, vendor, device, pci_class in _OTHER_PCI_DEVICES:
        _write_pci_device(address, vendor, device, device, pci_class, 0, local[0])
    for chip in (*prof.gpus, *prof.nvswitches):
        _write_pci_device(
            chip.sysfs_name,
            profiles.NVIDIA_VENDOR,
            chip.device_id,
            chip.subsystem_id,
            chip.pci_class,
            chip.numa_node,
            local[chip.numa_node],
        )
    efivars = SYS / "firmware" / "efi" / "efivars"
    efivars.mkdir(parents=True, exist_ok=True)
    # 4 bytes of attributes, then the value byte.
    (efivars / f"SecureBoot-{EFI_GLOBAL_GUID}").write_bytes(
        b"\x06\x00\x00\x00" + (b"\x01" if prof.secure_boot else b"\x00")
    )
    (RUN / "persistence-mode").unlink(missing_ok=True)
    (RUN / "nvidia-module.json").unlink(missing_ok=True)
    write_nvml_gpus(prof, local=local)
    reset_mig(prof)
    from . import faults  # faults reads this module's paths

    faults.at_boot(prof)

    if prof.gpus:
        driver = installed_driver(prof)
        if driver is not None and (nouveau_blacklisted() or driver.source == "preinstalled"):
            # A rejected module (e.g. by Secure Boot) leaves the node without a driver.
            with contextlib.suppress(ModuleError):
                load_module("nvidia")
        if not loaded("nvidia") and not nouveau_blacklisted():
            load_module("nouveau")
    link_driver_binaries()
    return prof


# --- which driver files are simulated ------------------------------------------------

# Files of NVIDIA's packages that the image's dpkg diversions move aside (to
# <path>.gpusim-real), and what takes their place while the package is installed:
# the mock NVML in place of the library (every NVML program, Debian's nvidia-smi
# first, then runs on the simulated GPUs), the simulated persistence daemon in
# place of the real one (which would talk to the kernel module directly).
LIBNVML_LINK = "/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1"
DIVERTED = {
    LIBNVML_LINK: "lib/libnvidia-ml.so.1",
    "/usr/bin/nvidia-persistenced": "bin/nvidia-persistenced",
    "/usr/bin/nvidia-mig-parted": "bin/nvidia-mig-parted",
}
REAL_SUFFIX = ".gpusim-real"
# Where NVIDIA's .run installer puts the files of a pre-installed driver, and what
# stands there on a node whose profile has one: Debian's nvidia-smi (copied into
# the image when it is built), the mock NVML and the simulated persistence daemon.
PREINSTALLED_FILES = {
    "/usr/bin/nvidia-smi": "preinstalled/nvidia-smi",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": "lib/libnvidia-ml.so.1",
    "/usr/bin/nvidia-persistenced": "bin/nvidia-persistenced",
}


def _ensure_link(path: Path, target: Path) -> None:
    if path.is_symlink() and Path(os.readlink(path)) == target:
        return
    if path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def _is_our_link(path: Path) -> bool:
    return path.is_symlink() and os.readlink(path).startswith(str(HOME))


def _library_version(prof: profiles.Profile) -> str | None:
    """The driver version of the installed NVML library (what the real one is built as)."""
    real = Path(LIBNVML_LINK + REAL_SUFFIX)
    if real.is_symlink():
        # libnvidia-ml.so.1 -> libnvidia-ml.so.<driver version>
        return os.readlink(real).rsplit("libnvidia-ml.so.", 1)[-1]
    return prof.preinstalled_driver


def _mock_the_versioned_library() -> None:
    """Make the driver's versioned NVML file hold the mock as well.

    libnvidia-ml.so.1 (diverted above) points at libnvidia-ml.so.<version>, and that
    versioned file is what `nvidia-ctk cdi generate` mounts into containers. The
    package's real file is kept beside it as <file>.gpusim-real, and dropped once the
    package has removed the file it belongs to.
    """
    link = Path(LIBNVML_LINK + REAL_SUFFIX)
    mock = HOME / DIVERTED[LIBNVML_LINK]
    if link.is_symlink():
        versioned = link.parent / os.readlink(link)
        if (
            versioned.is_file()
            and not versioned.is_symlink()
            and not filecmp.cmp(versioned, mock, shallow=False)
        ):
            os.replace(versioned, versioned.with_name(versioned.name + REAL_SUFFIX))
            staged = versioned.with_name(versioned.name + ".gpusim-new")
            shutil.copyfile(mock, staged)
            staged.chmod(0o644)
            os.replace(staged, versioned)
    for kept in link.parent.glob("libnvidia-ml.so.*" + REAL_SUFFIX):
        if kept != link and not os.path.lexists(str(kept)[: -len(REAL_SUFFIX)]):
            kept.unlink()


def link_driver_binaries() -> None:
    """Put a simulated file wherever the real one is installed, and only there.

    Called at boot and after every dpkg run (a dpkg post-invoke hook in the image),
    so installing or removing a driver package makes the library and the daemon
    appear or vanish as they would on a real host. Records the installed library's
    version for the mock NVML, which refuses to talk to a module of another version.
    """
    prof = profile()
    wanted = {path: kit for path, kit in DIVERTED.items() if os.path.lexists(path + REAL_SUFFIX)}
    if prof.preinstalled_driver is not None:
        for path, kit in PREINSTALLED_FILES.items():
            if not os.path.lexists(path) or _is_our_link(Path(path)):
                wanted.setdefault(path, kit)
    for path in {*DIVERTED, *PREINSTALLED_FILES}:
        if path in wanted:
            _ensure_link(Path(path), HOME / wanted[path])
        elif _is_our_link(Path(path)):
            Path(path).unlink()
    _mock_the_versioned_library()
    version_file = _nvml_dir() / "library-version"
    version = _library_version(prof)
    if version:
        _nvml_dir().mkdir(parents=True, exist_ok=True)
        version_file.write_text(version + "\n", encoding="utf-8")
    else:
        version_file.unlink(missing_ok=True)


def real_binary(path: str) -> str | None:
    candidate = path + REAL_SUFFIX
    return candidate if os.path.exists(candidate) else None


def persistence_enabled() -> bool:
    return (RUN / "persistence-mode").exists()

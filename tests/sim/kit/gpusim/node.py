"""The simulated node: its profile, its simulated sysfs, and its driver state.

State that a reboot clears lives under /run/gpusim (tmpfs, like /sys): the chosen
profile, the simulated sysfs tree, and which simulated kernel modules are loaded.
What survives a reboot is real: the dpkg database and the files on disk.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import profiles

HOME = Path(os.environ.get("GPUSIM_HOME", "/opt/gpusim"))
RUN = Path(os.environ.get("GPUSIM_RUN", "/run/gpusim"))
MARKER = Path(os.environ.get("GPUSIM_MARKER", "/etc/gpusim-node"))
PROFILE_DIR = HOME / "profiles"
SYS = RUN / "sys"

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
# Services that hold /dev/nvidia* open, so the nvidia module cannot be unloaded
# while they run (as on a real host).
GPU_CONSUMERS = ("nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "dcgm-exporter")


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


def _service_active(unit: str) -> bool:
    result = subprocess.run(["systemctl", "is-active", "--quiet", unit], check=False)
    return result.returncode == 0


def unload_module(requested: str) -> None:
    name = MODULE_ALIASES.get(requested, requested)
    if not loaded(name):
        return
    if name == "nouveau":
        raise ModuleError("modprobe: FATAL: Module nouveau is in use.")
    if name == "nvidia":
        holders = [m for m in NVIDIA_MODULES[1:] if loaded(m)]
        for holder in holders:
            _mark_unloaded(holder)
        busy = [unit for unit in GPU_CONSUMERS if _service_active(unit)]
        if busy or (RUN / "persistence-mode").exists():
            raise ModuleError("modprobe: FATAL: Module nvidia is in use.")
        _mark_unloaded("nvidia")
        (RUN / "nvidia-module.json").unlink(missing_ok=True)
        _bind(profile(), None)
        return
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


def _write_pci_device(
    address: str, vendor: int, device: int, subsystem: int, pci_class: int, numa_node: int
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
        "enable": "1",
    }
    for filename, value in files.items():
        (real / filename).write_text(value + "\n")
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
    for address, vendor, device, pci_class in _OTHER_PCI_DEVICES:
        _write_pci_device(address, vendor, device, device, pci_class, 0)
    for gpu in prof.gpus:
        _write_pci_device(
            gpu.sysfs_name,
            profiles.NVIDIA_VENDOR,
            gpu.device_id,
            gpu.subsystem_id,
            gpu.pci_class,
            gpu.numa_node,
        )
    for switch in prof.nvswitches:
        _write_pci_device(
            switch.sysfs_name,
            profiles.NVIDIA_VENDOR,
            switch.device_id,
            switch.subsystem_id,
            switch.pci_class,
            switch.numa_node,
        )
    efivars = SYS / "firmware" / "efi" / "efivars"
    efivars.mkdir(parents=True, exist_ok=True)
    # 4 bytes of attributes, then the value byte.
    (efivars / f"SecureBoot-{EFI_GLOBAL_GUID}").write_bytes(
        b"\x06\x00\x00\x00" + (b"\x01" if prof.secure_boot else b"\x00")
    )
    (RUN / "persistence-mode").unlink(missing_ok=True)
    (RUN / "nvidia-module.json").unlink(missing_ok=True)

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


# --- which driver binaries exist --------------------------------------------------

# Real binaries that packages install, and where the image's dpkg diversions move
# them, so that the simulated versions can answer once the driver is loaded.
DIVERTED = {
    "/usr/lib/nvidia/current/nvidia-smi": "nvidia-smi",
    "/usr/bin/nvidia-persistenced": "nvidia-persistenced",
}
REAL_SUFFIX = ".gpusim-real"
# Where NVIDIA's .run installer puts the binaries of a pre-installed driver.
PREINSTALLED_BINARIES = {
    "/usr/bin/nvidia-smi": "nvidia-smi",
    "/usr/bin/nvidia-persistenced": "nvidia-persistenced",
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


def link_driver_binaries() -> None:
    """Put a simulated binary wherever the real one is installed, and only there.

    Called at boot and after every dpkg run (a dpkg post-invoke hook in the image),
    so installing or removing a driver package makes nvidia-smi appear or vanish as
    it would on a real host.
    """
    wanted = {path: shim for path, shim in DIVERTED.items() if Path(path + REAL_SUFFIX).exists()}
    if profile().preinstalled_driver is not None:
        for path, shim in PREINSTALLED_BINARIES.items():
            if not os.path.lexists(path) or _is_our_link(Path(path)):
                wanted.setdefault(path, shim)
    for path in {*DIVERTED, *PREINSTALLED_BINARIES}:
        if path in wanted:
            _ensure_link(Path(path), HOME / "bin" / wanted[path])
        elif _is_our_link(Path(path)):
            Path(path).unlink()


def real_binary(path: str) -> str | None:
    candidate = path + REAL_SUFFIX
    return candidate if os.path.exists(candidate) else None


def persistence_enabled() -> bool:
    return (RUN / "persistence-mode").exists()

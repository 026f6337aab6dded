"""GPU profiles: which devices a simulated node carries, read from YAML data files."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

NVIDIA_VENDOR = 0x10DE
_UUID_NAMESPACE = uuid.UUID("6f1d3c52-5a0e-4c1e-9a55-2b4f7e0c9d11")


class ProfileError(ValueError):
    """A profile file is missing or malformed."""


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile a MIG-capable model offers (models.yaml, mig_profiles)."""

    name: str  # "1g.5gb"
    index: int  # NVML_GPU_INSTANCE_PROFILE_*
    id: int  # the id nvidia-smi prints
    slices: int  # compute slices
    size: int  # memory slices of a placement
    starts: tuple[int, ...]  # where placements start
    instances: int
    memory_mib: int
    sm_count: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg: int
    ofa: int


@dataclass(frozen=True)
class Gpu:
    index: int
    model_key: str
    product_name: str
    device_id: int
    subsystem_id: int
    pci_class: int
    memory_mib: int
    architecture: str
    compute_cap: str
    mig_capable: bool
    power_limit_w: int
    vbios_version: str
    bus: str  # two hex digits, e.g. "18"
    numa_node: int
    uuid: str
    serial: str
    mig_profiles: tuple[MigProfile, ...] = ()
    # GPU instances (by profile name) set up on the board before the node's first boot;
    # each holds one compute instance of its whole size.
    mig: tuple[str, ...] = ()

    @property
    def sysfs_name(self) -> str:
        """PCI address as sysfs names it: 0000:18:00.0."""
        return f"0000:{self.bus}:00.0"

    @property
    def bus_id(self) -> str:
        """PCI address as nvidia-smi prints it: 00000000:18:00.0."""
        return f"00000000:{self.bus.upper()}:00.0"


@dataclass(frozen=True)
class NvSwitch:
    index: int
    device_id: int
    subsystem_id: int
    pci_class: int
    bus: str
    numa_node: int

    @property
    def sysfs_name(self) -> str:
        return f"0000:{self.bus}:00.0"


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    gpus: tuple[Gpu, ...] = ()
    nvswitches: tuple[NvSwitch, ...] = ()
    preinstalled_driver: str | None = None
    preinstalled_module_type: str = "proprietary"
    secure_boot: bool = False
    cuda_by_branch: dict[str, str] = field(default_factory=dict)

    def cuda_version(self, driver_version: str) -> str:
        branch = driver_version.split(".", 1)[0]
        return self.cuda_by_branch.get(branch, "12.2")


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ProfileError(f"no such profile file: {path}") from exc
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level")
    return data


def available(profile_dir: Path) -> list[str]:
    return sorted(p.stem for p in profile_dir.glob("*.yaml") if p.stem != "models")


def _stable_uuid(seed: str) -> str:
    return str(uuid.uuid5(_UUID_NAMESPACE, seed))


def _serial(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).hexdigest()
    return "1" + str(int(digest[:12], 16))[:12].rjust(12, "0")


def load(profile_dir: Path, name: str, node_name: str) -> Profile:
    """Load profile `name`; identities (UUIDs, serials) derive from `node_name`."""
    if name not in available(profile_dir):
        raise ProfileError(
            f"unknown GPU profile {name!r}; known profiles: {', '.join(available(profile_dir))}"
        )
    models = _load_yaml(profile_dir / "models.yaml")
    data = _load_yaml(profile_dir / f"{name}.yaml")

    gpus: list[Gpu] = []
    gpu_spec = data.get("gpus")
    if gpu_spec:
        key = gpu_spec["model"]
        try:
            model = models["gpus"][key]
        except KeyError as exc:
            raise ProfileError(f"{name}: unknown GPU model {key!r}") from exc
        buses = [str(b).lower() for b in gpu_spec["bus_ids"]]
        numa = gpu_spec.get("numa_nodes", [0] * len(buses))
        mig_spec = {str(k): v for k, v in (gpu_spec.get("mig") or {}).items()}
        offered = tuple(
            MigProfile(name=profile_name, **{**spec, "starts": tuple(spec["starts"])})
            for profile_name, spec in (models.get("mig_profiles", {}).get(key) or {}).items()
        )
        for index, bus in enumerate(buses):
            seed = f"{node_name}/{bus}"
            mig = tuple(mig_spec.get(str(index), []))
            unknown = sorted(set(mig) - {p.name for p in offered})
            if unknown:
                raise ProfileError(f"{name}: GPU {index} ({key}) offers no MIG profile {unknown}")
            gpus.append(
                Gpu(
                    index=index,
                    model_key=key,
                    product_name=model["product_name"],
                    device_id=model["device_id"],
                    subsystem_id=model["subsystem_id"],
                    pci_class=model["pci_class"],
                    memory_mib=model["memory_mib"],
                    architecture=model["architecture"],
                    compute_cap=str(model["compute_cap"]),
                    mig_capable=bool(model["mig_capable"]),
                    power_limit_w=model["power_limit_w"],
                    vbios_version=model["vbios_version"],
                    bus=bus,
                    numa_node=int(numa[index]),
                    uuid="GPU-" + _stable_uuid(seed),
                    serial=_serial(seed),
                    mig_profiles=offered,
                    mig=mig,
                )
            )

    switches: list[NvSwitch] = []
    sw_spec = data.get("nvswitches")
    if sw_spec:
        model = models["nvswitches"][sw_spec["model"]]
        buses = [str(b).lower() for b in sw_spec["bus_ids"]]
        numa = sw_spec.get("numa_nodes", [0] * len(buses))
        for index, bus in enumerate(buses):
            switches.append(
                NvSwitch(
                    index=index,
                    device_id=model["device_id"],
                    subsystem_id=model["subsystem_id"],
                    pci_class=model["pci_class"],
                    bus=bus,
                    numa_node=int(numa[index]),
                )
            )

    driver = data.get("driver") or {}
    return Profile(
        name=name,
        description=str(data.get("description", name)),
        gpus=tuple(gpus),
        nvswitches=tuple(switches),
        preinstalled_driver=driver.get("preinstalled"),
        preinstalled_module_type=driver.get("module_type", "proprietary"),
        secure_boot=bool(data.get("secure_boot", False)),
        cuda_by_branch={str(k): str(v) for k, v in models.get("cuda_by_branch", {}).items()},
    )

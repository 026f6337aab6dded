# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""MIG layouts in NVIDIA mig-parted's own config format, read and checked in Python.

A site's file is what `nvidia-mig-parted apply -f FILE -c NAME` reads:

    version: v1
    mig-configs:
      all-balanced:                      # a layout: a list of entries, applied in order
        - device-filter: ["0x20B010DE"]  # optional: PCI device ids (device, vendor), any
          devices: all                   # "all" or a list of GPU indexes
          mig-enabled: true
          mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}

The rules are mig-parted's (v0.10.0, api/spec/v1 and pkg/types): `version` and, in each
entry, `devices` and `mig-enabled` are required; no other keys; `mig-devices` is required
when MIG is enabled and must be empty when it is not; a profile name is `<g>g.<m>gb` or
`<c>c.<g>g.<m>gb`, optionally `+attr[,attr]`; counts are not negative and not all zero.
Checking here lets a wrong file or layout name fail on the controller, before any host
is touched. Where this is stricter than mig-parted it says so (tests/unit/test_mig_config.py
compares both on a corpus).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ansible_collections.gpufleet.nvidia.plugins.module_utils import mig_profiles

VERSION = "v1"
_ENTRY_KEYS = {"device-filter", "devices", "mig-enabled", "mig-devices"}
# PCI device id and vendor id as mig-parted prints them: 0x20B010DE.
_DEVICE_ID = re.compile(r"^0x[0-9A-Fa-f]{8}$")
_ATTRIBUTE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


class MigConfigError(ValueError):
    """A config or a layout mig-parted would refuse (or that we refuse, stricter)."""


@dataclass(frozen=True)
class MigProfile:
    compute: int
    slices: int
    memory_gb: int
    attributes: tuple[str, ...]


@dataclass(frozen=True)
class Entry:
    devices: tuple[int, ...] | None  # None: all
    device_filter: tuple[int, ...]  # (device << 16 | vendor), empty: any
    mig_enabled: bool
    mig_devices: Mapping[str, int]


def _field(text: str, suffix: str, profile: str) -> int:
    if not re.fullmatch(r"[0-9]+" + suffix, text):
        raise MigConfigError(f"{profile!r} is not a MIG profile name: expected '%d{suffix}'")
    return int(text[: -len(suffix)])


def parse_profile(profile: str) -> MigProfile:
    """`1g.5gb`, `1c.2g.10gb`, `1g.10gb+me` (the format mig-parted accepts)."""
    if not isinstance(profile, str) or not profile:
        raise MigConfigError(f"{profile!r} is not a MIG profile name")
    fields, _, attributes = profile.partition("+")
    parts = fields.split(".")
    if len(parts) == 3:
        compute = _field(parts[0], "c", profile)
        slices = _field(parts[1], "g", profile)
    elif len(parts) == 2:
        slices = compute = _field(parts[0], "g", profile)
    else:
        raise MigConfigError(f"{profile!r} is not a MIG profile name: expected <g>g.<m>gb")
    memory_gb = _field(parts[-1], "gb", profile)
    attrs: tuple[str, ...] = ()
    if "+" in profile:
        attrs = tuple(attributes.split(","))
        if len(set(attrs)) != len(attrs) or not all(_ATTRIBUTE.match(a) for a in attrs):
            raise MigConfigError(f"{profile!r}: attributes must be distinct alphanumeric names")
    return MigProfile(compute, slices, memory_gb, attrs)


def _entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, Mapping):
        raise MigConfigError(f"{where}: expected a mapping with devices and mig-enabled")
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        raise MigConfigError(f"{where}: unexpected key {unknown[0]!r}")
    for key in ("devices", "mig-enabled"):
        if key not in raw:
            raise MigConfigError(f"{where}: missing {key}")

    devices = raw["devices"]
    if devices == "all":
        indexes = None
    elif isinstance(devices, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices
    ):
        indexes = tuple(devices)
    else:
        raise MigConfigError(f"{where}.devices: expected 'all' or a list of GPU indexes (>= 0)")

    device_filter = raw.get("device-filter", [])
    filters = [device_filter] if isinstance(device_filter, str) else device_filter
    if not isinstance(filters, list) or not all(
        isinstance(f, str) and _DEVICE_ID.match(f) for f in filters
    ):
        raise MigConfigError(
            f"{where}.device-filter: expected a PCI device id like 0x20B010DE, or a list of them"
        )

    enabled = raw["mig-enabled"]
    if not isinstance(enabled, bool):
        raise MigConfigError(f"{where}.mig-enabled: expected true or false")
    if enabled and raw.get("mig-devices") is None:
        raise MigConfigError(f"{where}: mig-devices is required when mig-enabled is true")
    counts = raw.get("mig-devices") or {}
    if not isinstance(counts, Mapping):
        raise MigConfigError(f"{where}.mig-devices: expected profile name -> count")
    if not enabled and counts:
        raise MigConfigError(f"{where}: mig-devices must be empty when mig-enabled is false")
    for profile, count in counts.items():
        parse_profile(profile)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise MigConfigError(f"{where}.mig-devices.{profile}: expected a count >= 0")
    if counts and not any(counts.values()):
        raise MigConfigError(f"{where}.mig-devices: every count is 0")
    return Entry(indexes, tuple(int(f, 16) for f in filters), enabled, dict(counts))


def parse_config(data: Any) -> dict[str, tuple[Entry, ...]]:
    """The layouts of a parsed YAML document; MigConfigError names what is wrong where."""
    if not isinstance(data, Mapping):
        raise MigConfigError("expected a mapping with version and mig-configs")
    if data.get("version") != VERSION:
        raise MigConfigError(f"version: expected {VERSION!r}, found {data.get('version')!r}")
    unknown = sorted(set(data) - {"version", "mig-configs"})
    if unknown:
        raise MigConfigError(f"unexpected key {unknown[0]!r}")
    configs = data.get("mig-configs")
    if not isinstance(configs, Mapping) or not configs:
        raise MigConfigError("mig-configs: expected at least one named layout")
    layouts = {}
    for name, entries in configs.items():
        if not isinstance(entries, list) or not entries:
            raise MigConfigError(f"mig-configs.{name}: expected a list of at least one entry")
        layouts[str(name)] = tuple(
            _entry(raw, f"mig-configs.{name}[{i}]") for i, raw in enumerate(entries)
        )
    return layouts


def layout_strategy(entries: Sequence[Entry]) -> str:
    """The device plugin's MIG strategy a layout calls for: none where it enables MIG
    nowhere, single where every entry enables it with one and the same profile, else
    mixed (the GPU Operator's default is single; it is the site's to set mixed)."""
    if not any(entry.mig_enabled for entry in entries):
        return "none"
    profiles = {profile for entry in entries for profile in entry.mig_devices}
    if all(entry.mig_enabled for entry in entries) and len(profiles) <= 1:
        return "single"
    return "mixed"


def select(layouts: Mapping[str, tuple[Entry, ...]], name: str) -> tuple[Entry, ...]:
    if name not in layouts:
        raise MigConfigError(
            f"no layout named {name!r}; the file has: {', '.join(sorted(layouts))}"
        )
    return layouts[name]


@dataclass(frozen=True)
class Gpu:
    index: int
    pci_device_id: int  # e.g. 0x20B0
    mig_capable: bool


def _matches(entry: Entry, gpu: Gpu) -> bool:
    device_id = gpu.pci_device_id << 16 | 0x10DE
    if entry.device_filter and device_id not in entry.device_filter:
        return False
    return entry.devices is None or gpu.index in entry.devices


def per_gpu(entries: Sequence[Entry], gpus: Sequence[Gpu]) -> dict[int, Entry]:
    """What each GPU ends up with, as mig-parted applies a layout's entries in order (a
    later entry that matches a GPU replaces an earlier one's effect). GPUs without MIG
    that an entry reaches with `devices: all` are passed over, as mig-parted does.

    Stricter than mig-parted, which ignores them: an index no GPU of the host has, and
    a layout that enables MIG on a host where it reaches no MIG-capable GPU.
    """
    indexes = {gpu.index for gpu in gpus}
    result: dict[int, Entry] = {}
    for entry in entries:
        missing = sorted(set(entry.devices or ()) - indexes)
        if missing:
            raise MigConfigError(
                f"GPU index {missing[0]} does not exist here (GPUs: {sorted(indexes)})"
            )
        for gpu in gpus:
            if not _matches(entry, gpu):
                continue
            if not gpu.mig_capable:
                if entry.mig_enabled and entry.devices is not None:
                    raise MigConfigError(f"GPU {gpu.index} does not support MIG")
                continue
            result[gpu.index] = entry
    if any(e.mig_enabled for e in entries) and not any(e.mig_enabled for e in result.values()):
        raise MigConfigError(
            "the layout enables MIG, but none of its entries reaches a GPU here that has MIG"
        )
    return result


def _gpu_instance(profile: str) -> str:
    """The GPU instance profile a name stands for: `1c.3g.20gb` is a compute instance in
    a `3g.20gb`; attributes stay (`1g.5gb+me`)."""
    fields = profile.partition("+")[0].split(".")
    return profile.split(".", 1)[1] if len(fields) == 3 else profile


@dataclass(frozen=True)
class Verdict:
    errors: tuple[str, ...]  # what would fail: nothing may change
    unchecked: tuple[str, ...]  # GPUs whose model this module cannot check


def check(entries: Sequence[Entry], gpus: Sequence[Gpu]) -> Verdict:
    """Whether a layout can be applied to a host's GPUs: the entries reach them as
    mig-parted would (per_gpu), each profile is one the GPU's model offers, and each
    GPU's instances fit on it (mig_profiles)."""
    try:
        chosen = per_gpu(entries, gpus)
    except MigConfigError as exc:
        return Verdict((str(exc),), ())
    by_index = {gpu.index: gpu for gpu in gpus}
    errors: list[str] = []
    unchecked: list[str] = []
    for index, entry in sorted(chosen.items()):
        if not entry.mig_devices:
            continue
        model = mig_profiles.MODELS.get(by_index[index].pci_device_id)
        if model is None:
            unchecked.append(f"GPU {index} (PCI device 0x{by_index[index].pci_device_id:04X})")
            continue
        missing = [p for p in entry.mig_devices if _gpu_instance(p) not in model.profiles]
        if missing:
            errors.append(
                f"GPU {index} ({model.name}) offers no {missing[0]!r}; "
                f"its profiles: {', '.join(model.profiles)}"
            )
            continue
        if any(_gpu_instance(p) != p for p in entry.mig_devices):
            unchecked.append(f"GPU {index} (compute instance profiles: fit not checked here)")
            continue
        counts = {p: n for p, n in entry.mig_devices.items() if n}
        if mig_profiles.placement(model, counts) is None:
            wanted = ", ".join(f"{n}x {p}" for p, n in counts.items())
            errors.append(f"GPU {index} ({model.name}): {wanted} do not fit on one GPU")
    return Verdict(tuple(errors), tuple(unchecked))

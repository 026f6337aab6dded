# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Parse nvidia-smi output: `--query-gpu ... --format=csv,noheader,nounits`, `-q -x` and `-L`."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

# Fields gpu_facts asks for, in this order.
QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "driver_version",
    "persistence_mode",
    "mig.mode.current",
    "compute_cap",
)
_NOT_AVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", ""}


# `nvidia-smi -L`: a GPU line, then one indented line per MIG device of that GPU.
_LIST_GPU = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[^)\s]+)\)\s*$")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: MIG-[^)\s]+\)\s*$")


class SmiParseError(ValueError):
    pass


def query_args(fields: tuple[str, ...] = QUERY_FIELDS) -> list[str]:
    """nvidia-smi's arguments for `fields` (gpu_facts' by default), read by parse_query_csv."""
    return [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


# nvidia-smi's answer to a --query-gpu field its driver does not know (rc 2).
_UNKNOWN_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')


def refused_field(rc: int, out: str, err: str) -> str | None:
    """The field nvidia-smi refused a --query-gpu for (its driver does not know it)."""
    match = _UNKNOWN_FIELD.search(f"{out}\n{err}") if rc != 0 else None
    return match[1] if match else None


def _value(text: str) -> str | None:
    text = text.strip()
    return None if text in _NOT_AVAILABLE else text


def _enabled(text: str | None) -> bool | None:
    if text is None:
        return None
    return text.strip().lower() == "enabled"


def parse_query_csv(output: str, fields: tuple[str, ...] = QUERY_FIELDS) -> list[dict[str, Any]]:
    """Rows of `--format=csv,noheader,nounits` output as dicts keyed by field name.

    Product names contain no commas, so splitting on ", " is safe for these fields.
    """
    rows = []
    for number, line in enumerate(output.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise SmiParseError(
                f"nvidia-smi line {number}: expected {len(fields)} values, got {len(cells)}: "
                f"{line!r}"
            )
        raw = dict(zip(fields, cells))
        row: dict[str, Any] = {k: _value(v) for k, v in raw.items()}
        if row.get("index") is not None:
            row["index"] = int(row["index"])
        if row.get("memory.total") is not None:
            row["memory.total"] = int(float(row["memory.total"]))
        if "persistence_mode" in row:
            row["persistence_mode"] = _enabled(row["persistence_mode"])
        if "mig.mode.current" in row:
            row["mig.mode.current"] = _enabled(row["mig.mode.current"])
        rows.append(row)
    return rows


def _text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    found = node.find(path)
    if found is None or found.text is None:
        return None
    return _value(found.text)


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _mib(text: str | None) -> int | None:
    if text is None:
        return None
    return int(float(text.split()[0]))


def parse_query_xml(output: str) -> dict[str, Any]:
    """The parts of `nvidia-smi -q -x` gpu_facts reports."""
    try:
        root = ET.fromstring(output)
    except ET.ParseError as exc:
        raise SmiParseError(f"nvidia-smi -q -x: not XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise SmiParseError(f"nvidia-smi -q -x: unexpected root element <{root.tag}>")
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        mig_devices = []
        for mig in gpu.findall("mig_devices/mig_device"):
            mig_devices.append(
                {
                    "index": int(_text(mig, "index") or 0),
                    "gpu_instance_id": int(_text(mig, "gpu_instance_id") or 0),
                    "compute_instance_id": int(_text(mig, "compute_instance_id") or 0),
                    "memory_mib": _mib(_text(mig, "fb_memory_usage/total")),
                    "multiprocessor_count": int(
                        _text(mig, "device_attributes/shared/multiprocessor_count") or 0
                    ),
                }
            )
        gpus.append(
            {
                "index": index,
                "product_name": _text(gpu, "product_name"),
                "product_architecture": _text(gpu, "product_architecture"),
                "uuid": _text(gpu, "uuid"),
                # The N of the GPU's /dev/nvidiaN (not always its index).
                "minor_number": _int(_text(gpu, "minor_number")),
                "serial": _text(gpu, "serial"),
                "pci_bus_id": gpu.get("id") or _text(gpu, "pci/pci_bus_id"),
                "memory_mib": _mib(_text(gpu, "fb_memory_usage/total")),
                "persistence_mode": _enabled(_text(gpu, "persistence_mode")),
                "mig_mode": _enabled(_text(gpu, "mig_mode/current_mig")),
                "mig_mode_pending": _enabled(_text(gpu, "mig_mode/pending_mig")),
                "mig_devices": mig_devices,
                "vbios_version": _text(gpu, "vbios_version"),
            }
        )
    return {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "attached_gpus": int(_text(root, "attached_gpus") or 0),
        "gpus": gpus,
    }


def parse_list(output: str) -> dict[str, list[str]]:
    """{GPU UUID: profiles of its MIG devices, in listed order} from `nvidia-smi -L`."""
    gpus: dict[str, list[str]] = {}
    current: list[str] | None = None
    for number, line in enumerate(output.splitlines(), start=1):
        if not line.strip():
            continue
        gpu = _LIST_GPU.match(line)
        mig = _LIST_MIG.match(line)
        if gpu:
            current = gpus.setdefault(gpu.group(2), [])
        elif mig and current is not None:
            current.append(mig.group(1))
        else:
            raise SmiParseError(f"nvidia-smi -L line {number}: unexpected {line!r}")
    return gpus


def name_mig_devices(xml: dict[str, Any], listed: dict[str, list[str]]) -> None:
    """Give each MIG device of parse_query_xml's result its profile (`profile`) from
    parse_list's, matched by GPU UUID and position (both list devices by index)."""
    for gpu in xml.get("gpus", []):
        profiles = listed.get(gpu.get("uuid") or "", [])
        devices = sorted(gpu.get("mig_devices", []), key=lambda device: device["index"])
        if len(profiles) != len(devices):
            raise SmiParseError(
                f"GPU {gpu.get('uuid')}: nvidia-smi -L lists {len(profiles)} MIG devices, "
                f"-q -x {len(devices)}"
            )
        for device, profile in zip(devices, profiles):
            device["profile"] = profile

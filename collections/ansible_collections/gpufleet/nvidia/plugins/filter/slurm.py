# Copyright: gpufleet developers
# Apache License 2.0 (see the repository's LICENSE)
"""Slurm's view of a node's GPUs: gres.conf entries from the facts, and the Gres=
value of the node's slurm.conf line.

Documentation: slurm_gres.yml, slurm_gres_spec.yml, slurm_gres_counts.yml,
slurm_gres_listed.yml and slurm_node.yml next to this file.
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

# A line of `slurmd -G`: how slurmd read one gres.conf entry.
_LISTED = re.compile(r"Gres Name=gpu\b(?:.*?\bType=(?P<type>\S+))?.*?\bFile=(?P<file>\S+)")


def slurm_gres_type(name, types=None):
    """The GRES type of a GPU named `name` (NVML's name): `types[name]` when the site
    names it, else the name lower-cased with spaces as underscores, which is how
    Slurm's own AutoDetect=nvml names it ("Tesla T4" -> "tesla_t4")."""
    if name in (types or {}):
        return str(types[name])
    return "".join("_" if c == " " else c.lower() for c in name)


def slurm_gres(gpus, types=None):
    """One gres.conf entry per GPU: {type, file, gpu, mig}. A GPU whose name or device
    file the facts do not know is an error naming it."""
    if not isinstance(gpus, list):
        raise AnsibleFilterError("slurm_gres: expected the node's GPU list (gpu_facts)")
    entries = []
    for index, gpu in enumerate(gpus):
        where = f"GPU {index} ({gpu.get('pci_address', '?')})"
        if not gpu.get("name"):
            raise AnsibleFilterError(f"{where}: the facts name no model")
        minor = gpu.get("minor_number")
        if not isinstance(minor, int):
            raise AnsibleFilterError(
                f"{where}: the driver reported no minor number, so its /dev/nvidiaN is unknown"
            )
        entries.append(
            {
                "type": slurm_gres_type(gpu["name"], types),
                "file": f"/dev/nvidia{minor}",
                "gpu": index,
                "mig": bool(gpu.get("mig_mode")),
            }
        )
    return entries


def slurm_gres_spec(entries):
    """The Gres= value for slurm.conf: "gpu:<type>:<count>" per type, in the order the
    types first appear ("" without GPUs)."""
    counts = {}
    for entry in entries:
        counts[entry["type"]] = counts.get(entry["type"], 0) + 1
    return ",".join(f"gpu:{kind}:{count}" for kind, count in counts.items())


def slurm_gres_counts(spec):
    """{type: count} of the gpu entries of a Gres= value as slurm.conf or scontrol
    writes it ("gpu:tesla_t4:1(S:0),gpu:a100:2"; "(null)" or "" for none). An untyped
    entry (gpu:2) counts under ""; GRES other than gpu are left out."""
    counts = {}
    if not spec or spec == "(null)":
        return counts
    for item in re.split(r",(?![^(]*\))", spec):
        fields = item.split("(", 1)[0].split(":")
        if fields[0] != "gpu":
            continue
        kind = fields[1] if len(fields) == 3 else ""
        number = fields[-1] if len(fields) > 1 and fields[-1].isdigit() else "1"
        counts[kind] = counts.get(kind, 0) + int(number)
    return counts


def slurm_gres_listed(output):
    """[{type, file}] of the GPUs `slurmd -G` says it read from gres.conf."""
    return [
        {"type": m.group("type") or "", "file": m.group("file")}
        for m in _LISTED.finditer(output or "")
    ]


def slurm_node(output):
    """The fields of `scontrol --oneliner show node NAME` as a dict ({} when the output
    has no node). Reason= runs to the end of the line, spaces and all."""
    line = next((ln for ln in (output or "").splitlines() if ln.startswith("NodeName=")), "")
    if not line:
        return {}
    line, _, reason = line.partition(" Reason=")
    fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
    if reason:
        fields["Reason"] = reason.strip()
    return fields


class FilterModule:
    def filters(self):
        return {
            "slurm_gres": slurm_gres,
            "slurm_gres_spec": slurm_gres_spec,
            "slurm_gres_counts": slurm_gres_counts,
            "slurm_gres_listed": slurm_gres_listed,
            "slurm_node": slurm_node,
        }

# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Slurm's view of a node's GPUs: gres.conf entries from the facts, and the Gres=
value of the node's slurm.conf line.

Documentation: slurm_gres.yml, slurm_gres_spec.yml, slurm_gres_counts.yml,
slurm_gres_listed.yml, slurm_autodetect_differences.yml, slurm_node.yml and
slurm_node_line.yml next to this file.
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

# A line of `slurmd -G`: how slurmd read one gres.conf entry (File= is the list of
# MultipleFiles, comma-joined, for a MIG device).
_LISTED = re.compile(
    r"Gres Name=gpu\b(?:.*?\bType=(?P<type>\S+))?.*?\bFile=(?P<file>\S+)"
    r"(?:[^\n]*?\bCores=(?P<cores>\S+))?"
)


def _underscored(name):
    return "".join("_" if c == " " else c.lower() for c in name)


def slurm_gres_type(name, types=None):
    """The GRES type of a GPU named `name` (NVML's name): `types[name]` when the site
    names it, else the name lower-cased with spaces as underscores, which is how
    Slurm's own AutoDetect=nvml names it ("Tesla T4" -> "tesla_t4")."""
    if name in (types or {}):
        return str(types[name])
    return _underscored(name)


def slurm_mig_type(name, profile, types=None):
    """The GRES type of a MIG device of profile `profile` ("3g.20gb") on a GPU named
    `name`: the GPU's type cut at its first '-' as AutoDetect=nvml cuts it
    ("NVIDIA A100-SXM4-40GB" -> "nvidia_a100"), or the site's type for the model,
    then "_" and the profile NVIDIA names ("nvidia_a100_3g.20gb")."""
    base = str(types[name]) if name in (types or {}) else _underscored(name).split("-", 1)[0]
    return f"{base}_{profile}"


def _in_sockets(local, per_socket):
    """The cores of the one socket (of `per_socket` cores) that holds the cores `local`;
    every core (None) where they are in more than one socket."""
    sockets = {core // per_socket for core in local}
    if len(sockets) > 1:
        return None
    (socket,) = sockets
    return range(socket * per_socket, (socket + 1) * per_socket)


def _cores(local, count, per_socket=0):
    """Cores= for a device near `local` cores of `count`: "" when that is every core
    or unknown, as Slurm advises; else ranges ("0-15,32"). With `per_socket`, whole
    sockets of that many cores: the socket holding them, or every core where they are
    in more than one."""
    if local and count and per_socket:
        local = _in_sockets(local, per_socket)
    if not local or not count or set(local) >= set(range(count)):
        return ""
    runs = []
    for core in sorted(set(local)):
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def slurm_gres(gpus, types=None, core_count=0, socket_cores=0):
    """One gres.conf entry per GPU, or per MIG device of a GPU in MIG mode:
    {type, file, files, cores, gpu, mig}. `file` is the comma-joined `files` (one
    file, or a MIG device's GPU and capability files), as slurmd -G lists it; `cores`
    is the Cores= value ("" for any core; on every entry or none), from the GPU's
    `local_cores` among `core_count` (Slurm's count of the node's cores), widened to
    the whole socket of `socket_cores` cores that holds them where that is given
    (Slurm 24.11 refuses a Cores= with part of a socket; 25.11 also one of several
    sockets but not all); `mig` the MIG profile ("" for a whole GPU).
    A GPU in MIG mode without MIG devices has no entry. What the facts do not know (a
    name, a device file) is an error naming the GPU."""
    if not isinstance(gpus, list):
        raise AnsibleFilterError("slurm_gres: expected the node's GPU list (gpu_facts)")
    if any(max(gpu.get("local_cores") or [0]) >= core_count for gpu in gpus):
        core_count = 0  # a core Slurm does not count: the numbering is not Slurm's
    entries = []
    near = []
    for index, gpu in enumerate(gpus):
        where = f"GPU {index} ({gpu.get('pci_address', '?')})"
        if not gpu.get("name"):
            raise AnsibleFilterError(f"{where}: the facts name no model")
        minor = gpu.get("minor_number")
        if not isinstance(minor, int):
            raise AnsibleFilterError(
                f"{where}: the driver reported no minor number, so its /dev/nvidiaN is unknown"
            )
        cores = _cores(gpu.get("local_cores"), core_count, socket_cores)
        near.append(cores)
        devices = [(slurm_gres_type(gpu["name"], types), [f"/dev/nvidia{minor}"], "")]
        if gpu.get("mig_mode"):
            devices = []
            for mig in gpu.get("mig_devices") or []:
                if not mig.get("profile") or len(mig.get("cap_files") or []) != 2:
                    raise AnsibleFilterError(
                        f"{where}: MIG device {mig.get('index')} has no profile or no "
                        "capability device files in the facts (numbered in "
                        "/proc/driver/nvidia-caps/mig-minors, made under /dev/nvidia-caps)"
                    )
                mig_type = slurm_mig_type(gpu["name"], mig["profile"], types)
                devices.append(
                    (mig_type, [f"/dev/nvidia{minor}", *mig["cap_files"]], mig["profile"])
                )
        entries.extend(
            {
                "type": kind,
                "file": ",".join(files),
                "files": files,
                "cores": cores,
                "gpu": index,
                "mig": profile,
            }
            for kind, files, profile in devices
        )
    if any(near):
        # Cores= on every line or on none: slurmctld warns of a node whose GRES have
        # cores only in part. A GPU near every core (or unknown) gets them all.
        every = _cores(range(core_count), core_count + 1)
        for entry in entries:
            entry["cores"] = entry["cores"] or every
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
    """[{type, file, cores}] of the GPUs `slurmd -G` says it read from gres.conf."""
    return [
        {"type": m.group("type") or "", "file": m.group("file"), "cores": m.group("cores") or ""}
        for m in _LISTED.finditer(output or "")
    ]


def _core_set(value):
    """The cores of a Cores= value ("0-15,32")."""
    cores = set()
    for part in filter(None, (value or "").split(",")):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def slurm_autodetect_differences(listed, entries, socket_cores=0):
    """What Slurm's AutoDetect=nvml (`listed`, from slurm_gres_listed over slurmd -G)
    gets otherwise than the driver's view (`entries`, from slurm_gres): a device found
    by one and not the other, or a type named otherwise, each one short sentence naming
    the type and the GPU's device file; with `socket_cores` (Slurm 24.11 and newer),
    also a detected Cores= holding part of a socket of that many cores, which slurmctld
    refuses. [] when they agree."""

    def gpu(files):
        return files.split(",", 1)[0]  # a MIG device's GPU, before its capability files

    found = {(e["type"], e["file"]) for e in listed}
    declared = {(e["type"], e["file"]) for e in entries}
    said = [
        f"Slurm finds {kind} on {gpu(files)}, which the driver does not report"
        for kind, files in sorted(found - declared)
    ]
    said += [
        f"Slurm does not find the {kind} on {gpu(files)}"
        for kind, files in sorted(declared - found)
    ]
    if socket_cores:
        for entry in listed:
            cores = _core_set(entry["cores"])
            sockets = {core // socket_cores for core in cores}
            whole = set().union(*(range(s * socket_cores, (s + 1) * socket_cores) for s in sockets))
            if cores != whole:
                said.append(
                    f"Slurm puts {entry['type']} on {gpu(entry['file'])} near cores "
                    f"{entry['cores']}, part of a {socket_cores}-core socket"
                )
    return said


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


def slurm_node_line(hardware, spec=""):
    """The node's slurm.conf line: the NodeName= line `slurmd -C` printed, with
    Gres=`spec` (none where it is empty) in place of the Gres= slurmd adds itself
    (slurmd 24.11 and newer list the GPUs their NVML plugin detects there)."""
    line = next((ln for ln in (hardware or "").splitlines() if ln.startswith("NodeName=")), "")
    fields = [field for field in line.split() if not field.startswith("Gres=")]
    return " ".join([*fields, f"Gres={spec}"] if spec else fields)


class FilterModule:
    def filters(self):
        return {
            "slurm_gres": slurm_gres,
            "slurm_gres_spec": slurm_gres_spec,
            "slurm_gres_counts": slurm_gres_counts,
            "slurm_gres_listed": slurm_gres_listed,
            "slurm_autodetect_differences": slurm_autodetect_differences,
            "slurm_node": slurm_node,
            "slurm_node_line": slurm_node_line,
        }

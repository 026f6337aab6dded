# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU health: the signals a node's GPUs give, and the action each one asks for.

Two sources, both read where NVIDIA's own tools read them:
- NVML, through `nvidia-smi --query-gpu` with HEALTH_FIELDS (added to the query a
  module already makes, so health costs no extra process), and the lines nvidia-smi
  prints instead of a row for a GPU it cannot reach;
- the kernel's log (`/dev/kmsg` records), for the driver's `NVRM: Xid` lines.

ACTIONS orders what a signal can ask for. The table of record is SIGNALS (NVML
readings) and XIDS (NVIDIA's Xid catalogue); docs/health.md prints both with their
sources, and a site changes any entry with `overrides` (see check_overrides).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ansible_collections.gpufleet.nvidia.plugins.module_utils import smi

# Least to most severe. none: the application's error, nothing wrong with the GPU.
# watch: recorded and counted, the GPU stays in service. reset: the GPU needs a reset
# (its consumers stopped). reboot: the node needs a reboot. replace: the GPU is not to
# be used again until an operator says so.
ACTIONS = ("none", "watch", "reset", "reboot", "replace")

# Added to the --query-gpu a module makes anyway. The throttle mask keeps its older
# name, which drivers from before the rename know and later ones still accept.
HEALTH_FIELDS = (
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "clocks_throttle_reasons.active",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
)
# Fields --query-gpu has on newer drivers only (580 has them, Debian's 535 refuses the
# first): where refused, the query is made without them and the remapped rows read with
# --query-remapped-rows, which 535 has (the recovery action it has nowhere).
NEWER_FIELDS = ("remapped_rows.pending", "remapped_rows.failure", "gpu_recovery_action")
# A GPU's identity, kept with its health where the query asked for it.
IDENTITY_FIELDS = ("uuid", "serial")
_REMAPPED_QUERY = (
    "--query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure",
    "--format=csv,noheader,nounits",
)

# NVML's clock event reason bits (nvmlClocksEventReason*, formerly ...ThrottleReason*).
GPU_IDLE = 0x1
THROTTLE_BITS = {
    0x8: "hw-slowdown",
    0x40: "hw-thermal-slowdown",
    0x80: "hw-power-brake",
}

# Signals read from NVML: kind -> (default action, what it means).
SIGNALS: dict[str, tuple[str, str]] = {
    "lost": (
        "reboot",
        "the GPU is lost to the driver (fallen off the bus); only a reboot brings it back",
    ),
    "ecc-dbe": ("watch", "uncorrectable ECC errors since the driver loaded"),
    "retire-pending": ("reset", "a page waits to be retired; it is retired at the next GPU reset"),
    "remap-pending": ("reset", "a memory row waits to be remapped; a GPU reset completes it"),
    "remap-failure": ("replace", "a memory row could not be remapped: no spare rows left"),
    "recovery-reset": ("reset", "the driver's recovery action: reset the GPU"),
    "recovery-reboot": ("reboot", "the driver's recovery action: reboot the node"),
    "recovery-drain-p2p": ("watch", "the driver's recovery action: drain peer-to-peer traffic"),
    "recovery-drain-reset": ("reset", "the driver's recovery action: drain, then reset the GPU"),
    "recovery-other": ("watch", "a recovery action this table does not know"),
    "hw-slowdown": ("watch", "clocks held down by the hardware (HW slowdown)"),
    "hw-thermal-slowdown": ("watch", "clocks held down by the hardware for temperature"),
    "hw-power-brake": ("watch", "clocks held down by an external power brake"),
    "pcie-width": ("watch", "the PCIe link runs narrower than the GPU's maximum"),
    "pcie-gen": ("watch", "the PCIe link runs below its maximum generation while the GPU is busy"),
}

# Yes/No readings and the signal each gives when set.
FLAGS = {
    "retired_pages.pending": "retire-pending",
    "remapped_rows.pending": "remap-pending",
    "remapped_rows.failure": "remap-failure",
}
# nvidia-smi's gpu_recovery_action values but None (NVML_GPU_RECOVERY_ACTION_*).
RECOVERY = {
    "reset": "recovery-reset",
    "reboot": "recovery-reboot",
    "drain p2p": "recovery-drain-p2p",
    "drain and reset": "recovery-drain-reset",
}

# NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors), "immediate action" column
# mapped to ours: RESTART_APP -> none, IGNORE -> watch, RESET_GPU -> reset, RESTART_BM ->
# reboot, CONTACT_SUPPORT -> replace; the NVLink and Xid 48 workflows start with a GPU
# reset (a recurrence after it is what quarantines). Xid -> (action, meaning).
XIDS: dict[int, tuple[str, str]] = {
    13: ("none", "graphics engine exception (an application's error)"),
    31: ("none", "GPU memory page fault (an application's error)"),
    32: ("none", "invalid or corrupted push buffer stream"),
    43: ("watch", "the GPU stopped processing (an application's error)"),
    45: ("none", "preemptive cleanup after an earlier error"),
    48: ("reset", "double-bit ECC error"),
    61: ("replace", "internal micro-controller breakpoint"),
    62: ("reset", "internal micro-controller halt"),
    63: ("watch", "memory row remapping or page retirement recorded"),
    64: ("reset", "memory row remapping or page retirement failed"),
    68: ("none", "video decoder exception"),
    69: ("none", "graphics engine class error"),
    74: ("reset", "NVLink error"),
    79: ("reboot", "the GPU has fallen off the bus"),
    92: ("watch", "high single-bit ECC error rate"),
    94: ("none", "contained memory error (the application using it was stopped)"),
    95: ("reset", "uncontained memory error"),
    109: ("reset", "context switch timeout"),
    119: ("reset", "GSP RPC timeout"),
    120: ("reset", "GSP error"),
    121: ("watch", "C2C link error"),
    136: ("reset", "link training failed"),
    140: ("reset", "unrecovered ECC error"),
    143: ("reset", "GPU initialization failure"),
    **{code: ("reset", "NVLink5 error") for code in range(144, 151)},
    155: ("reset", "NVLink software-defined error"),
}
# Xid 154 carries the driver's new recovery action in its text, in parentheses at the end.
XID_RECOVERY = 154
UNKNOWN_XID = ("watch", "an Xid this table does not list")

# The driver's Xid line: "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., text" (older
# drivers: no "PCI:", no pid or name). A MIG GPU adds " GPU-I:nn GPU-CI:nn" in the brackets.
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
    r"(?P<mig>[^)]*)\): (?P<code>\d+),\s*(?P<text>.*)$"
)
_PID = re.compile(r"^pid=(?P<pid>'?[^,]*'?), name=(?P<name>[^,]*),\s*")
_LAST_PARENS = re.compile(r"\(([^()]*)\)\s*\.?\s*$")
# nvidia-smi's line for a GPU it cannot open, in place of its output: the GPU named by
# its PCI bus id where nvidia-smi could read it ("GPU 0000:02:00.0", "GPU0000:07:00.0"),
# else by its index ("GPU1", as Debian's 535 prints it on the mock NVML).
_UNREACHABLE = re.compile(
    r"^Unable to determine the device handle for GPU\s*"
    r"(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]|\d+): (?P<reason>.*)$"
)


class HealthInputError(ValueError):
    pass


def check_overrides(overrides: Mapping[str, Any] | None) -> dict[str, str]:
    """A site's changes to the table: {signal kind or "xid:N": action}. Raises
    HealthInputError naming the first bad entry."""
    checked: dict[str, str] = {}
    for key, action in (overrides or {}).items():
        if not (key in SIGNALS or re.fullmatch(r"xid:\d+", str(key))):
            raise HealthInputError(
                f"{key!r} is neither a signal ({', '.join(sorted(SIGNALS))}) nor 'xid:<number>'"
            )
        if action not in ACTIONS:
            raise HealthInputError(f"{key!r}: {action!r} is not one of {', '.join(ACTIONS)}")
        checked[str(key)] = str(action)
    return checked


def worst(actions: Iterable[str]) -> str:
    """The most severe of `actions` ("none" for none)."""
    return max(actions, key=ACTIONS.index, default="none")


def _signal(kind: str, detail: str, overrides: Mapping[str, str]) -> dict[str, Any]:
    action, meaning = SIGNALS[kind]
    return {"kind": kind, "action": overrides.get(kind, action), "detail": f"{meaning}: {detail}"}


def _int(value: Any) -> int | None:
    """A count, or a bit mask printed in hex ("0x0000000000000001"); None if neither."""
    text = str(value).strip().lower() if value is not None else ""
    try:
        return int(text, 16) if text.startswith("0x") else int(text)
    except ValueError:
        return None


def _yes(value: Any) -> bool:
    """A flag as nvidia-smi prints it: "Yes" in --query-gpu, 1 in 535's
    --query-remapped-rows."""
    return str(value).strip().lower() in ("yes", "1")


def row_signals(
    row: Mapping[str, Any], overrides: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The signals of one GPU's --query-gpu row (parsed by smi.parse_query_csv, with
    HEALTH_FIELDS among its fields; a field the driver does not give is skipped)."""
    overrides = overrides or {}
    found = []
    dbe = _int(row.get("ecc.errors.uncorrected.volatile.total"))
    if dbe:
        found.append(_signal("ecc-dbe", f"{dbe} since the driver loaded", overrides))
    for field, kind in FLAGS.items():
        if _yes(row.get(field)):
            found.append(_signal(kind, f"{field} is {row[field]}", overrides))
    recovery = (row.get("gpu_recovery_action") or "none").strip()
    if recovery.lower() != "none":
        kind = RECOVERY.get(recovery.lower(), "recovery-other")
        found.append(_signal(kind, f"gpu_recovery_action is {recovery}", overrides))
    mask = _int(row.get("clocks_throttle_reasons.active") or row.get("clocks_event_reasons.active"))
    for bit, kind in THROTTLE_BITS.items():
        if mask is not None and mask & bit:
            found.append(_signal(kind, f"clock event reasons {mask:#x}", overrides))
    width, max_width = (
        _int(row.get("pcie.link.width.current")),
        _int(row.get("pcie.link.width.max")),
    )
    if width and max_width and width < max_width:
        found.append(_signal("pcie-width", f"x{width} of x{max_width}", overrides))
    gen, max_gen = _int(row.get("pcie.link.gen.current")), _int(row.get("pcie.link.gen.max"))
    busy = mask is not None and not mask & GPU_IDLE
    if busy and gen and max_gen and gen < max_gen:
        found.append(_signal("pcie-gen", f"generation {gen} of {max_gen}", overrides))
    return found


def pci_address(text: str) -> str:
    """ "00000000:3B:00.0", "0000:3b:00" (an Xid line's, function 0) -> "0000:3b:00.0"."""
    domain, bus, device = text.lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{device if '.' in device else device + '.0'}"


def split_unreachable(output: str) -> tuple[str, dict[str, str]]:
    """nvidia-smi's query output less its lines for GPUs it could not open, and those
    GPUs: {PCI address "0000:3b:00.0", or "index:N" where it named the index: its words}."""
    kept, unreachable = [], {}
    for line in output.splitlines():
        match = _UNREACHABLE.match(line.strip())
        if match:
            name = match["bus"]
            key = f"index:{name}" if name.isdigit() else pci_address(name)
            unreachable[key] = match["reason"].strip()
        else:
            kept.append(line)
    return "\n".join(kept), unreachable


def unreachable_signal(reason: str, overrides: Mapping[str, str] | None = None) -> dict[str, Any]:
    return _signal("lost", f"nvidia-smi: {reason}", overrides or {})


def xid_action(code: int, text: str, overrides: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(action, meaning) of Xid `code` whose line says `text`."""
    if code == XID_RECOVERY:
        match = _LAST_PARENS.search(text)
        said = (match[1] if match else "").lower()
        action = (
            "reboot"
            if "reboot" in said
            else "reset"
            if "reset" in said
            else "none"
            if said == "none"
            else "watch"
        )
        meaning = f"the driver's recovery action changed ({match[1] if match else 'unreadable'})"
    else:
        action, meaning = XIDS.get(code, UNKNOWN_XID)
    return (overrides or {}).get(f"xid:{code}", action), meaning


def parse_kmsg(text: str, overrides: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The Xid events among kernel log records, oldest first.

    `text` is what /dev/kmsg gives (records "prio,seq,usec,flags;message", each maybe
    followed by " KEY=value" lines) or plain `dmesg` lines; `seq` is the record's sequence
    number in the boot (None for dmesg lines), the key an event is counted once by.
    """
    events = []
    for line in text.splitlines():
        if line.startswith(" "):
            continue  # a record's dictionary line
        seq = usec = None
        head, sep, message = line.partition(";")
        fields = head.split(",")
        if sep and len(fields) >= 3 and fields[1].isdigit() and fields[2].isdigit():
            seq, usec = int(fields[1]), int(fields[2])
        else:
            message = line
        match = _XID.search(message)
        if not match:
            continue
        code, text_ = int(match["code"]), match["text"].strip()
        detail = _PID.match(text_)
        action, meaning = xid_action(code, text_, overrides)
        events.append(
            {
                "seq": seq,
                "usec": usec,
                # The GPU's PCI address as sysfs and gpu_facts write it ("0000:3b:00.0").
                "pci_address": pci_address(match["pci"]),
                "xid": code,
                "mig": match["mig"].strip() or None,
                "pid": detail["pid"].strip("'") if detail else None,
                "process": detail["name"] if detail else None,
                "message": text_[detail.end() :] if detail else text_,
                "action": action,
                "meaning": meaning,
            }
        )
    return events


Run = Callable[[list[str]], tuple[int, str, str]]


def query(
    run: Run, binary: str, fields: tuple[str, ...]
) -> tuple[list[dict[str, Any]] | None, dict[str, str], str | None]:
    """nvidia-smi's rows for `fields` (which hold "pci.bus_id") with the health fields
    added, the GPUs it could not open (split_unreachable's), and why there are no rows
    (None when there are; a GPU it could not open leaves the rows it printed, maybe
    none). One nvidia-smi call on drivers that know NEWER_FIELDS, three on those that
    do not. Raises smi.SmiParseError on output it cannot read."""
    asked = (*fields, *HEALTH_FIELDS, *NEWER_FIELDS)
    rc, out, err = run([binary, *smi.query_args(asked)])
    remapped: dict[str, dict[str, str | None]] = {}
    if smi.refused_field(rc, out, err) in NEWER_FIELDS:
        asked = (*fields, *HEALTH_FIELDS)
        rc, out, err = run([binary, *smi.query_args(asked)])
        rc2, out2, _ = run([binary, *_REMAPPED_QUERY])
        if rc2 == 0:
            for row in smi.parse_query_csv(out2, ("bus", *NEWER_FIELDS[:2])):
                remapped[pci_address(row.pop("bus"))] = row
    text, unreachable = split_unreachable(out)
    if rc != 0 and not unreachable:
        return None, {}, f"nvidia-smi exited {rc}: {(out or err).strip()[:200]}"
    rows = smi.parse_query_csv(text, asked)
    for row in rows:
        row.update(remapped.get(pci_address(row["pci.bus_id"]), {}))
    return rows, unreachable, None


def gpu_health(
    rows: list[dict[str, Any]] | None,
    unreachable: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
    addresses: Iterable[str] = (),
) -> dict[str, dict[str, Any]]:
    """{PCI address: {"action", "signals"}} for each GPU nvidia-smi answered for or
    could not open, with its "uuid" and "serial" where the rows give them (the evidence
    a vendor asks for when a GPU is sent back). A GPU it named by index is placed by
    `addresses`, the node's GPUs' PCI addresses: NVML numbers GPUs in PCI bus order."""
    ordered = sorted(addresses)
    health = {}
    for row in rows or []:
        signals = row_signals(row, overrides)
        identity = {k: row[k] for k in IDENTITY_FIELDS if row.get(k)}
        health[pci_address(row["pci.bus_id"])] = {"signals": signals, **identity}
    for key, reason in unreachable.items():
        index = int(key.removeprefix("index:")) if key.startswith("index:") else None
        if index is not None:
            key = ordered[index] if index < len(ordered) else key
        health[key] = {"signals": [unreachable_signal(reason, overrides)]}
    return {
        address: {"action": worst(s["action"] for s in gpu["signals"]), **gpu}
        for address, gpu in health.items()
    }


KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def read_kernel_log(path: str = KMSG) -> tuple[str | None, str | None]:
    """(the kernel's log records still in its buffer, None) or (None, why not).

    /dev/kmsg gives one record a read and EAGAIN after the newest (opened non-blocking);
    EPIPE says records were overwritten while reading, and the next read goes on.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue
                if exc.errno == errno.EAGAIN:
                    break
                return None, f"cannot read {path}: {exc.strerror or exc}"
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace"), None

"""Faults of a simulated node's GPUs, injected for tests and by people alike.

A fault shows where a real one shows: in what the mock NVML answers (nvml/health
under the run dir, read by tests/sim/nvml/health.c) and, where the driver would log
one, as an Xid record in the node's kernel log (/dev/kmsg: a container has none, so
the simulated kernel keeps it as a file there, in the kernel's record format
"priority,sequence,microseconds,flags;message").

What a board keeps lives under the state dir (a reboot keeps it); at a reboot
(`at_boot`) or a GPU reset (`at_reset`) what they clear is cleared: the volatile ECC
count, a pending row remapping (now done) or page retirement, a lost GPU. A row
remapping failure, clocks held down and a narrowed PCIe link stay until cleared.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import node, profiles

KINDS = (
    "xid",
    "ecc-dbe",
    "remap-pending",
    "remap-failure",
    "lost",
    "throttle",
    "pcie-degraded",
    "gi-create-error",
)
# The simulated driver's words for the Xids it logs (ours, in the shape of the driver's).
_XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_0 faulted",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Unable to remap row, no spare rows left.",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    109: "CTX SWITCH TIMEOUT, Info 0x2c000",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
}
# What the board reports after each fault (nvml/health fields).
_VOLATILE = ("ecc_dbe", "remap_pending", "retire_pending", "lost")


def kmsg() -> Path | None:
    """The node's kernel log where the kernel's interface to it is, /dev/kmsg: a file of
    the simulated kernel's. None on a node that has the host's own (a privileged
    container): a simulation never writes to a real kernel's log, nor reads it (a read
    of the real one waits for the next record)."""
    path = node.DEV / "kmsg"
    if path.exists() and not path.is_file():
        return None
    return path


def _path() -> Path:
    return node.STATE / "faults.json"


def _load() -> dict[str, dict[str, int]]:
    try:
        return json.loads(_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _save(faults: dict[str, dict[str, int]]) -> None:
    node.STATE.mkdir(parents=True, exist_ok=True)
    _path().write_text(json.dumps(faults, sort_keys=True) + "\n", encoding="utf-8")
    write_health()


def write_health() -> None:
    """nvml/health from what the boards keep: one line a GPU with a fault."""
    lines = [
        "\t".join([f"index={index}", *(f"{k}={v}" for k, v in sorted(fields.items()))])
        for index, fields in sorted(_load().items(), key=lambda item: int(item[0]))
        if fields
    ]
    directory = node.RUN / "nvml"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "health").write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _remaps_rows(gpu: profiles.Gpu) -> bool:
    return gpu.architecture in ("Ampere", "Hopper")


def log_xid(gpu: profiles.Gpu, code: int) -> str:
    """Append the driver's Xid record for `gpu` to the kernel log; returns its message."""
    text = _XID_TEXT.get(code, "Simulated error")
    message = f"NVRM: Xid (PCI:0000:{gpu.bus}:00): {code}, pid='<unknown>', name=<unknown>, {text}"
    log_kernel(message, priority=4)
    return message


def log_kernel(message: str, priority: int = 6) -> None:
    """One kernel log record; the sequence number counts the records before it, the
    time is the machine's uptime (a container's is its host's, so it grows across the
    node's reboots, as a record's boot id would tell them apart on a real one)."""
    log = kmsg()
    if log is None:
        return
    try:
        existing = log.read_text(encoding="utf-8").splitlines()
    except OSError:
        existing = []
    seq = sum(1 for line in existing if line and not line.startswith(" "))
    usec = int(float(Path("/proc/uptime").read_text().split()[0]) * 1_000_000)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as handle:
        handle.write(f"{priority},{seq},{usec},-;{message}\n")


def inject(prof: profiles.Profile, kind: str, index: int, code: int | None = None) -> str:
    """Inject `kind` into GPU `index`; returns what was done, in words."""
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r}: one of {', '.join(KINDS)}")
    gpus = {gpu.index: gpu for gpu in prof.gpus}
    if index not in gpus:
        raise ValueError(f"no GPU {index} on this node (it has {len(gpus)})")
    gpu = gpus[index]
    if kind == "gi-create-error":
        # Not the board's: one NVML call fails, once (tests/sim/nvml/mig.c).
        directory = node.RUN / "nvml"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "gi-create-error").write_text(f"{index}\n", encoding="utf-8")
        return f"GPU {index} ({gpu.sysfs_name}): the next GPU instance created fails"
    faults = _load()
    board = faults.setdefault(str(index), {})
    xid = None
    if kind == "xid":
        if code is None:
            raise ValueError("an xid fault needs --code")
        xid = code
        if code == 79:
            board["lost"] = 1
    elif kind == "ecc-dbe":
        board["ecc_dbe"] = board.get("ecc_dbe", 0) + 1
        board["ecc_dbe_aggregate"] = board.get("ecc_dbe_aggregate", 0) + 1
        board["remap_pending" if _remaps_rows(gpu) else "retire_pending"] = 1
        xid = 48
    elif kind == "remap-pending":
        board["remap_pending"] = 1
        xid = 63
    elif kind == "remap-failure":
        board["remap_failure"] = 1
        xid = 64
    elif kind == "lost":
        board["lost"] = 1
        xid = 79
    elif kind == "throttle":
        board["reasons"] = board.get("reasons", 0) | 0x8  # HW slowdown
    elif kind == "pcie-degraded":
        board["pcie_width"] = 8
    _save(faults)
    done = f"GPU {index} ({gpu.sysfs_name}): {kind}"
    if xid is not None:
        done += f"; logged {log_xid(gpu, xid)}"
    return done


def clear() -> None:
    """Every fault gone, as after the boards were replaced."""
    _save({})


def at_reset(index: int) -> None:
    """What a reset of GPU `index` clears: its volatile ECC count and a lost state, and
    it completes a pending row remapping (one more row remapped) or page retirement."""
    faults = _load()
    board = faults.get(str(index), {})
    if board.pop("remap_pending", 0):
        board["remapped_unc"] = board.get("remapped_unc", 0) + 1
    for field in _VOLATILE:
        board.pop(field, None)
    _save(faults)


def at_boot(prof: profiles.Profile) -> None:
    """A reboot resets every GPU and starts a new kernel log."""
    for gpu in prof.gpus:
        at_reset(gpu.index)
    log = kmsg()
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("", encoding="utf-8")

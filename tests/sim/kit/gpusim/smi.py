"""A simulated nvidia-smi: the query forms gpufleet uses, answered from the profile.

Output shapes follow what the real tool prints (CSV with ", " separators and unit
suffixes, `-L` lines, `-q -x` XML with the nvidia_smi_log root); the wording of
free-text messages is the real tool's where a caller may match on it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

from .profiles import Gpu, Profile

NO_DRIVER_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
NO_DRIVER_RC = 9


@dataclass(frozen=True)
class DriverView:
    """What the loaded driver reports."""

    version: str
    cuda_version: str
    persistence: bool


@dataclass(frozen=True)
class Field:
    unit: str | None
    value: Callable[[Gpu, DriverView, int], str]


def _enabled(flag: bool) -> str:
    return "Enabled" if flag else "Disabled"


def _mig_mode(gpu: Gpu) -> str:
    return _enabled(gpu.mig_enabled) if gpu.mig_capable else "[N/A]"


_FIELDS: dict[str, Field] = {
    "timestamp": Field(None, lambda g, d, n: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "driver_version": Field(None, lambda g, d, n: d.version),
    "count": Field(None, lambda g, d, n: str(n)),
    "index": Field(None, lambda g, d, n: str(g.index)),
    "name": Field(None, lambda g, d, n: g.product_name),
    "serial": Field(None, lambda g, d, n: g.serial),
    "uuid": Field(None, lambda g, d, n: g.uuid),
    "pci.bus_id": Field(None, lambda g, d, n: g.bus_id),
    "pci.domain": Field(None, lambda g, d, n: "0x0000"),
    "pci.bus": Field(None, lambda g, d, n: f"0x{g.bus.upper()}"),
    "pci.device": Field(None, lambda g, d, n: "0x00"),
    "pci.device_id": Field(None, lambda g, d, n: f"0x{g.device_id:04X}10DE"),
    "pci.sub_device_id": Field(None, lambda g, d, n: f"0x{g.subsystem_id:04X}10DE"),
    "vbios_version": Field(None, lambda g, d, n: g.vbios_version),
    "persistence_mode": Field(None, lambda g, d, n: _enabled(d.persistence)),
    "display_mode": Field(None, lambda g, d, n: "Disabled"),
    "compute_cap": Field(None, lambda g, d, n: g.compute_cap),
    "mig.mode.current": Field(None, lambda g, d, n: _mig_mode(g)),
    "mig.mode.pending": Field(None, lambda g, d, n: _mig_mode(g)),
    "memory.total": Field("MiB", lambda g, d, n: str(g.memory_mib)),
    "memory.reserved": Field("MiB", lambda g, d, n: str(_reserved(g))),
    "memory.used": Field("MiB", lambda g, d, n: "0"),
    "memory.free": Field("MiB", lambda g, d, n: str(g.memory_mib - _reserved(g))),
    "temperature.gpu": Field(None, lambda g, d, n: str(30 + g.index)),
    "utilization.gpu": Field("%", lambda g, d, n: "0"),
    "utilization.memory": Field("%", lambda g, d, n: "0"),
    "power.draw": Field("W", lambda g, d, n: f"{g.power_limit_w * 0.09:.2f}"),
    "power.limit": Field("W", lambda g, d, n: f"{g.power_limit_w:.2f}"),
    "clocks.sm": Field("MHz", lambda g, d, n: "345"),
}
_FIELDS["pstate"] = Field(None, lambda g, d, n: "P0")
_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
}


def _reserved(gpu: Gpu) -> int:
    return 0 if gpu.mig_enabled else min(1024, gpu.memory_mib // 64)


def _select(gpus: Sequence[Gpu], ids: str | None) -> list[Gpu] | None:
    if ids is None:
        return list(gpus)
    chosen = []
    for item in ids.split(","):
        item = item.strip()
        match = [g for g in gpus if item in (str(g.index), g.uuid, g.bus_id)]
        if not match:
            return None
        chosen.extend(match)
    return chosen


def query_gpu(gpus: Sequence[Gpu], driver: DriverView, query: str, fmt: str) -> tuple[str, int]:
    names = [n.strip() for n in query.split(",") if n.strip()]
    fields = []
    for name in names:
        canonical = _ALIASES.get(name, name)
        if canonical not in _FIELDS:
            return f'Field "{name}" is not a valid field to query.\n\n', 2
        fields.append((name, _FIELDS[canonical]))
    options = {o.strip() for o in fmt.split(",")}
    if "csv" not in options:
        return f'"{fmt}" is not a valid format.\n', 2
    lines = []
    if "noheader" not in options:
        lines.append(", ".join(f"{n} [{f.unit}]" if f.unit else n for n, f in fields))
    for gpu in gpus:
        cells = []
        for _, fld in fields:
            value = fld.value(gpu, driver, len(gpus))
            if fld.unit and "nounits" not in options:
                value = f"{value} {fld.unit}"
            cells.append(value)
        lines.append(", ".join(cells))
    return "\n".join(lines) + "\n", 0


def list_gpus(gpus: Sequence[Gpu]) -> str:
    lines = []
    for gpu in gpus:
        lines.append(f"GPU {gpu.index}: {gpu.product_name} (UUID: {gpu.uuid})")
        for mig in gpu.mig:
            lines.append(f"  MIG {mig.profile:<11} Device {mig.index:>2}: (UUID: {mig.uuid})")
    return "\n".join(lines) + ("\n" if lines else "")


def _x(tag: str, value: object, indent: int) -> str:
    return f"{chr(9) * indent}<{tag}>{escape(str(value))}</{tag}>"


def query_xml(gpus: Sequence[Gpu], driver: DriverView) -> str:
    out = [
        '<?xml version="1.0" ?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
        "<nvidia_smi_log>",
        _x("timestamp", time.strftime("%a %b %d %H:%M:%S %Y"), 1),
        _x("driver_version", driver.version, 1),
        _x("cuda_version", driver.cuda_version, 1),
        _x("attached_gpus", len(gpus), 1),
    ]
    for gpu in gpus:
        reserved = _reserved(gpu)
        out += [
            f'\t<gpu id="{gpu.bus_id}">',
            _x("product_name", gpu.product_name, 2),
            _x("product_brand", "NVIDIA" if gpu.model_key != "t4" else "Tesla", 2),
            _x("product_architecture", gpu.architecture, 2),
            _x("display_mode", "Disabled", 2),
            _x("display_active", "Disabled", 2),
            _x("persistence_mode", _enabled(driver.persistence), 2),
        ]
        if gpu.mig_capable:
            out += [
                "\t\t<mig_mode>",
                _x("current_mig", _enabled(gpu.mig_enabled), 3),
                _x("pending_mig", _enabled(gpu.mig_enabled), 3),
                "\t\t</mig_mode>",
            ]
        else:
            out += [
                "\t\t<mig_mode>",
                _x("current_mig", "N/A", 3),
                _x("pending_mig", "N/A", 3),
                "\t\t</mig_mode>",
            ]
        if gpu.mig:
            out.append("\t\t<mig_devices>")
            for mig in gpu.mig:
                out += [
                    "\t\t\t<mig_device>",
                    _x("index", mig.index, 4),
                    _x("gpu_instance_id", mig.index + 1, 4),
                    _x("compute_instance_id", 0, 4),
                    "\t\t\t\t<device_attributes>",
                    "\t\t\t\t\t<shared>",
                    _x("multiprocessor_count", mig.sm_count, 6),
                    "\t\t\t\t\t</shared>",
                    "\t\t\t\t</device_attributes>",
                    "\t\t\t\t<fb_memory_usage>",
                    _x("total", f"{mig.memory_mib} MiB", 5),
                    _x("used", "0 MiB", 5),
                    _x("free", f"{mig.memory_mib} MiB", 5),
                    "\t\t\t\t</fb_memory_usage>",
                    "\t\t\t</mig_device>",
                ]
            out.append("\t\t</mig_devices>")
        else:
            out.append(_x("mig_devices", "None", 2))
        out += [
            _x("accounting_mode", "Disabled", 2),
            _x("serial", gpu.serial, 2),
            _x("uuid", gpu.uuid, 2),
            _x("minor_number", gpu.index, 2),
            _x("vbios_version", gpu.vbios_version, 2),
            "\t\t<pci>",
            _x("pci_bus", gpu.bus.upper(), 3),
            _x("pci_device", "00", 3),
            _x("pci_domain", "0000", 3),
            _x("pci_device_id", f"{gpu.device_id:04X}10DE", 3),
            _x("pci_bus_id", gpu.bus_id, 3),
            _x("pci_sub_system_id", f"{gpu.subsystem_id:04X}10DE", 3),
            "\t\t</pci>",
            "\t\t<fb_memory_usage>",
            _x("total", f"{gpu.memory_mib} MiB", 3),
            _x("reserved", f"{reserved} MiB", 3),
            _x("used", "0 MiB", 3),
            _x("free", f"{gpu.memory_mib - reserved} MiB", 3),
            "\t\t</fb_memory_usage>",
            _x("compute_mode", "Default", 2),
            "\t\t<temperature>",
            _x("gpu_temp", f"{30 + gpu.index} C", 3),
            "\t\t</temperature>",
            "\t\t<gpu_power_readings>",
            _x("power_draw", f"{gpu.power_limit_w * 0.09:.2f} W", 3),
            _x("current_power_limit", f"{gpu.power_limit_w:.2f} W", 3),
            "\t\t</gpu_power_readings>",
            "\t</gpu>",
        ]
    out.append("</nvidia_smi_log>")
    return "\n".join(out) + "\n"


def summary(gpus: Sequence[Gpu], driver: DriverView) -> str:
    """The default table, abridged."""
    bar = "+" + "-" * 89 + "+"
    head = (
        f"| NVIDIA-SMI {driver.version:<19} Driver Version: {driver.version:<15}"
        f" CUDA Version: {driver.cuda_version:<9}|"
    )
    lines = [time.strftime("%a %b %d %H:%M:%S %Y"), bar, head, bar]
    for gpu in gpus:
        lines.append(
            f"| {gpu.index:>3}  {gpu.product_name:<30} "
            f"{'On' if driver.persistence else 'Off':>4} | {gpu.bus_id:>16} |"
            f" {gpu.memory_mib:>8}MiB total |"[:92].ljust(90)
            + "|"
        )
    lines.append(bar)
    return "\n".join(lines) + "\n"


def version_text(driver: DriverView) -> str:
    nvml = ".".join(driver.version.split(".")[:2])
    return (
        f"NVIDIA-SMI version  : {driver.version}\n"
        f"NVML version        : {nvml}\n"
        f"DRIVER version      : {driver.version}\n"
        f"CUDA Version        : {driver.cuda_version}\n"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nvidia-smi", add_help=False)
    parser.add_argument("-L", "--list-gpus", action="store_true")
    parser.add_argument("-q", "--query", action="store_true")
    parser.add_argument("-x", "--xml-format", action="store_true")
    parser.add_argument("-i", "--id")
    parser.add_argument("--query-gpu")
    parser.add_argument("--format")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("-h", "--help", action="store_true")
    return parser


def run(argv: Sequence[str], profile: Profile, driver: DriverView | None) -> tuple[str, str, int]:
    """Answer one nvidia-smi invocation: (stdout, stderr, exit code)."""
    if driver is None:
        return NO_DRIVER_MESSAGE + "\n", "", NO_DRIVER_RC
    try:
        args, unknown = _parser().parse_known_args(list(argv))
    except SystemExit:
        return "", "Invalid combination of input arguments.\n", 2
    if unknown:
        return (
            f"Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
            f"(gpusim does not simulate: {' '.join(unknown)})\n",
            "",
            2,
        )
    if args.help:
        return "NVIDIA System Management Interface (simulated by gpusim)\n", "", 0
    if args.version:
        return version_text(driver), "", 0
    gpus = _select(profile.gpus, args.id)
    if gpus is None:
        return "No devices were found\n", "", 6
    if not profile.gpus:
        return "No devices were found\n", "", 6
    if args.query_gpu:
        if not args.format:
            return "Please specify --format=csv when using --query-gpu.\n", "", 2
        out, rc = query_gpu(gpus, driver, args.query_gpu, args.format)
        return out, "", rc
    if args.list_gpus:
        return list_gpus(gpus), "", 0
    if args.query and args.xml_format:
        return query_xml(gpus, driver), "", 0
    if args.query:
        return "", "gpusim: plain -q is not simulated; use -q -x\n", 2
    return summary(gpus, driver), "", 0

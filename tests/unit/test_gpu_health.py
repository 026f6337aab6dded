# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU health signals (module_utils/gpu_health): NVML readings from --query-gpu rows, the
driver's Xid lines from the kernel log, the table of what each asks for and a site's
changes to it; on a real H200's output and on lines in the driver's documented formats."""

from __future__ import annotations

import re

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_health as gh
from ansible_collections.gpufleet.nvidia.plugins.module_utils import smi
from ansible_collections.gpufleet.nvidia.plugins.modules import gpu_facts
from conftest import FIXTURES, PROJECT

SMI = FIXTURES / "nvidia-smi"
H200 = "h200-580.159.04"


def _with_header(text: str) -> list[dict]:
    """Rows of `--format=csv` output (a header naming the fields, units in brackets)."""
    header, *lines = text.splitlines()
    fields = tuple(re.sub(r" \[.*\]$", "", f.strip()) for f in header.split(","))
    return smi.parse_query_csv("\n".join(lines), fields)


def test_a_real_healthy_h200_gives_no_signal():
    [row] = _with_header((SMI / f"{H200}.health.csv").read_text())
    assert row["clocks_event_reasons.active"] == "0x0000000000000001"  # idle, nothing else
    assert row["remapped_rows.pending"] == "No"
    assert gh.row_signals(row) == []
    # Its identity, as the real board gave it, goes with its health.
    assert gh.gpu_health([row], {}) == {
        "0000:00:06.0": {
            "action": "none",
            "signals": [],
            "uuid": "GPU-2a568e35-c02a-acb0-224e-4c1b7db0f729",
            "serial": "1653824161985",
        }
    }


def _row(**fields: str) -> dict:
    healthy = {
        "pci.bus_id": "00000000:3B:00.0",
        "ecc.errors.uncorrected.volatile.total": "0",
        "retired_pages.pending": "No",
        "clocks_throttle_reasons.active": "0x0000000000000001",
        "pcie.link.gen.current": "4",
        "pcie.link.gen.max": "4",
        "pcie.link.width.current": "16",
        "pcie.link.width.max": "16",
        "remapped_rows.pending": "No",
        "remapped_rows.failure": "No",
        "gpu_recovery_action": "None",
    }
    return healthy | {k.replace("__", "."): v for k, v in fields.items()}


def _kinds(row: dict, overrides=None) -> list[tuple[str, str]]:
    return [(s["kind"], s["action"]) for s in gh.row_signals(row, overrides)]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"retired_pages.pending": "Yes"}, [("retire-pending", "reset")]),
        ({"remapped_rows.pending": "Yes"}, [("remap-pending", "reset")]),
        ({"remapped_rows.failure": "Yes"}, [("remap-failure", "replace")]),
        ({"ecc.errors.uncorrected.volatile.total": "3"}, [("ecc-dbe", "watch")]),
        ({"gpu_recovery_action": "Reset"}, [("recovery-reset", "reset")]),
        ({"gpu_recovery_action": "Reboot"}, [("recovery-reboot", "reboot")]),
        ({"gpu_recovery_action": "Drain P2P"}, [("recovery-drain-p2p", "watch")]),
        ({"gpu_recovery_action": "Drain and Reset"}, [("recovery-drain-reset", "reset")]),
        ({"gpu_recovery_action": "Recover IMEX domain"}, [("recovery-other", "watch")]),
        # HW slowdown (0x8), HW thermal (0x40), power brake (0x80); SW power cap (0x4) none
        (
            {"clocks_throttle_reasons.active": "0x00000000000000CC"},
            [
                ("hw-slowdown", "watch"),
                ("hw-thermal-slowdown", "watch"),
                ("hw-power-brake", "watch"),
            ],
        ),
        ({"pcie.link.width.current": "8"}, [("pcie-width", "watch")]),
        # An idle GPU's link drops its generation to save power: not a signal.
        ({"pcie.link.gen.current": "1"}, []),
        (
            {"pcie.link.gen.current": "1", "clocks_throttle_reasons.active": "0x0"},
            [("pcie-gen", "watch")],
        ),
        # What a driver does not answer says nothing.
        ({k: "[N/A]" for k in gh.HEALTH_FIELDS + gh.NEWER_FIELDS}, []),
    ],
)
def test_readings_become_signals(fields, expected):
    row = _row()
    row.update({k: smi._value(v) for k, v in fields.items()})
    assert _kinds(row) == expected


def test_a_sites_override_changes_one_signals_action():
    row = _row(remapped_rows__pending="Yes", pcie__link__width__current="4")
    assert _kinds(row, {"remap-pending": "reboot", "pcie-width": "none"}) == [
        ("remap-pending", "reboot"),
        ("pcie-width", "none"),
    ]
    detail = gh.row_signals(row)[1]["detail"]
    assert detail == "the PCIe link runs narrower than the GPU's maximum: x4 of x16"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"xid:79": "panic"},
            "'xid:79': 'panic' is not one of none, watch, reset, reboot, replace",
        ),
        ({"xid79": "reset"}, "'xid79' is neither a signal"),
        ({"ecc": "reset"}, "'ecc' is neither a signal"),
    ],
)
def test_bad_overrides_are_named(overrides, message):
    with pytest.raises(gh.HealthInputError, match=re.escape(message)):
        gh.check_overrides(overrides)


def test_worst_orders_the_actions():
    assert gh.worst([]) == "none"
    assert gh.worst(["watch", "replace", "reset"]) == "replace"
    assert gh.worst(["reboot", "reset", "none"]) == "reboot"


@pytest.mark.parametrize(
    "line",
    [
        "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  "
        "Reboot the system to recover this GPU",
        "Unable to determine the device handle for GPU00000000:3B:00.0: Unknown Error",
    ],
)
def test_a_gpu_nvidia_smi_cannot_open_is_lost(line):  # named by its PCI bus id
    text, unreachable = gh.split_unreachable(f"{line}\n0, 00000000:5E:00.0\n")
    assert text == "0, 00000000:5E:00.0"
    [(address, reason)] = unreachable.items()
    assert address == "0000:3b:00.0"
    health = gh.gpu_health([], unreachable)
    assert health[address]["action"] == "reboot"
    assert health[address]["signals"][0]["detail"].endswith(reason)


def test_a_gpu_named_by_its_index_is_placed_in_pci_bus_order():
    line = "Unable to determine the device handle for GPU1: GPU is lost.  Reboot the system"
    text, unreachable = gh.split_unreachable(line)
    assert (text, unreachable) == ("", {"index:1": "GPU is lost.  Reboot the system"})
    health = gh.gpu_health([], unreachable, None, ["0000:af:00.0", "0000:3b:00.0"])
    assert list(health) == ["0000:af:00.0"]  # the second in bus order
    assert health["0000:af:00.0"]["action"] == "reboot"


# --- the driver's Xid lines -------------------------------------------------------------
# In the formats of the driver's own format string (open-gpu-kernel-modules, kernel_rc.c):
# "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s"; drivers before it wrote
# neither pid nor name, and older ones no "PCI:".


def test_xid_lines_in_every_form_are_read():
    log = "\n".join(
        [
            # /dev/kmsg records: "prio,seq,usec,flags;message", then " KEY=value" lines
            "4,2210,412000000,-;NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, "
            "Ch 00000001 caused by previous Xid 149",
            " SUBSYSTEM=pci",
            "4,2211,412000100,-;NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', "
            "name=<unknown>, GPU has fallen off the bus.",
            # dmesg lines, older drivers
            "[ 8812.113] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus",
            "[ 9000.000] NVRM: Xid (0000:03:00): 14, Channel 00000001",
            # a MIG GPU instance
            "4,2300,500000000,-;NVRM: Xid (PCI:0000:af:00 GPU-I:02 GPU-CI:00): 31, pid=77, "
            "name=train, Ch 00000008, intr 00000000. MMU Fault",
            "6,2301,500000001,-;NVRM: GPU at PCI:0000:af:00: GPU-0b8d4c1e",
        ]
    )
    events = gh.parse_kmsg(log)
    assert [
        (e["seq"], e["pci_address"], e["xid"], e["pid"], e["process"], e["mig"], e["action"])
        for e in events
    ] == [
        (2210, "0000:dc:00.0", 45, "1818990", "python3", None, "none"),
        (2211, "0000:05:00.0", 79, "<unknown>", "<unknown>", None, "reboot"),
        (None, "0000:44:00.0", 79, None, None, None, "reboot"),
        (None, "0000:03:00.0", 14, None, None, None, "watch"),  # not in the table
        (2300, "0000:af:00.0", 31, "77", "train", "GPU-I:02 GPU-CI:00", "none"),
    ]
    assert events[1]["message"] == "GPU has fallen off the bus."
    assert events[1]["usec"] == 412000100
    assert events[3]["meaning"] == "an Xid this table does not list"


@pytest.mark.parametrize(
    ("said", "action"),
    [
        ("GPU Reset Required", "reset"),
        ("Drain and Reset", "reset"),
        ("Node Reboot Required", "reboot"),
        ("None", "none"),
        ("Something New", "watch"),
    ],
)
def test_xid_154_asks_for_the_recovery_action_it_names(said, action):
    line = (
        "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) "
        f"to 0x1 ({said})"
    )
    [event] = gh.parse_kmsg(line)
    assert (event["pci_address"], event["action"]) == ("0008:01:00.0", action)
    assert said in event["meaning"]


def test_a_sites_override_changes_an_xids_action():
    line = "NVRM: Xid (PCI:0000:3b:00): 74, pid=1, name=x, NVLink: fatal error detected on link 2"
    assert gh.parse_kmsg(line)[0]["action"] == "reset"
    assert gh.parse_kmsg(line, {"xid:74": "replace"})[0]["action"] == "replace"


def test_a_real_h200s_driver_lines_hold_no_xid():
    text = (SMI / f"{H200}.dmesg.txt").read_text()
    assert "NVRM:" in text
    assert gh.parse_kmsg(text) == []


def test_the_kernel_log_is_read_to_its_end_and_a_missing_one_said(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("4,1,2,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=a, DBE\n")
    text, error = gh.read_kernel_log(str(log))
    assert (error, [e["xid"] for e in gh.parse_kmsg(text)]) == (None, [48])
    assert gh.read_kernel_log(str(tmp_path / "none")) == (
        None,
        f"cannot read {tmp_path / 'none'}: No such file or directory",
    )


# --- the table of record and its page -------------------------------------------------


def _doc_rows(heading: str) -> dict[str, str]:
    """{first column: second column} of the table under `heading` in docs/health.md."""
    text = (PROJECT / "docs" / "health.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip(" `") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[1] in gh.ACTIONS:
            rows[cells[0]] = cells[1]
    return rows


def test_the_docs_table_is_the_codes_table():
    assert _doc_rows("Signals from NVML") == {k: a for k, (a, _) in gh.SIGNALS.items()}
    xids = {str(k): a for k, (a, _) in gh.XIDS.items() if not 144 <= k <= 150}
    xids["144\N{EN DASH}150"] = "reset"
    # Xid 154's row says "as its text names" (test_xid_154_...), so it is not read here.
    assert _doc_rows("Xid events") == xids | {"other": "watch"}
    for action, meaning in [*gh.SIGNALS.values(), *gh.XIDS.values()]:
        assert action in gh.ACTIONS and meaning


def test_gpu_facts_reads_the_kernel_log_only_when_asked(monkeypatch):
    """The stages read the facts for the GPUs' identity and driver (kernel_log: false);
    the facts play and the probe read the Xid events."""
    reads = []
    monkeypatch.setattr(gh, "read_kernel_log", lambda: reads.append(1) or ("", None))
    gpus = [{"pci_address": "0000:3b:00.0"}]
    skipped = gpu_facts._health([], {}, gpus, {}, True, kernel_log=False)
    assert (skipped["xid_events"], reads) == (None, [])
    read = gpu_facts._health([], {}, gpus, {}, True)
    assert (read["xid_events"], reads) == ([], [1])


def test_a_real_h100s_answer_to_the_health_query_is_one_call_and_no_signal():
    """The query the probe and gpu_facts make, as driver 580.159.04 answered it on a
    real H100 80GB HBM3 (the newer fields included: one nvidia-smi call)."""
    text = (SMI / "h100-80gb-hbm3-580.159.04.health-query.csv").read_text()
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, text, ""

    rows, unreachable, error = gh.query(run, "nvidia-smi", smi.QUERY_FIELDS)
    assert (len(calls), unreachable, error) == (1, {}, None)
    [row] = rows
    assert (row["name"], row["gpu_recovery_action"]) == ("NVIDIA H100 80GB HBM3", "None")
    assert gh.gpu_health(rows, unreachable) == {
        "0000:00:06.0": {
            "action": "none",
            "signals": [],
            "uuid": "GPU-b43c57e7-cc2b-1cae-51e7-e52cd295a5db",
        }
    }


def _documented_fields(help_text: str) -> set[str]:
    """The field names a `--help-query-…` text lists: quoted at the start of a line,
    aliases after `or` (`"name" or "gpu_name"`)."""
    return {
        name
        for line in help_text.splitlines()
        if line.startswith('"')
        for name in re.findall(r'"([^"]+)"', line)
    }


def test_every_field_we_query_is_one_a_real_580_nvidia_smi_documents():
    """nvidia-smi refuses a whole query for one unknown field (rc 2), so a misspelt
    field would cost every node its facts; the names are checked against the list a
    real H200's driver 580.159.04 printed (`--help-query-gpu`,
    `--help-query-remapped-rows`)."""
    gpu = _documented_fields((SMI / f"{H200}.help-query-gpu.txt").read_text())
    asked = {*smi.QUERY_FIELDS, *gh.HEALTH_FIELDS, *gh.NEWER_FIELDS, *gh.IDENTITY_FIELDS}
    assert len(gpu) > 100 and asked | set(gh.FLAGS) <= gpu, sorted(asked - gpu)
    remapped = _documented_fields((SMI / f"{H200}.help-query-remapped-rows.txt").read_text())
    fields = gh._REMAPPED_QUERY[0].split("=", 1)[1].split(",")
    assert set(fields) <= remapped, sorted(set(fields) - remapped)
    # A field a newer driver renamed would show here first: 580 knows both spellings.
    assert {"clocks_throttle_reasons.active", "clocks_event_reasons.active"} <= gpu

"""gpu_facts' nvidia-smi parsers against hand-written outputs of several GPU models."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import smi
from conftest import FIXTURES

SMI = FIXTURES / "nvidia-smi"


@pytest.mark.parametrize(
    ("fixture", "count", "name", "memory", "compute", "mig"),
    [
        ("h100-sxm-8.csv", 8, "NVIDIA H100 80GB HBM3", 81559, "9.0", False),
        ("a100-pcie-2.csv", 2, "NVIDIA A100-PCIE-40GB", 40960, "8.0", False),
        ("a100-mig.csv", 2, "NVIDIA A100-SXM4-40GB", 40960, "8.0", True),
        ("t4-1.csv", 1, "Tesla T4", 15360, "7.5", None),
        ("l4-1.csv", 1, "NVIDIA L4", 23034, "8.9", None),
    ],
)
def test_query_csv_rows(fixture, count, name, memory, compute, mig):
    rows = smi.parse_query_csv((SMI / fixture).read_text())
    assert len(rows) == count
    assert [r["index"] for r in rows] == list(range(count))
    for row in rows:
        assert row["name"] == name
        assert row["memory.total"] == memory
        assert row["compute_cap"] == compute
        # "[N/A]" (a GPU without MIG) is reported as unknown, not as disabled.
        assert row["mig.mode.current"] is mig
        assert row["uuid"].startswith("GPU-")


def test_query_csv_rejects_a_row_with_missing_fields():
    with pytest.raises(smi.SmiParseError, match="line 1: expected 9 values, got 3"):
        smi.parse_query_csv("0, Tesla T4, GPU-x\n")


def test_query_xml_reads_mig_devices():
    facts = smi.parse_query_xml((SMI / "a100-mig.xml").read_text())
    assert facts["driver_version"] == "535.261.03"
    assert facts["cuda_version"] == "12.2"
    gpu = facts["gpus"][0]
    assert gpu["mig_mode"] is True
    assert [m["memory_mib"] for m in gpu["mig_devices"]] == [19968, 19968]
    assert [m["gpu_instance_id"] for m in gpu["mig_devices"]] == [1, 2]
    assert gpu["pci_bus_id"] == "00000000:07:00.0"


def test_query_xml_without_mig():
    facts = smi.parse_query_xml((SMI / "t4-1.xml").read_text())
    gpu = facts["gpus"][0]
    assert gpu["mig_mode"] is None  # "N/A": the T4 cannot do MIG
    assert gpu["mig_devices"] == []
    assert gpu["memory_mib"] == 15360
    assert gpu["persistence_mode"] is False
    assert gpu["minor_number"] == 0  # /dev/nvidia0


def test_query_xml_without_minor_number():
    # The A100 fixture leaves <minor_number> out: unknown, not 0.
    facts = smi.parse_query_xml((SMI / "a100-mig.xml").read_text())
    assert facts["gpus"][0]["minor_number"] is None


def test_query_xml_rejects_other_documents():
    with pytest.raises(smi.SmiParseError, match="unexpected root"):
        smi.parse_query_xml("<html/>")
    with pytest.raises(smi.SmiParseError, match="not XML"):
        smi.parse_query_xml("NVIDIA-SMI has failed")

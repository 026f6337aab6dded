# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_facts' nvidia-smi parsers against hand-written outputs of several GPU models and
the real output of an H100 (fixtures/nvidia-smi/README.md says which is which); and the
simulation's H100 held against that real output."""

from __future__ import annotations

import re

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import (
    discovery,
    gpu_models,
    mig_profiles,
    pci,
    smi,
)
from conftest import FIXTURES, PROFILE_DIR, real_smi_outputs
from gpusim import node, profiles

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


# --- a real H100 80GB HBM3, driver 580.159.04, MIG disabled (captured 2026-11-25) -------

H100 = "h100-80gb-hbm3-580.159.04"
H100_UUID = "GPU-745ac654-e324-cccd-4e8c-6628107301a3"
H100_BUS_ID = "00000000:00:06.0"
# `nvidia-smi mig -lgip`: a profile's first row, then its CE, JPEG and OFA on the next.
_LGIP_ROW = re.compile(
    r"^\|\s+\d+\s+MIG (\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)\s+\|\n"
    r"\|\s+(\d+)\s+(\d+)\s+(\d+)\s+\|$",
    re.MULTILINE,
)


def _real(suffix: str) -> str:
    return (SMI / f"{H100}.{suffix}").read_text()


def _lgip(text: str) -> list[tuple[str, int, int, str, int, int, int, int, int, int]]:
    """(name, id, total instances, memory GiB as printed, SM, DEC, ENC, CE, JPEG, OFA)."""
    return [
        (m[0], int(m[1]), int(m[3]), m[4], *(int(v) for v in m[5:]))
        for m in _LGIP_ROW.findall(text)
    ]


def _placement_table_knows(device_id: int, rows) -> None:
    """Our placement table for `device_id` offers the profiles a real board's `mig -lgip`
    `rows` list, and as many of each fit on an empty board as the board says."""
    model = mig_profiles.MODELS[device_id]
    assert sorted(model.profiles) == sorted(name for name, *_ in rows)
    for name, _, total, *_ in rows:
        assert model.geometry.shapes[model.profiles[name]].instances == total, name
        assert mig_profiles.placement(model, {name: total}) is not None, name


def test_real_h100_query_csv():
    assert smi.parse_query_csv(_real("csv")) == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": H100_UUID,
            "pci.bus_id": H100_BUS_ID,
            "memory.total": 81559,
            "driver_version": "580.159.04",
            "persistence_mode": True,
            "mig.mode.current": False,  # "Disabled": capable of MIG, not in it
            "compute_cap": "9.0",
        }
    ]


def test_real_h100_query_xml():
    facts = smi.parse_query_xml(_real("xml"))
    assert (facts["driver_version"], facts["cuda_version"], facts["attached_gpus"]) == (
        "580.159.04",
        "13.0",
        1,
    )
    assert facts["gpus"] == [
        {
            "index": 0,
            "product_name": "NVIDIA H100 80GB HBM3",
            "product_architecture": "Hopper",
            "uuid": H100_UUID,
            "minor_number": 0,
            "serial": "1652724067652",
            "pci_bus_id": H100_BUS_ID,
            "memory_mib": 81559,
            "persistence_mode": True,
            "mig_mode": False,
            "mig_mode_pending": False,
            # <mig_devices> holds "None" between a newline and indentation.
            "mig_devices": [],
            "vbios_version": "96.00.DA.00.0C",
        }
    ]


def test_real_h100_list_names_the_gpu_and_no_mig_devices():
    listed = smi.parse_list(_real("L.txt"))
    assert listed == {H100_UUID: []}
    facts = smi.parse_query_xml(_real("xml"))
    smi.name_mig_devices(facts, listed)  # -L and -q -x agree: no MIG devices
    assert facts["gpus"][0]["mig_devices"] == []


def test_real_h100_becomes_gpu_facts_and_labels():
    gpu = pci.PciDevice(H100_BUS_ID[4:], 0x10DE, 0x2330, 0x030200, -1, "nvidia", tuple(range(16)))
    gpus = discovery.gpu_list(
        [gpu], smi.parse_query_csv(_real("csv")), smi.parse_query_xml(_real("xml"))
    )
    facts = gpus[0]
    assert (facts["name"], facts["name_source"], facts["uuid"]) == (
        "NVIDIA H100 80GB HBM3",
        "nvml",
        H100_UUID,
    )
    assert (facts["memory_mib"], facts["compute_major"], facts["compute_minor"]) == (81559, 9, 0)
    assert (facts["family"], facts["minor_number"], facts["persistence_mode"]) == (
        "hopper",
        0,
        True,
    )
    assert (facts["mig_mode"], facts["mig_mode_pending"], facts["mig_devices"]) == (
        False,
        False,
        [],
    )
    driver = discovery.driver_facts(_real("sys-module-version.txt").strip(), None, None)
    labels = discovery.labels(gpus, driver, "13.0")
    assert {k.removeprefix("nvidia.com/"): v for k, v in labels.items()} == {
        "gpu.present": "true",
        "gpu.count": "1",
        "gpu.product": "NVIDIA-H100-80GB-HBM3",
        "gpu.memory": "81559",
        "gpu.family": "hopper",
        "gpu.compute.major": "9",
        "gpu.compute.minor": "0",
        "mig.capable": "true",
        "cuda.driver-version.full": "580.159.04",
        "cuda.driver-version.major": "580",
        "cuda.driver-version.minor": "159",
        "cuda.driver-version.revision": "04",
        "cuda.runtime-version.full": "13.0",
        "cuda.runtime-version.major": "13",
        "cuda.runtime-version.minor": "0",
    }


def test_real_h100_mig_profiles_are_those_our_placement_table_knows():
    rows = _lgip(_real("mig-lgip.txt"))
    assert [(name, profile_id, total) for name, profile_id, total, *_ in rows] == [
        ("1g.10gb", 19, 7),
        ("1g.10gb+me", 20, 1),
        ("1g.20gb", 15, 4),
        ("2g.20gb", 14, 3),
        ("3g.40gb", 9, 2),
        ("4g.40gb", 5, 1),
        ("7g.80gb", 0, 1),
    ]
    _placement_table_knows(0x2330, rows)


def test_simulated_h100_offers_the_real_boards_mig_profiles():
    """models.yaml's H100 profiles, as the mock NVML hands them to nvidia-smi, print as
    the real board's `nvidia-smi mig -lgip` rows (memory in GiB with two decimals)."""
    gpu = profiles.load(PROFILE_DIR, "h100-sxm-8", "node-a").gpus[0]
    units = ("sm_count", "decoders", "encoders", "copy_engines", "jpeg", "ofa")
    simulated = [
        (p.name, p.id, p.instances, f"{p.memory_mib / 1024:.2f}", *(getattr(p, u) for u in units))
        for p in gpu.mig_profiles
    ]
    assert sorted(simulated) == sorted(_lgip(_real("mig-lgip.txt")))


def test_simulated_h100_reads_back_as_the_real_one():
    """Debian's nvidia-smi on the mock NVML, for the h100-sxm-8 profile, gives our parsers
    what the real H100 gave them (less what differs per board: UUID, serial, bus id)."""
    csv_out, xml_out, listed = real_smi_outputs("h100-sxm-8", "node-a")
    sim_row, real_row = smi.parse_query_csv(csv_out)[0], smi.parse_query_csv(_real("csv"))[0]
    same = ("name", "memory.total", "mig.mode.current", "compute_cap")
    assert {k: sim_row[k] for k in same} == {k: real_row[k] for k in same}
    bus_id = re.compile(r"^0{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
    assert bus_id.match(sim_row["pci.bus_id"]) and bus_id.match(real_row["pci.bus_id"])
    sim_gpu = smi.parse_query_xml(xml_out)["gpus"][0]
    real_gpu = smi.parse_query_xml(_real("xml"))["gpus"][0]
    same = ("product_name", "product_architecture", "minor_number", "memory_mib", "mig_mode")
    assert {k: sim_gpu[k] for k in same} == {k: real_gpu[k] for k in same}
    assert (sim_gpu["mig_mode_pending"], sim_gpu["mig_devices"]) == (False, [])
    assert sim_gpu["pci_bus_id"] == sim_row["pci.bus_id"]
    assert len(sim_gpu["serial"]) == len(real_gpu["serial"]) == 13
    assert smi.parse_list(listed)[sim_row["uuid"]] == []


def test_simulated_mig_minors_number_capabilities_as_the_real_driver():
    real = _real("mig-minors.head.txt").splitlines()  # config, monitor, GPU 0's
    prof = profiles.load(PROFILE_DIR, "h100-sxm-8", "node-a")
    assert node.mig_minors(prof).splitlines()[: len(real)] == real
    # A 1g.10gb in GPU instance 1, compute instance 0, on /dev/nvidia0.
    gpus = [{"minor_number": 0, "mig_devices": [{"gpu_instance_id": 1, "compute_instance_id": 0}]}]
    discovery.mig_cap_files(gpus, _real("mig-minors.head.txt"))
    assert gpus[0]["mig_devices"][0]["cap_files"] == [
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
    ]


# --- a real H200, driver 580.159.04, MIG disabled (captured 2026-11-26) ----------------

H200 = "h200-580.159.04"


def _h200(suffix: str) -> str:
    return (SMI / f"{H200}.{suffix}").read_text()


def test_real_h200_reads_as_an_h200_and_its_labels():
    [row] = smi.parse_query_csv(_h200("csv"))
    assert (row["name"], row["memory.total"], row["compute_cap"], row["mig.mode.current"]) == (
        "NVIDIA H200",
        143771,
        "9.0",
        False,
    )
    xml = smi.parse_query_xml(_h200("xml"))
    assert (xml["driver_version"], xml["cuda_version"]) == ("580.159.04", "13.0")
    assert smi.parse_list(_h200("L.txt")) == {row["uuid"]: []}
    gpu = pci.PciDevice("0000:00:06.0", 0x10DE, 0x2335, 0x030200, -1, "nvidia", tuple(range(16)))
    [facts] = discovery.gpu_list([gpu], [row], xml)
    # The id table names it as the driver does, for nodes whose driver is not loaded.
    model = gpu_models.lookup(0x2335)
    assert (model.name, model.memory_mib) == (facts["name"], facts["memory_mib"])
    assert facts["family"] == "hopper"
    driver = discovery.driver_facts("580.159.04", None, None)
    labels = discovery.labels([facts], driver, "13.0")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/mig.capable"] == "true"


def test_real_h200_mig_profiles_are_those_our_placement_table_knows():
    rows = _lgip(_h200("mig-lgip.txt"))
    assert [name for name, *_ in rows] == [
        "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
    ]  # fmt: skip
    _placement_table_knows(0x2335, rows)


def test_real_h200_held_by_a_process_lists_it():
    """`-q -x` while a CUDA process held the GPU: our parser reads the GPU the same."""
    held = smi.parse_query_xml(_h200("busy.xml"))["gpus"][0]
    idle = smi.parse_query_xml(_h200("xml"))["gpus"][0]
    assert held == idle
    assert "<process_name>python3</process_name>" in _h200("busy.xml")

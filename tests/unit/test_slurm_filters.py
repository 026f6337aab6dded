"""Slurm's view of a node's GPUs: gres.conf entries and the slurm.conf Gres= value from
the facts, and the reading of what slurmd and scontrol print (real Slurm 22.05 output,
tests/unit/fixtures/slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.filter.slurm import (
    slurm_gres,
    slurm_gres_counts,
    slurm_gres_listed,
    slurm_gres_spec,
    slurm_node,
)
from ansible_collections.gpufleet.nvidia.plugins.filter.summary import stages_not_passed

SLURM = Path(__file__).parent / "fixtures" / "slurm"


def _gpu(name: str, minor: int | None, **more: object) -> dict[str, object]:
    return {"name": name, "minor_number": minor, "pci_address": f"0000:{minor}:00.0", **more}


def test_types_follow_slurms_autodetect_naming_unless_the_site_names_them():
    gpus = [_gpu("Tesla T4", 0), _gpu("NVIDIA H100 80GB HBM3", 1)]
    assert [e["type"] for e in slurm_gres(gpus)] == ["tesla_t4", "nvidia_h100_80gb_hbm3"]
    assert [e["type"] for e in slurm_gres(gpus, {"Tesla T4": "t4"})] == [
        "t4",
        "nvidia_h100_80gb_hbm3",
    ]


def test_each_gpu_is_its_device_file_by_minor_number_not_index():
    gpus = [_gpu("NVIDIA A100-PCIE-40GB", 3), _gpu("NVIDIA A100-PCIE-40GB", 1)]
    assert [(e["gpu"], e["file"]) for e in slurm_gres(gpus)] == [
        (0, "/dev/nvidia3"),
        (1, "/dev/nvidia1"),
    ]


@pytest.mark.parametrize(
    ("gpu", "words"),
    [
        (_gpu("Tesla T4", None), "GPU 0 (0000:None:00.0): the driver reported no minor number"),
        ({"minor_number": 0, "pci_address": "0000:41:00.0"}, "GPU 0 (0000:41:00.0): the facts"),
    ],
)
def test_a_gpu_the_facts_cannot_place_is_named(gpu, words):
    with pytest.raises(
        AnsibleFilterError, match=r"^" + words.replace("(", r"\(").replace(")", r"\)")
    ):
        slurm_gres([gpu])


def test_mig_mode_is_marked():
    entries = slurm_gres([_gpu("NVIDIA A100-PCIE-40GB", 0, mig_mode=True), _gpu("Tesla T4", 1)])
    assert [e["mig"] for e in entries] == [True, False]


def test_the_slurm_conf_value_counts_each_type_in_order():
    gpus = [_gpu("Tesla T4", 0), _gpu("NVIDIA L4", 1), _gpu("Tesla T4", 2)]
    assert slurm_gres_spec(slurm_gres(gpus)) == "gpu:tesla_t4:2,gpu:nvidia_l4:1"
    assert slurm_gres_spec([]) == ""


@pytest.mark.parametrize(
    ("value", "counts"),
    [
        ("gpu:tesla_t4:1", {"tesla_t4": 1}),
        ("gpu:tesla_t4:1(S:0),gpu:a100:2(S:0-1)", {"tesla_t4": 1, "a100": 2}),
        ("gpu:2,shard:8", {"": 2}),
        ("gpu", {"": 1}),
        ("(null)", {}),
        ("", {}),
    ],
)
def test_gres_values_as_slurm_writes_them(value, counts):
    assert slurm_gres_counts(value) == counts


def test_what_slurmd_reads_from_gres_conf():
    listed = slurm_gres_listed((SLURM / "slurmd-G-t4.txt").read_text())
    assert listed == [{"type": "tesla_t4", "file": "/dev/nvidia0"}]
    # Before slurm.conf declares the GPU, slurmd ignores it and lists nothing.
    assert slurm_gres_listed((SLURM / "slurmd-G-undeclared.txt").read_text()) == []


def test_a_node_as_scontrol_reports_it():
    idle = slurm_node((SLURM / "scontrol-node-idle.txt").read_text())
    assert (idle["NodeName"], idle["State"], idle["Gres"]) == ("slt-t4", "IDLE", "gpu:tesla_t4:1")
    assert "Reason" not in idle
    invalid = slurm_node((SLURM / "scontrol-node-invalid.txt").read_text())
    assert invalid["State"] == "UNKNOWN+DRAIN+INVALID_REG"
    assert invalid["Reason"] == (
        "gres/gpu count reported lower than configured (0 < 1) [slurm@2026-11-24T22:21:00]"
    )
    assert slurm_node("Node slt-x not found\n") == {}


def test_stages_that_ran_and_did_not_pass():
    hostvars = {
        "driver_stage": {"status": "unmanaged", "validated": True},
        "toolkit_stage": {"status": "ready"},
        "validator_stage": {"status": "failed"},
        "exporter_stage": {"status": "failed"},
    }
    # mig and runtime_config did not run: not counted; exporter is not asked about.
    assert stages_not_passed(
        hostvars, ["driver", "mig", "toolkit", "runtime_config", "validator"]
    ) == ["validator failed"]
    with pytest.raises(ValueError, match="unknown stage"):
        stages_not_passed(hostvars, ["validation"])

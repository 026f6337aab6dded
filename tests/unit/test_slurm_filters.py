# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Slurm's view of a node's GPUs: gres.conf entries and the slurm.conf Gres= value from
the facts, and the reading of what slurmd and scontrol print (real Slurm 22.05 output,
tests/unit/fixtures/slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.filter.slurm import (
    slurm_autodetect_differences,
    slurm_gres,
    slurm_gres_counts,
    slurm_gres_listed,
    slurm_gres_spec,
    slurm_gres_type,
    slurm_mig_type,
    slurm_node,
    slurm_node_line,
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


def _mig(index: int, gi: int, profile: str, *caps: int) -> dict[str, object]:
    files = [f"/dev/nvidia-caps/nvidia-cap{minor}" for minor in caps]
    return {"index": index, "gpu_instance_id": gi, "profile": profile, "cap_files": files}


def test_mig_devices_are_their_own_types_with_their_gpu_and_capability_files():
    a100 = _gpu(
        "NVIDIA A100-SXM4-40GB",
        2,
        mig_mode=True,
        mig_devices=[_mig(0, 1, "3g.20gb", 21, 22), _mig(1, 2, "1c.3g.20gb", 30, 31)],
    )
    entries = slurm_gres([a100, _gpu("Tesla T4", 1)])
    assert [(e["type"], e["file"], e["mig"]) for e in entries] == [
        (
            "nvidia_a100_3g.20gb",
            "/dev/nvidia2,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22",
            "3g.20gb",
        ),
        (
            "nvidia_a100_1c.3g.20gb",
            "/dev/nvidia2,/dev/nvidia-caps/nvidia-cap30,/dev/nvidia-caps/nvidia-cap31",
            "1c.3g.20gb",
        ),
        ("tesla_t4", "/dev/nvidia1", ""),
    ]
    assert slurm_gres_spec(entries) == (
        "gpu:nvidia_a100_3g.20gb:1,gpu:nvidia_a100_1c.3g.20gb:1,gpu:tesla_t4:1"
    )
    # The site's name for the model stands in for the cut name.
    named = slurm_gres([a100], {"NVIDIA A100-SXM4-40GB": "a100"})
    assert [e["type"] for e in named] == ["a100_3g.20gb", "a100_1c.3g.20gb"]


def test_a_gpu_in_mig_mode_without_mig_devices_has_no_entry():
    assert slurm_gres([_gpu("NVIDIA A100-PCIE-40GB", 0, mig_mode=True, mig_devices=[])]) == []


def test_a_mig_device_without_its_capability_files_is_named():
    a100 = _gpu("NVIDIA A100-PCIE-40GB", 0, mig_mode=True, mig_devices=[_mig(4, 1, "3g.20gb")])
    with pytest.raises(AnsibleFilterError, match=r"^GPU 0 \(0000:0:00.0\): MIG device 4 has no"):
        slurm_gres([a100])


@pytest.mark.parametrize(
    ("local", "count", "cores"),
    [
        ([0, 1, 2, 3], 8, "0-3"),
        ([4, 5, 6, 7, 12], 16, "4-7,12"),
        ([1], 2, "1"),
        ([0, 1], 2, ""),  # every core: Slurm is best left free to choose
        ([], 8, ""),  # sysfs did not say
        ([0, 1], 0, ""),  # the node's cores unknown
    ],
)
def test_cores_name_the_cores_near_the_gpu_when_they_are_not_all(local, count, cores):
    a100 = _gpu("NVIDIA A100-PCIE-40GB", 0, local_cores=local)
    assert [e["cores"] for e in slurm_gres([a100], None, count)] == [cores]
    mig = {**a100, "mig_mode": True, "mig_devices": [_mig(0, 1, "7g.40gb", 3, 4)]}
    assert [e["cores"] for e in slurm_gres([mig], None, count)] == [cores]


@pytest.mark.parametrize(
    ("local", "count", "per_socket", "cores"),
    [
        ([0], 2, 2, ""),  # one socket of two cores: the whole node
        ([1], 4, 2, "0-1"),  # the socket of core 1, of two sockets of two
        ([2, 3], 4, 2, "2-3"),
        ([8, 9, 10], 32, 16, "0-15"),  # a NUMA node that is part of socket 0
        ([16], 32, 16, "16-31"),
        ([14, 15, 16], 32, 16, ""),  # cores in two sockets: no one socket is near
    ],
)
def test_cores_are_whole_sockets_for_slurm_24_11(local, count, per_socket, cores):
    # Slurm 24.11 and newer refuse the node (INVALID_REG) whose Cores= hold part of a
    # socket; 25.11 also one of several sockets but not every core.
    refused = slurm_node((SLURM / "scontrol-node-24.11-socket-boundaries.txt").read_text())
    assert "doesn't match socket boundaries" in refused["Reason"]
    a100 = _gpu("NVIDIA A100-PCIE-40GB", 0, local_cores=local)
    assert [e["cores"] for e in slurm_gres([a100], None, count, per_socket)] == [cores]


def test_cores_are_on_every_line_or_on_none():
    near = [[0, 1], [2, 3], [0, 1, 2, 3], []]
    gpus = [_gpu("Tesla T4", minor, local_cores=cores) for minor, cores in enumerate(near)]
    # A GPU near every core, or whose cores are unknown, gets all of them when another
    # has some (slurmctld warns of a node whose GRES name cores only in part).
    assert [e["cores"] for e in slurm_gres(gpus, None, 4)] == ["0-1", "2-3", "0-3", "0-3"]
    # A core Slurm does not count (slurmd -C says fewer): the numbering is not Slurm's.
    assert [e["cores"] for e in slurm_gres(gpus[:2], None, 3)] == ["", ""]


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
    assert listed == [{"type": "tesla_t4", "file": "/dev/nvidia0", "cores": ""}]
    # Before slurm.conf declares the GPU, slurmd ignores it and lists nothing.
    assert slurm_gres_listed((SLURM / "slurmd-G-undeclared.txt").read_text()) == []


def test_what_slurmd_reads_of_mig_devices_with_their_cores():
    # gres.conf's MultipleFiles come back as File=, comma-joined, with Cores=.
    listed = slurm_gres_listed((SLURM / "slurmd-G-mig.txt").read_text())
    assert len(listed) == 8
    assert listed[0] == {
        "type": "nvidia_a100_2g.10gb",
        "file": "/dev/nvidia0,/dev/nvidia-caps/nvidia-cap12,/dev/nvidia-caps/nvidia-cap13",
        "cores": "0",
    }
    assert {(e["file"].split(",")[0], e["cores"]) for e in listed} == {
        ("/dev/nvidia0", "0"),
        ("/dev/nvidia1", "1"),
    }


def test_slurms_own_nvml_autodetect_finds_what_gpufleet_declares():
    # Slurm 24.11's AutoDetect=nvml on the mock NVML (Debian 13 nodes) against
    # gpufleet's gres.conf as slurmd read it, on the same board and layout: two A100s
    # all-balanced, one per NUMA node; and a T4. Slurm names every core where gpufleet
    # leaves Cores= out (every core is near: Slurm's advice).
    auto = slurm_gres_listed((SLURM / "slurmd-G-24.11-autodetect-mig.txt").read_text())
    ours = slurm_gres_listed((SLURM / "slurmd-G-mig.txt").read_text())
    assert len(auto) == 8

    def key(entry: dict[str, str]) -> tuple[str, str, str]:
        return entry["type"], entry["file"], entry["cores"]

    assert sorted(map(key, auto)) == sorted(map(key, ours))
    assert {e["type"] for e in auto} == {
        slurm_mig_type("NVIDIA A100-SXM4-40GB", p) for p in ("1g.5gb", "2g.10gb", "3g.20gb")
    }
    (t4,) = slurm_gres_listed((SLURM / "slurmd-G-24.11-autodetect-t4.txt").read_text())
    assert t4 == {"type": slurm_gres_type("Tesla T4"), "file": "/dev/nvidia0", "cores": "0-1"}


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


def test_the_rendered_line_has_one_gres_where_slurmd_printed_its_own():
    # slurmd 24.11 with its NVML plugin adds the GPUs it detects to `slurmd -C`'s line.
    hardware = (SLURM / "slurmd-C-24.11-nvml.txt").read_text()
    spec = "gpu:nvidia_a100_2g.10gb:2,gpu:nvidia_a100_1g.5gb:4,gpu:nvidia_a100_3g.20gb:2"
    line = slurm_node_line(hardware, spec)
    assert line.count("Gres=") == 1 and line.endswith(f"RealMemory=24105 Gres={spec}")
    assert line.startswith("NodeName=s13-a100 CPUs=2 Boards=1 SocketsPerBoard=1 ")
    assert "Gres=" not in slurm_node_line(hardware), "a node whose GPUs are withdrawn"
    older = "NodeName=slt-t4 CPUs=2 RealMemory=24105\nUpTime=0-07:41:36\n"
    assert slurm_node_line(older, "gpu:tesla_t4:1") == (
        "NodeName=slt-t4 CPUs=2 RealMemory=24105 Gres=gpu:tesla_t4:1"
    )


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


def test_autodetect_agrees_where_slurm_finds_the_devices_the_driver_reports():
    # Slurm 24.11's AutoDetect=nvml on the mock NVML against gpufleet's entries for the
    # same boards: a T4 near both cores of a 2-core socket, and the A100 pair's MIG
    # devices, each near one core of that socket.
    (t4,) = slurm_gres_listed((SLURM / "slurmd-G-24.11-autodetect-t4.txt").read_text())
    ours = [{"type": "tesla_t4", "file": "/dev/nvidia0", "cores": ""}]
    assert slurm_autodetect_differences([t4], ours, 2) == []
    auto = slurm_gres_listed((SLURM / "slurmd-G-24.11-autodetect-mig.txt").read_text())
    declared = slurm_gres_listed((SLURM / "slurmd-G-mig.txt").read_text())
    assert slurm_autodetect_differences(auto, declared) == []
    # With whole sockets required (24.11 on), a core of the two is part of a socket.
    refused = slurm_autodetect_differences(auto, declared, 2)
    assert len(refused) == len(auto) == 8
    assert all("part of a 2-core socket" in said for said in refused), refused
    assert refused[0].startswith("Slurm puts nvidia_a100_") and " on /dev/nvidia" in refused[0]
    # Where NUMA nodes are sockets (SlurmdParameters=numa_node_as_socket): one core each.
    assert slurm_autodetect_differences(auto, declared, 1) == []


def test_autodetect_names_what_it_finds_otherwise():
    ours = [
        {"type": "tesla_t4", "file": "/dev/nvidia0", "cores": ""},
        {"type": "tesla_t4", "file": "/dev/nvidia1", "cores": ""},
    ]
    found = [
        {"type": "t4", "file": "/dev/nvidia0", "cores": "0-1"},
    ]
    assert slurm_autodetect_differences(found, ours, 2) == [
        "Slurm finds t4 on /dev/nvidia0, which the driver does not report",
        "Slurm does not find the tesla_t4 on /dev/nvidia0",
        "Slurm does not find the tesla_t4 on /dev/nvidia1",
    ]

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_holders: the processes holding a node's GPU device files, found in /proc."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.modules import gpu_holders
from conftest import run_local_module


@pytest.mark.parametrize(
    ("text", "unit"),
    [
        ("0::/system.slice/nvidia-persistenced.service\n", "nvidia-persistenced.service"),
        (
            "12:cpu,cpuacct:/x\n1:name=systemd:/user.slice/user-0.slice/session-3.scope\n",
            "session-3.scope",
        ),
        ("0::/system.slice/containerd.service/kubepods/pod1\n", None),  # not its own unit
        ("0::/\n", None),
        ("", None),
    ],
)
def test_the_unit_comes_from_the_systemd_cgroup_path(text, unit):
    assert gpu_holders.unit_of(text) == unit


@pytest.fixture
def dev(tmp_path):
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"):
        (tmp_path / name).write_text("")
    return tmp_path


@pytest.fixture
def holder(dev):
    """A process holding GPU 1's device file (and nvidiactl, which is no GPU)."""
    with (dev / "nvidia1").open("rb") as gpu, (dev / "nvidiactl").open("rb") as ctl:
        process = subprocess.Popen(["sleep", "60"], stdin=gpu, stdout=ctl)
    yield process
    process.kill()
    process.wait()


def _unit(pid: int) -> str | None:
    return gpu_holders.unit_of(Path(f"/proc/{pid}/cgroup").read_text())


def test_a_process_holding_a_gpu_file_is_named_with_its_gpus(dev, holder):
    found = [h for h in gpu_holders.find_holders(str(dev)) if h["pid"] == holder.pid]
    assert found == [
        {
            "pid": holder.pid,
            "name": "sleep",
            "cmdline": "sleep 60",
            "unit": _unit(holder.pid),
            "gpus": [1],
        }
    ]


def test_holders_of_excluded_units_are_left_out(dev, tmp_path):
    """A /proc of two services holding GPU 0: the excluded one is not listed."""
    proc = tmp_path / "proc"
    for pid, unit in ((101, "nvidia-persistenced.service"), (202, "batch-job.service")):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "fd" / "3").symlink_to(dev / "nvidia0")
        (proc / str(pid) / "cgroup").write_text(f"0::/system.slice/{unit}\n")
        (proc / str(pid) / "comm").write_text(f"{unit.split('.')[0]}\n")
        (proc / str(pid) / "cmdline").write_text(f"/usr/bin/{unit.split('.')[0]}\0--flag\0")
    found = gpu_holders.find_holders(
        str(dev), proc_dir=str(proc), exclude_units=["nvidia-persistenced.service"]
    )
    assert found == [
        {
            "pid": 202,
            "name": "batch-job",
            "cmdline": "/usr/bin/batch-job --flag",
            "unit": "batch-job.service",
            "gpus": [0],
        }
    ]


@pytest.mark.parametrize(
    ("name", "unit"),
    [
        ("nvidia-dcgm", "nvidia-dcgm.service"),
        ("nvidia-dcgm.service", "nvidia-dcgm.service"),
        ("run-gpu.scope", "run-gpu.scope"),
    ],
)
def test_a_unit_named_without_its_suffix_is_a_service(name, unit):
    """The roles hand their consumer lists (driver_gpu_consumers: dcgm or dcgm.service)
    as they are; the module reads them as systemctl does."""
    assert gpu_holders.unit_name(name) == unit


def test_nothing_holds_files_nobody_opened(dev):
    assert gpu_holders.find_holders(str(dev)) == []


def test_the_module_names_each_holder(dev, holder):
    result = run_local_module("gpufleet.nvidia.gpu_holders", {"dev_dir": str(dev)}, "--check")
    assert result["changed"] is False
    assert result["gpus"] == {"1": [holder.pid]}
    assert f"pid {holder.pid} (sleep 60)" in result["summary"]
    assert result["summary"].endswith("holds GPU 1")


def test_a_missing_dev_dir_is_refused(tmp_path):
    result = run_local_module("gpufleet.nvidia.gpu_holders", {"dev_dir": str(tmp_path / "no")})
    assert result["failed"] and "dev_dir=" in result["msg"] and "expected /dev" in result["msg"]

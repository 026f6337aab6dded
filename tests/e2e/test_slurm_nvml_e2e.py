# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Debian 13 nodes, with Debian 13's Slurm 24.11 and its NVML plugin as an independent
oracle: two A100s laid out in MIG devices by the mig stage on Debian 13's own driver
(550), and a CPU-only head node running slurmctld 24.11.

The whole of site.yml runs on the GPU node through the reconciler (Debian 13's
containerd 1.7 and Docker 26, toolkit, exporter included), then Slurm's own
`AutoDetect=nvml`, on the mock NVML, says which GPUs it sees: gpufleet's gres.conf must
name the same devices with the same types, and slurmctld 24.11 must take it (it refuses
a Cores= that holds part of a socket, as the NUMA affinity of this machine's GPUs does).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest

import slurm
from test_runner_e2e import FLEET, SHORT_BACKOFF, Fleet, start_fleet

HEAD, MIG = "nvml-head", "nvml-a100"
NODES = {HEAD: "none@trixie", MIG: "a100-mig@trixie"}
SLURM = [*FLEET, "slurm", HEAD, MIG]
VARIABLES = {
    "slurm_gres_manage": True,
    "mig_config": "all-balanced",
    "runtime_config_install": ["containerd", "docker"],
}
# The site's own Docker settings, there before Docker is: a node that runs Docker without
# its bridge network, as this unprivileged node must (no iptables, no overlay mounts).
SITE_DOCKER = {"iptables": False, "ip6tables": False, "bridge": "none", "storage-driver": "vfs"}
TYPES = ["nvidia_a100_1g.5gb:4", "nvidia_a100_2g.10gb:2", "nvidia_a100_3g.20gb:2"]

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("slurm-nvml")
    inventory = start_fleet(work, NODES)
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / f"{MIG}.yml").write_text(json.dumps(VARIABLES) + "\n")
    subprocess.run(SLURM, check=True)
    daemon = json.dumps(SITE_DOCKER)
    subprocess.run(
        [
            "podman",
            "exec",
            MIG,
            "sh",
            "-c",
            f"mkdir -p /etc/docker && echo '{daemon}' > /etc/docker/daemon.json",
        ],
        check=True,
    )
    try:
        yield Fleet(inventory, work / "state")
    finally:
        subprocess.run([*FLEET, "slurm-down"], check=False)
        subprocess.run([*FLEET, "down", *NODES], check=False)


def _cycle(fleet: Fleet) -> subprocess.CompletedProcess[str]:
    """One reconcile cycle; a host that failed is tried again by the next one."""
    return fleet.runner("reconcile", "--once", *SHORT_BACKOFF)


def _listed(fleet: Fleet, *slurmd_args: str) -> list[dict[str, str]]:
    """The GPUs `slurmd -G` lists on the MIG node: type, files and cores of each."""
    said = fleet.on_node(MIG, "slurmd", *slurmd_args, "-G")
    lines = re.findall(r"Gres Name=gpu .*", said.stdout + said.stderr)
    fields = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in lines]
    return sorted(({k: f.get(k, "") for k in ("Type", "File", "Cores")} for f in fields), key=str)


def test_the_whole_site_converges_on_debian_13_with_its_own_driver(fleet: Fleet):
    result = _cycle(fleet)
    record = fleet.status()[MIG]
    # slurm.conf does not declare the GPUs yet: only that stage waits for the site.
    assert (record["status"], record["failed_stage"]) == ("failed", "slurm_gres"), result.stdout
    ready = {stage for stage, status in record["stages"].items() if status == "ready"}
    assert ready >= {"driver", "mig", "toolkit", "runtime_config", "validator", "exporter"}
    assert (record["os"], record["driver_version"]) == ("debian 13", "550.163.01")
    assert record["mig_layout"] == "all-balanced"
    containerd = fleet.on_node(MIG, "containerd", "--version").stdout.split()[2]
    assert containerd.startswith("1.7."), containerd
    # Debian 13's Docker 26, installed by the role (which asks `dockerd --validate`
    # about the new daemon.json before the restart), runs with it: the nvidia runtime
    # is there and the site's settings stay.
    info = json.loads(fleet.on_node(MIG, "docker", "info", "--format", "{{json .}}").stdout)
    assert info["ServerVersion"].startswith("26."), info["ServerVersion"]
    assert info["Runtimes"]["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"
    daemon = json.loads(fleet.on_node(MIG, "cat", "/etc/docker/daemon.json").stdout)
    assert {key: daemon[key] for key in SITE_DOCKER} == SITE_DOCKER


def test_with_the_rendered_line_slurm_24_11_registers_the_node_and_runs_a_mig_job(
    fleet: Fleet,
):
    # Slurm's NVML plugin (contrib, which the driver stage enabled), then the
    # administrator's step: the rendered line into slurm.conf, and reconfigure.
    slurm.install(MIG, ["slurm-wlm-nvml-plugin"])
    subprocess.run(SLURM, check=True)
    result = _cycle(fleet)
    assert result.returncode == 0, result.stdout + result.stderr
    record = fleet.status()[MIG]
    assert (record["stages"]["slurm_gres"], record["slurm_state"]) == ("ready", "IDLE")
    # slurmd 24.11 with its NVML plugin puts the GPUs it detects on `slurmd -C`'s line:
    # the line gpufleet renders has one Gres=, its own.
    line = fleet.on_node(MIG, "tail", "-n", "1", "/etc/gpufleet/slurm/node.conf").stdout
    assert line.count("Gres=") == 1 and line.strip().endswith(
        "Gres=gpu:nvidia_a100_2g.10gb:2,gpu:nvidia_a100_1g.5gb:4,gpu:nvidia_a100_3g.20gb:2"
    ), line
    node = fleet.on_node(HEAD, "scontrol", "--oneliner", "show", "node", MIG).stdout
    assert "Version=24.11." in node and "State=IDLE " in node, node
    gres = re.search(r"\bGres=(\S+)", node)
    assert gres and sorted(re.sub(r"\(S:[^)]*\)", "", gres[1]).split(",")) == [
        f"gpu:{t}" for t in TYPES
    ], node
    job = fleet.on_node(
        HEAD, "srun", "-w", MIG, "--gres=gpu:nvidia_a100_3g.20gb:1", "printenv",
        "CUDA_VISIBLE_DEVICES",
    )  # fmt: skip
    assert job.returncode == 0 and job.stdout.strip().isdigit(), job.stderr


def test_gpufleet_declares_the_mig_devices_slurms_own_nvml_autodetect_finds(fleet: Fleet):
    ours = _listed(fleet)
    assert len(ours) == 8, ours
    # Slurm's reading with a gres.conf of AutoDetect=nvml alone, beside the node's own
    # configuration (slurmd looks for gres.conf next to the slurm.conf it is given).
    fleet.on_node(
        MIG, "sh", "-c",
        "rm -rf /tmp/oracle && mkdir /tmp/oracle && cp /etc/slurm/slurm.conf /tmp/oracle/ "
        "&& echo AutoDetect=nvml > /tmp/oracle/gres.conf",
    )  # fmt: skip
    theirs = _listed(fleet, "-f", "/tmp/oracle/slurm.conf")

    def devices(listed: list[dict[str, str]]) -> list[tuple[str, str]]:
        return sorted((e["Type"], e["File"]) for e in listed)

    assert devices(theirs) == devices(ours)
    # Slurm's autodetected cores are each GPU's NUMA node (core 0 or 1 of this
    # machine's one socket), which its own slurmctld 24.11 refuses; gpufleet declares
    # the socket, which here is every core: no Cores= at all.
    assert {e["Cores"] for e in theirs} <= {"0", "1"}
    assert {e["Cores"] for e in ours} == {""}


def _set_variables(fleet: Fleet, **more: object) -> None:
    (fleet.inventory / "host_vars" / f"{MIG}.yml").write_text(
        json.dumps({**VARIABLES, **more}) + "\n"
    )


def test_autodetect_slurmctld_would_refuse_is_refused_before_gres_conf_changes(fleet: Fleet):
    # The site chooses Slurm's own detection for the node. On this machine it finds each
    # MIG device near one core of a 2-core socket (the mock NVML's NUMA layout), which
    # slurmctld 24.11 refuses: the stage asks slurmd first and keeps gpufleet's lines.
    before = fleet.on_node(MIG, "cat", "/etc/slurm/gres.conf").stdout
    _set_variables(fleet, slurm_gres_autodetect="nvml")
    result = _cycle(fleet)
    record = fleet.status()[MIG]
    assert (record["status"], record["failed_stage"]) == ("failed", "slurm_gres"), result.stdout
    reason = " ".join(record["reason"].split())
    assert "slurm_gres_autodetect nvml on nvml-a100: Slurm would see the GPUs otherwise" in reason
    assert "(cores slurmctld 24.11 refuses), so gres.conf is unchanged" in reason, reason
    assert "set SlurmdParameters=numa_node_as_socket in slurm.conf" in reason, reason
    assert fleet.on_node(MIG, "cat", "/etc/slurm/gres.conf").stdout == before
    # Slurm kept the node as it was: registered, its GPUs declared.
    node = fleet.on_node(HEAD, "scontrol", "--oneliner", "show", "node", MIG).stdout
    assert "State=IDLE " in node, node
    # Back to gpufleet's lines: the node converges again (once its 1 s backoff is over).
    _set_variables(fleet)
    time.sleep(2)
    result = _cycle(fleet)
    assert result.returncode == 0, result.stdout + result.stderr
    assert fleet.status()[MIG]["stages"]["slurm_gres"] == "ready"


def test_a_second_cycle_changes_nothing_on_the_debian_13_node(fleet: Fleet):
    result = _cycle(fleet)
    assert result.stdout.startswith("cycle: 2 probed, 0 planned, 0 applied"), result.stdout
    assert result.returncode == 0, result.stdout

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Slurm's GRES from real facts, checked by real Slurm (Debian's slurmctld and slurmd
from tests/sim/slurm.py) on a simulated T4, two A100s laid out in MIG devices by the
mig stage (one GPU per NUMA node), and a CPU-only head node. The T4 runs its jobs
straight on the host (gpufleet_containers false: its CUDA sample, where one is named,
is its validation) and starts as a copy of the session's onboarded T4 (conftest's
bare_t4_snapshot); the A100s run containers (Pyxis and enroot, say) and onboard here.

The tests run in order, each on what the one before left, as a site would meet them:
gpufleet declares the GPU and says what slurm.conf lacks; the administrator puts the
rendered line in; Slurm then schedules a GPU job; a node whose validation fails is
withdrawn and comes back by itself once it passes again; a drain an administrator set
is left alone; a driver change and a GPU fallen off the bus each wait in drain for the
node's job, then are applied (the GPU remediated by a reboot) and the node resumed.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_runner_e2e import FLEET, SHORT_BACKOFF, Fleet, add_nodes, inject_fault, start_fleet

NODES = {"slurm-head": "none", "slurm-t4": "t4-1", "slurm-a100": "a100-mig"}
COPIED = "slurm-t4"  # from the snapshot; the others from the node image
OLDER = "535.261.03"  # Debian's older build; the node onboards with 535.309.01
HEAD, GPU, MIG = "slurm-head", "slurm-t4", "slurm-a100"
SLURM = [*FLEET, "slurm", HEAD, GPU, MIG]
# all-balanced on an A100 40GB: two 1g.5gb, one 2g.10gb and one 3g.20gb per GPU.
BALANCED = ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
MIG_VARS = {"mig_config": "all-balanced", "device_plugin_mig_strategy": "mixed"}

pytestmark = pytest.mark.fleet


class SlurmFleet(Fleet):
    def reconcile(self, *args: str) -> subprocess.CompletedProcess[str]:
        # A failed host is tried again by the next cycle here.
        return self.runner("reconcile", *SHORT_BACKOFF, *args)

    def scontrol(self, node: str = GPU) -> dict[str, str]:
        """A GPU node as slurmctld reports it (asked on the head node)."""
        out = self.on_node(HEAD, "scontrol", "--oneliner", "show", "node", node).stdout
        line, _, reason = out.strip().partition(" Reason=")
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        return {**fields, "Reason": reason}

    def set_host_vars(self, node: str = GPU, **variables: object) -> None:
        text = json.dumps({"slurm_gres_manage": True, **variables})
        (self.inventory / "host_vars" / f"{node}.yml").write_text(text + "\n")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, bare_t4_snapshot: str) -> Iterator[SlurmFleet]:
    work = tmp_path_factory.mktemp("slurm")
    inventory = start_fleet(work, {n: p for n, p in NODES.items() if n != COPIED})
    add_nodes(inventory, "copied.yml", {COPIED: NODES[COPIED]}, from_snapshot=bare_t4_snapshot)
    (inventory / "bare.yml").write_text(
        f"gpu_nodes:\n  hosts:\n    {COPIED}:\n      gpufleet_containers: false\n"
    )
    (inventory / "host_vars").mkdir()
    subprocess.run(SLURM, check=True)
    sim = SlurmFleet(inventory, work / "state")
    sim.set_host_vars()
    sim.set_host_vars(MIG, **MIG_VARS)
    try:
        yield sim
    finally:
        subprocess.run([*FLEET, "slurm-down"], check=False)
        subprocess.run([*FLEET, "down", *NODES], check=False)


def _smi(fleet: Fleet, field: str) -> str:
    """A GPU field as NVIDIA's nvidia-smi on the node reports it."""
    out = fleet.on_node(GPU, "nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader")
    return out.stdout.strip()


def test_the_gpu_is_declared_from_its_facts_and_the_missing_slurm_conf_line_is_named(
    fleet: SlurmFleet,
):
    result = fleet.reconcile("--once")
    assert result.returncode == 1, result.stdout + result.stderr
    record = fleet.status()[GPU]
    assert (record["status"], record["failed_stage"]) == ("failed", "slurm_gres"), result.stdout
    # The type is the name NVML gives the GPU, as Slurm's AutoDetect writes it; the
    # device file is the one the driver made for it.
    gres_type = _smi(fleet, "name").lower().replace(" ", "_")
    assert gres_type == "tesla_t4"
    gres_conf = fleet.on_node(GPU, "cat", "/etc/slurm/gres.conf").stdout
    minor = fleet.on_node(GPU, "nvidia-smi", "-q").stdout.split("Minor Number")[1].split()[1]
    assert f"Name=gpu Type={gres_type} File=/dev/nvidia{minor}" in gres_conf.splitlines()
    assert fleet.on_node(GPU, "test", "-c", f"/dev/nvidia{minor}").returncode == 0
    # slurm.conf does not declare the GPU yet: the failure says the line it needs.
    rendered = fleet.on_node(GPU, "cat", "/etc/gpufleet/slurm/node.conf").stdout.splitlines()[-1]
    assert rendered.startswith(f"NodeName={GPU} ") and rendered.endswith(f" Gres=gpu:{gres_type}:1")
    assert f"its line there should be {rendered}" in " ".join(record["reason"].split())
    assert fleet.scontrol()["Gres"] == "(null)"


def _gres_lines(fleet: Fleet, node: str) -> list[dict[str, str]]:
    """The GPU entries of a node's gres.conf, as key=value fields."""
    text = fleet.on_node(node, "cat", "/etc/slurm/gres.conf").stdout
    return [
        dict(field.split("=", 1) for field in line.split())
        for line in text.splitlines()
        if line.startswith("Name=gpu")
    ]


def _machine_cores() -> int:
    """The machine's online cores (hyperthreads counted once), as the kernel lists them."""
    cpu = Path("/sys/devices/system/cpu")
    online = (cpu / "online").read_text().strip()
    ids = [
        n
        for part in online.split(",")
        for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)
    ]
    return len({(cpu / f"cpu{n}/topology/core_cpus_list").read_text() for n in ids})


def _gres(node: dict[str, str]) -> list[str]:
    """A node's Gres= items as scontrol gives them, without their sockets (S:0)."""
    return sorted(re.sub(r"\(S:[^)]*\)", "", node["Gres"]).split(","))


def _mig_devices(fleet: Fleet) -> list[list[str]]:
    """Per GPU of the MIG node, the sorted profiles of its MIG devices (nvidia-smi -L)."""
    gpus: list[list[str]] = []
    for line in fleet.on_node(MIG, "nvidia-smi", "-L").stdout.splitlines():
        if line.startswith("GPU "):
            gpus.append([])
        elif line.strip().startswith("MIG "):
            gpus[-1].append(line.split()[1])
    return [sorted(profiles) for profiles in gpus]


def test_mig_devices_are_declared_as_their_own_types_near_their_gpus_cores(fleet: SlurmFleet):
    record = fleet.status()[MIG]
    assert (record["failed_stage"], record["mig_layout"]) == ("slurm_gres", "all-balanced")
    # The first cycle laid each GPU out as all-balanced.
    assert _mig_devices(fleet) == [BALANCED, BALANCED]
    assert "mig=ready:all-balanced" in fleet.runner("status").stdout
    # One entry per MIG device nvidia-smi lists, typed by its profile; each names its
    # GPU's device file and its instances' capability files, which the driver made.
    profiles = sorted(BALANCED * 2)
    entries = _gres_lines(fleet, MIG)
    assert sorted(e["Type"] for e in entries) == [f"nvidia_a100_{p}" for p in profiles]
    for entry in entries:
        gpu, *caps = entry["MultipleFiles"].split(",")
        assert gpu in ("/dev/nvidia0", "/dev/nvidia1") and len(caps) == 2, entry
        assert all(c.startswith("/dev/nvidia-caps/nvidia-cap") for c in caps), entry
        assert fleet.on_node(MIG, "test", "-c", caps[0], "-a", "-c", caps[1]).returncode == 0
    # The profile puts one GPU on each NUMA node, and the simulated board deals the
    # machine's cores out to them: with at least two cores each GPU's devices name
    # their half, else no Cores= at all (every core is near).
    cores = _machine_cores()
    halves = {"/dev/nvidia0": range(cores // 2), "/dev/nvidia1": range(cores // 2, cores)}
    for entry in entries:
        near = halves[entry["MultipleFiles"].split(",")[0]]
        want = (f"{near[0]}-{near[-1]}" if len(near) > 1 else str(near[0])) if cores > 1 else None
        assert entry.get("Cores") == want, entry
    rendered = fleet.on_node(MIG, "cat", "/etc/gpufleet/slurm/node.conf").stdout.splitlines()[-1]
    gres = rendered.split(" Gres=")[1]
    assert sorted(gres.split(",")) == sorted(
        ["gpu:nvidia_a100_1g.5gb:4", "gpu:nvidia_a100_2g.10gb:2", "gpu:nvidia_a100_3g.20gb:2"]
    )


def test_with_the_rendered_line_in_slurm_conf_slurm_schedules_the_gpu(fleet: SlurmFleet):
    # The administrator's step: put the rendered line into slurm.conf and reconfigure.
    subprocess.run(SLURM, check=True)
    result = fleet.reconcile("--once")
    assert result.returncode == 0, result.stdout + result.stderr
    record = fleet.status()[GPU]
    assert record["stages"]["slurm_gres"] == "ready"
    assert record["slurm_state"] == "IDLE"
    line = next(ln for ln in fleet.runner("status").stdout.splitlines() if ln.startswith(GPU))
    assert "slurm_gres=ready:IDLE" in line
    sinfo = fleet.on_node(HEAD, "sinfo", "-N", "-h", "-n", GPU, "-o", "%N %G %T").stdout.split()
    assert sinfo == [GPU, "gpu:tesla_t4:1", "idle"]
    job = fleet.on_node(
        HEAD, "srun", "-w", GPU, "--gres=gpu:tesla_t4:1", "bash", "-c", "echo $CUDA_VISIBLE_DEVICES"
    )
    assert (job.returncode, job.stdout.strip()) == (0, "0"), job.stderr
    # The MIG node: slurmd read every MIG device with its cores, slurmctld counts them
    # per type (on the socket of those cores, S:0), and a job gets one.
    assert fleet.status()[MIG]["stages"]["slurm_gres"] == "ready"
    said = fleet.on_node(MIG, "slurmd", "-G")
    read = said.stdout + said.stderr
    assert read.count("Gres Name=gpu Type=nvidia_a100_") == 8, read
    assert ("Cores=" in read) == (_machine_cores() > 1), read
    assert "Invalid GRES data" not in read, read
    node = fleet.scontrol(MIG)
    assert _gres(node) == [
        "gpu:nvidia_a100_1g.5gb:4",
        "gpu:nvidia_a100_2g.10gb:2",
        "gpu:nvidia_a100_3g.20gb:2",
    ], node
    job = fleet.on_node(
        HEAD,
        "srun",
        "-w",
        MIG,
        "--gres=gpu:nvidia_a100_3g.20gb:2",
        "bash",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    )
    assert job.returncode == 0 and len(job.stdout.strip().split(",")) == 2, job.stderr


def test_mig_instances_destroyed_by_hand_are_drift_put_back_through_a_drain(fleet: SlurmFleet):
    """The probe sees GPU 0's instances gone (mig drift). Putting them back stops what
    runs on the GPUs, so the repair goes through the rollout like a driver change: the
    node is drained in Slurm, laid out again and resumed."""
    for command in (["-dci", "-i", "0"], ["-dgi", "-i", "0"]):
        destroyed = fleet.on_node(MIG, "nvidia-smi", "mig", *command)
        assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert _mig_devices(fleet) == [[], BALANCED]
    result = fleet.reconcile("--once")
    assert f"{MIG}: rolled-out; because drift; repaired mig" in result.stdout, result.stdout
    assert _mig_devices(fleet) == [BALANCED, BALANCED]
    history = fleet.history(MIG)
    drift = [e for e in history if e["kind"] == "drift"]
    assert drift and drift[-1]["component"] == "mig", history
    # No job on it: drained at once, not waiting cordoned.
    phases = [e["component"] for e in history if e["kind"] == "rollout"]
    assert phases[-5:] == ["queued", "drained", "applying", "applied", "done"], history
    node = fleet.scontrol(MIG)
    assert (node["State"], node["Reason"]) == ("IDLE", ""), node


def _changed_tasks(output: str, host: str) -> list[str]:
    """The tasks of a playbook's output that changed something on `host`."""
    task, changed = "", []
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith(f"changed: [{host}]"):
            changed.append(task)
    return changed


def test_a_second_pass_changes_nothing_and_an_administrators_drain_stays(fleet: SlurmFleet):
    drained = fleet.on_node(
        HEAD, "scontrol", "update", f"NodeName={GPU}", "State=DRAIN", "Reason=disk check"
    )
    assert drained.returncode == 0, drained.stderr
    result = fleet.site(f"{GPU},{MIG}", {})
    assert result.returncode == 0, result.stdout[-3000:]
    for host in (GPU, MIG):
        recap = next(ln for ln in result.stdout.splitlines() if ln.startswith(f"{host} "))
        assert "changed=0" in recap, (recap, _changed_tasks(result.stdout, host))
    node = fleet.scontrol()
    assert "DRAIN" in node["State"] and node["Reason"].startswith("disk check"), node
    assert (
        fleet.on_node(HEAD, "scontrol", "update", f"NodeName={GPU}", "State=RESUME").returncode == 0
    )


def test_a_node_whose_validation_fails_is_withdrawn_then_comes_back(fleet: SlurmFleet):
    # A CUDA sample that is not there: validation fails, so the GPU is withdrawn.
    fleet.set_host_vars(validator_cuda_sample="/opt/missing/vectorAdd")
    result = fleet.reconcile("--once")
    assert result.returncode == 1, result.stdout + result.stderr
    record = fleet.status()[GPU]
    assert (record["failed_stage"], record["stages"]["slurm_gres"]) == ("validator", "withdrawn")
    gres_conf = fleet.on_node(GPU, "cat", "/etc/slurm/gres.conf").stdout
    assert "Name=gpu" not in gres_conf and "No GPU is declared" in gres_conf
    node = fleet.scontrol()
    assert "DRAIN" in node["State"] and "count reported lower than configured" in node["Reason"]
    # Validation passes again: the GPU is declared and the drain Slurm set is lifted.
    fleet.set_host_vars()
    time.sleep(2)  # past the failed host's backoff (1 s, jittered)
    result = fleet.reconcile("--once")
    assert result.returncode == 0, result.stdout + result.stderr
    node = fleet.scontrol()
    assert (node["State"], node["Gres"]) == ("IDLE", "gpu:tesla_t4:1"), node
    # What the stage saw last: idle, not drained (a NOT_RESPONDING from a ping sent
    # while slurmd restarted may trail it).
    seen = fleet.status()[GPU]["slurm_state"].split("+")
    assert seen[0] == "IDLE" and "DRAIN" not in seen, seen


def _driver(fleet: Fleet) -> str:
    return _smi(fleet, "driver_version")


def _jobs(fleet: Fleet) -> list[str]:
    return fleet.on_node(HEAD, "squeue", "--noheader", "--format=%A").stdout.split()


def _start_job(fleet: Fleet, *options: str) -> str:
    """A job of ten minutes on the GPU node, once it runs; returns its id."""
    submitted = fleet.on_node(
        HEAD, "sbatch", "--parsable", "-w", GPU, *options, "--wrap", "sleep 600"
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while "RUNNING" not in fleet.on_node(HEAD, "squeue", "-h", "-j", job, "-o", "%T").stdout:
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(1)
    return job


def _cancel_job(fleet: Fleet, job: str) -> None:
    """Cancel the job and wait until no job is left."""
    assert fleet.on_node(HEAD, "scancel", job).returncode == 0
    deadline = time.monotonic() + 60
    while _jobs(fleet):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(1)


def test_a_driver_change_waits_in_drain_for_the_job_then_resumes_the_node(fleet: SlurmFleet):
    before = _driver(fleet)
    job = _start_job(fleet, "--gres=gpu:tesla_t4:1")
    fleet.set_host_vars(driver_version=OLDER)
    result = fleet.reconcile("--once")
    record = fleet.status()[GPU]
    assert record["rollout_phase"] == "cordoned", result.stdout + result.stderr
    assert f"Slurm job(s) {job} still running" in record["rollout_reason"]
    node = fleet.scontrol()
    assert "DRAIN" in node["State"] and node["Reason"].startswith("gpufleet: "), node
    assert _driver(fleet) == before, "the driver is not touched while the job runs"
    # The job ends: the next cycle applies the change, validates it, resumes the node.
    _cancel_job(fleet, job)
    result = fleet.reconcile("--once")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _driver(fleet) == OLDER
    node = fleet.scontrol()
    assert (node["State"], node["Reason"]) == ("IDLE", ""), node
    record = fleet.status()[GPU]
    assert (record["rollout_phase"], record["slurm_drained"]) == (None, "")
    assert record["slurm_state"].split("+")[0] == "IDLE", record["slurm_state"]
    phases = [e["component"] for e in fleet.history(GPU) if e["kind"] == "rollout"]
    assert phases[-6:] == ["queued", "cordoned", "drained", "applying", "applied", "done"]
    # A second pass changes nothing.
    result = fleet.reconcile("--once")
    assert result.stdout.startswith("cycle: 3 probed, 0 planned, 0 applied"), result.stdout


def test_a_gpu_fallen_off_the_bus_is_drained_rebooted_validated_and_resumed(fleet: SlurmFleet):
    """Xid 79 on the T4: nvidia-smi cannot reach the GPU and the driver logged it. The
    node is drained in Slurm with a reason naming the GPU and the Xid and waits for its
    job; then it is rebooted (a lost GPU asks for one; the inventory's
    driver_reboot_policy is if_needed), applied, read again and resumed."""
    job = _start_job(fleet)
    inject_fault(GPU, "lost", "--gpu", "0")
    result = fleet.reconcile("--once")
    record = fleet.status()[GPU]
    assert record["remedy"]["action"] == "reboot", result.stdout + result.stderr
    assert record["rollout_phase"] == "cordoned", result.stdout
    assert f"Slurm job(s) {job} still running" in record["rollout_reason"]
    [address] = record["remedy"]["gpus"]
    node = fleet.scontrol()
    assert "DRAIN" in node["State"], node
    assert node["Reason"].startswith(f"gpufleet: GPU {address} reboot (lost: "), node
    assert "Xid 79 (" in node["Reason"], node

    _cancel_job(fleet, job)
    result = fleet.reconcile("--once")
    assert result.returncode == 0, result.stdout + result.stderr
    node = fleet.scontrol()
    assert (node["State"], node["Reason"]) == ("IDLE", ""), node
    record = fleet.status()[GPU]
    assert (record["remedy"], record["health"]["action"]) == ({}, "none"), record
    assert record["rollout_phase"] is None and record["remedied_at"] is not None
    health = [e["summary"] for e in fleet.history(GPU) if e["kind"] == "health"]
    assert health[-1] == "remediated by a reboot; health check passed", health
    assert _smi(fleet, "pci.bus_id").lower().endswith(address.split(":", 1)[1])


def test_a_new_mig_layout_halts_drained_until_slurm_conf_has_its_line(fleet: SlurmFleet):
    """A layout change is disruptive: the node is drained first. Its GRES are new, so
    slurm.conf's line for it is out of date: the rollout halts there, the node left
    drained, saying the line it needs; with that line in, a release finishes it. The
    layout alone is set: the device plugin's MIG strategy follows it (single)."""
    fleet.set_host_vars(MIG, mig_config="all-1g.5gb")
    result = fleet.reconcile("--once")
    record = fleet.status()[MIG]
    assert record["rollout_phase"] == "halted", result.stdout
    rendered = fleet.on_node(MIG, "cat", "/etc/gpufleet/slurm/node.conf").stdout.splitlines()[-1]
    assert rendered.endswith(" Gres=gpu:nvidia_a100_1g.5gb:14"), rendered
    assert f"its line there should be {rendered}" in " ".join(record["rollout_reason"].split())
    assert _mig_devices(fleet) == [["1g.5gb"] * 7] * 2
    node = fleet.scontrol(MIG)
    assert "DRAIN" in node["State"] and node["Reason"].startswith("gpufleet: "), node
    # The administrator puts the line in slurm.conf and releases the host.
    subprocess.run(SLURM, check=True)
    assert fleet.runner("release", MIG).returncode == 0
    result = fleet.reconcile("--once")
    assert result.returncode == 0, result.stdout + result.stderr
    node = fleet.scontrol(MIG)
    assert node["State"] == "IDLE" and node["Reason"] == "", node
    assert _gres(node) == ["gpu:nvidia_a100_1g.5gb:14"], node
    record = fleet.status()[MIG]
    assert record["rollout_phase"] is None and record["mig_layout"] == "all-1g.5gb"
    assert (record["status"], record["stages"]["device_plugin"]) == ("converged", "ready")
    again = fleet.reconcile("--once")
    assert again.stdout.startswith("cycle: 3 probed, 0 planned, 0 applied"), again.stdout


def test_two_nodes_of_a_pool_with_a_budget_of_one_are_remediated_one_at_a_time(
    fleet: SlurmFleet,
):
    """Both GPU nodes lose a GPU at once, below the breaker. They are one pool (all)
    with the default budget of one host out of service: the first cycle drains one in
    Slurm, reboots it, validates and resumes it, while the other waits queued, neither
    drained nor rebooted; the next cycle does the same for the other."""
    inject_fault(GPU, "lost", "--gpu", "0")
    inject_fault(MIG, "lost", "--gpu", "0")
    booted = {node: fleet.booted(node) for node in (GPU, MIG)}
    # (with no window: the T4 was remediated minutes ago, and a GPU asking again that
    # soon would be quarantined rather than remediated)
    first = fleet.reconcile("--once", "--health-window", "0")
    records = fleet.status()
    [done] = [n for n in (GPU, MIG) if records[n]["remedy"] == {}]
    [waiting] = [n for n in (GPU, MIG) if n != done]
    assert records[waiting]["rollout_phase"] == "queued", first.stdout
    [line] = [row for row in first.stdout.splitlines() if row.startswith(f"  {waiting}: ")]
    assert "rollout: queued for a later batch" in line, first.stdout
    assert records[waiting]["remedy"]["action"] == "reboot", records[waiting]
    assert "DRAIN" not in fleet.scontrol(waiting)["State"]
    assert fleet.booted(waiting) == booted[waiting], "rebooted out of its turn"
    assert fleet.booted(done) != booted[done]
    assert fleet.scontrol(done)["State"] == "IDLE"

    second = fleet.reconcile("--once", "--health-window", "0")
    assert second.returncode == 0, second.stdout + second.stderr
    records = fleet.status()
    for node in (GPU, MIG):
        assert (records[node]["remedy"], records[node]["rollout_phase"]) == ({}, None), node
        assert records[node]["status"] == "converged", records[node]
        node_state = fleet.scontrol(node)
        assert (node_state["State"], node_state["Reason"]) == ("IDLE", ""), node_state
        health = [e["summary"] for e in fleet.history(node) if e["kind"] == "health"]
        assert health[-1] == "remediated by a reboot; health check passed", health
    assert fleet.booted(waiting) != booted[waiting]


def test_a_burst_is_held_by_the_breaker_and_a_remapping_failure_is_quarantined(
    fleet: SlurmFleet,
):
    """Both GPU nodes ask at once (the T4 lost, an A100 with a double-bit error) with the
    breaker at two: neither is drained nor remediated, and the report says why. The
    faults cleared by hand and the hosts released, an A100 with a failed row remapping
    asks for a replacement: it is drained and quarantined with its evidence, and stays
    so (not probed, not resumed) on the next cycle."""
    inject_fault(GPU, "lost", "--gpu", "0")
    inject_fault(MIG, "ecc-dbe", "--gpu", "0")
    # (with no window: the T4 was remediated minutes ago, and a GPU asking again that
    # soon would be quarantined rather than counted)
    result = fleet.reconcile("--once", "--health-breaker", "2", "--health-window", "0")
    assert "GPU remediation held: 2 hosts ask for a GPU reset or a reboot" in result.stdout
    for node in (GPU, MIG):
        assert "DRAIN" not in fleet.scontrol(node)["State"], result.stdout
        assert fleet.status()[node]["remedy"]["action"] in ("reset", "reboot")
    for node in (GPU, MIG):
        inject_fault(node, "clear")
        assert fleet.runner("release", node).returncode == 0

    inject_fault(MIG, "remap-failure", "--gpu", "1")
    result = fleet.reconcile("--once")
    assert result.returncode == 1, result.stdout + result.stderr  # a host quarantined
    record = fleet.status()[MIG]
    assert record["quarantined"] and record["remedy"]["action"] == "replace", record
    [(address, evidence)] = record["remedy"]["gpus"].items()
    assert evidence[0].startswith("remap-failure: "), evidence
    node = fleet.scontrol(MIG)
    assert "DRAIN" in node["State"], node
    assert node["Reason"].startswith(f"gpufleet: GPU {address} replace (remap-failure"), node
    assert fleet.status()[GPU]["remedy"] == {}
    result = fleet.reconcile("--once")
    assert result.stdout.startswith("cycle: 2 probed"), result.stdout
    assert f"{MIG}: skipped; quarantined" in result.stdout, result.stdout
    assert "DRAIN" in fleet.scontrol(MIG)["State"]
    shown = fleet.runner("status").stdout
    assert f"quarantined for its GPUs (replace asked (GPU {address}: remap-failure" in shown
    # With who the GPU is, as nvidia-smi reads it: what its vendor asks for.
    query = ["--query-gpu=pci.bus_id,uuid,serial", "--format=csv,noheader"]
    boards = [r.split(", ") for r in fleet.on_node(MIG, "nvidia-smi", *query).stdout.splitlines()]
    [(uuid, serial)] = [(u, s) for bus, u, s in boards if bus.lower().endswith(address[4:])]
    assert f"GPU {address}: uuid {uuid}, serial {serial}]" in shown, shown

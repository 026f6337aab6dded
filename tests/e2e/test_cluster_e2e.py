# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reconciler and the cluster side against a real API server.

A T4 node and a CPU-only node of the simulated fleet, registered as Nodes of the test
control plane (tests/sim/cluster.py: etcd, kube-apiserver, controller manager,
scheduler, and kwok in place of kubelets), with an inventory that applies the cluster
side. The tests run in order, each building on the state the one before left. What
a cluster admin would notice is asserted: the labels on the Node objects, the
DaemonSets' pods, what `reconcile` and `status` say, and the repair of drift made by
hand with kubectl.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import cluster as sim_cluster
from test_runner_e2e import SHORT_BACKOFF, cli_data

PROJECT = Path(__file__).resolve().parents[2]
FLEET = [sys.executable, str(PROJECT / "tests" / "sim" / "fleet.py")]
NODES = {"e2e-k8s-t4": "t4-1", "e2e-k8s-cpu": "none"}
GPU_NODE, CPU_NODE = "e2e-k8s-t4", "e2e-k8s-cpu"
NAMESPACE = "gpufleet"

pytestmark = pytest.mark.fleet
# What a watch of a Node shows by default: "<unschedulable> <GPU health label>".
WATCHED = r'{.spec.unschedulable} {.metadata.labels.nvidia\.com/gpu\.health}{"\n"}'
# ... and of its taints: "<unschedulable> <gpufleet's health taint's value><effect>".
TAINTED = (
    r"{.spec.unschedulable} "
    r'{.spec.taints[?(@.key=="nvidia.com/gpu.health")].value}'
    r'{.spec.taints[?(@.key=="nvidia.com/gpu.health")].effect}{"\n"}'
)


class Cluster:
    def __init__(self, inventory: Path, state: Path, kubeconfig: Path, kubectl: Path) -> None:
        self.inventory = inventory
        self.state = state
        self.kubeconfig = kubeconfig
        self._kubectl = kubectl

    def runner(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "runner", *args, *self._where()],
            capture_output=True,
            text=True,
            cwd=PROJECT,
            timeout=900,
            check=False,
        )

    def history(self) -> list[dict]:
        """The GPU node's history entries (`history --json`)."""
        listed = self.runner("history", "--json", "--host", GPU_NODE)
        return cli_data(listed.stdout, "history")["entries"]

    def _where(self) -> list[str]:
        return ["-i", str(self.inventory), "--state-dir", str(self.state)]

    def reconcile(self) -> subprocess.CompletedProcess[str]:
        return self.runner("reconcile", "--once", *SHORT_BACKOFF)

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self._kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def get(self, *args: str) -> dict:
        result = self.kubectl("get", *args, "-o", "json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def labels(self, node: str) -> dict[str, str]:
        return self.get("node", node)["metadata"].get("labels") or {}

    def watch_node(self, node: str, shape: str = WATCHED) -> subprocess.Popen[str]:
        """`kubectl get --watch` on a Node: a line per version of it in the JSONPath
        `shape`, until terminated."""
        return subprocess.Popen(
            [str(self._kubectl), f"--kubeconfig={self.kubeconfig}", "get", "node", node,
             "--watch", "-o", f"jsonpath={shape}"],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip

    def on_node(self, node: str, *command: str) -> str:
        result = subprocess.run(
            ["podman", "exec", node, *command], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("e2e-cluster")
    inventory = work / "inventory"
    inventory.mkdir()
    nodes = [arg for name, profile in NODES.items() for arg in ("--node", f"{name}={profile}")]
    subprocess.run(
        [*FLEET, "up", *nodes, "--write-inventory", str(inventory / "hosts.yml")], check=True
    )
    (inventory / "group_vars").symlink_to(PROJECT / "inventories" / "sim" / "group_vars")
    with sim_cluster.exclusive():
        yield from _cluster(work, inventory)


def _cluster(work: Path, inventory: Path) -> Iterator[Cluster]:
    started = not (PROJECT / ".cache" / "cluster" / "pids" / "kube-apiserver.pid").exists()
    # (stderr not captured: if the control plane does not start, its reason is shown)
    up = subprocess.run([*FLEET, "cluster", *NODES], check=True, stdout=subprocess.PIPE, text=True)
    kubeconfig = Path(up.stdout.strip().splitlines()[-1])
    built = subprocess.run(
        ["bash", str(PROJECT / "tests" / "sim" / "controlplane" / "build.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    kubectl = Path(built.stdout.strip().splitlines()[-1]) / "kubectl"
    # The cluster side on, for every host and the control host (all's variables).
    (inventory / "cluster.yml").write_text(
        "all:\n  vars:\n    k8s_manifests_apply: true\n"
        f"    k8s_manifests_kubeconfig: {kubeconfig}\n"
        # kwok runs no container: a DaemonSet's pods are Running as soon as scheduled.
        "    k8s_manifests_wait_timeout: 120\n"
    )
    try:
        yield Cluster(inventory, work / "state", kubeconfig, kubectl)
    finally:
        if started:
            subprocess.run([*FLEET, "cluster-down"], check=False)
        subprocess.run([*FLEET, "down", *NODES], check=False)


def test_first_cycle_labels_the_gpu_node_from_its_own_facts(cluster: Cluster) -> None:
    result = cluster.reconcile()
    assert result.returncode == 0, result.stdout + result.stderr
    # (repaired, if a cluster left by an earlier run held this namespace already)
    assert re.search(r"cluster side: (applied|repaired)", result.stdout), result.stdout
    labels = cluster.labels(GPU_NODE)
    name = cluster.on_node(GPU_NODE, "nvidia-smi", "--query-gpu=name", "--format=csv,noheader")
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.count"] == "1"
    assert labels["nvidia.com/gpu.product"] == name.replace(" ", "-")
    assert labels["nvidia.com/gpu.deploy.driver"] == "true"
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    cpu = cluster.labels(CPU_NODE)
    assert cpu.get("nvidia.com/gpu.present", "false") == "false"
    assert not any(k.startswith("nvidia.com/gpu.deploy.") for k in cpu)
    # Every DaemonSet has all the pods it wants, and they are ready.
    for ds in cluster.get("daemonsets", "-n", NAMESPACE)["items"]:
        status = ds["status"]
        assert status["numberReady"] == status["desiredNumberScheduled"], ds["metadata"]["name"]
    pods = cluster.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=nvidia-device-plugin")
    assert [p["spec"]["nodeName"] for p in pods["items"]] == [GPU_NODE]
    assert "cluster side: converged" in cluster.runner("status").stdout


def test_steady_state_reads_the_cluster_and_changes_nothing(cluster: Cluster) -> None:
    result = cluster.reconcile()
    assert result.stdout.startswith("cycle: 2 probed, 0 planned, 0 applied"), result.stdout
    assert "cluster side: converged" in result.stdout


def test_a_deleted_daemonset_is_recreated_without_touching_a_node(cluster: Cluster) -> None:
    deleted = cluster.kubectl("delete", "daemonset", "-n", NAMESPACE, "nvidia-device-plugin")
    assert deleted.returncode == 0, deleted.stderr
    result = cluster.reconcile()
    assert result.stdout.startswith("cycle: 2 probed, 0 planned, 0 applied"), result.stdout
    assert "cluster side: repaired" in result.stdout, result.stdout
    ds = cluster.get("daemonset", "-n", NAMESPACE, "nvidia-device-plugin")
    assert ds["status"]["numberReady"] == 1


def test_api_server_gone_node_work_goes_on_and_the_next_cycle_finishes_it(
    cluster: Cluster,
) -> None:
    """The exporter stopped and a label removed by hand, then the API server killed:
    the node's repair goes on and the cluster side fails; once the API server is back
    the next cycle finds the label gone (drift) and restores it through its host."""
    pid_file = PROJECT / ".cache" / "cluster" / "pids" / "kube-apiserver.pid"
    stopped = cluster.on_node(GPU_NODE, "systemctl", "stop", "nvidia-dcgm-exporter.service")
    assert stopped == ""
    cluster.kubectl("label", "node", GPU_NODE, "nvidia.com/gpu.present-")
    pid = int(pid_file.read_text())
    # Gone at once, as in a crash (a graceful stop keeps the port for up to a minute).
    subprocess.run(["kill", "-KILL", str(pid)], check=True)
    try:
        result = cluster.reconcile()
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"{GPU_NODE}: applied; because drift; repaired exporter" in result.stdout
        assert "cluster side: probe failed" in result.stdout or (
            "cluster side: failed" in result.stdout
        ), result.stdout
        assert cluster.on_node(
            GPU_NODE, "systemctl", "is-active", "nvidia-dcgm-exporter.service"
        ) == ("active")
        status = cluster.runner("status")
        assert status.returncode == 1
        assert "cluster side: failed" in status.stdout, status.stdout
    finally:
        subprocess.run([*FLEET, "cluster", *NODES], check=True, capture_output=True)
    result = cluster.reconcile()
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(
        rf"{GPU_NODE}: applied; because [^;]*cluster drift[^;]*; repaired cluster", result.stdout
    ), result.stdout
    assert f"{CPU_NODE}: probed" in result.stdout
    assert cluster.labels(GPU_NODE)["nvidia.com/gpu.present"] == "true"
    assert "cluster side: converged" in cluster.runner("status").stdout
    history = cluster.history()
    drift = [e for e in history if (e["kind"], e["component"]) == ("drift", "cluster")]
    assert "nvidia.com/gpu.present true -> None" in drift[-1]["summary"]


def test_a_node_failing_a_stage_loses_its_deploy_labels_and_gets_them_back(
    cluster: Cluster,
) -> None:
    """The CDI spec replaced by a directory: the toolkit stage cannot write it, so
    validation and the device plugin stage are not reached on the node; its Node's
    deploy labels say so and the device plugin leaves it, until it is healthy again."""
    spec = "/etc/cdi/nvidia.yaml"
    cluster.on_node(GPU_NODE, "sh", "-c", f"rm -f {spec} && mkdir {spec}")
    result = cluster.reconcile()
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{GPU_NODE}: failed" in result.stdout, result.stdout
    labels = cluster.labels(GPU_NODE)
    assert labels["nvidia.com/gpu.deploy.container-toolkit"] == "false"
    assert labels["nvidia.com/gpu.deploy.operator-validator"] == "false"
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "false"
    assert labels["nvidia.com/gpu.deploy.driver"] == "true", "the driver still passes"
    ds = cluster.get("daemonset", "-n", NAMESPACE, "nvidia-device-plugin")
    assert ds["status"]["desiredNumberScheduled"] == 0, "the device plugin left the node"
    cluster.on_node(GPU_NODE, "rmdir", spec)
    time.sleep(2)  # the failed host's backoff (1 s here) runs out
    result = cluster.reconcile()
    assert result.returncode == 0, result.stdout + result.stderr
    labels = cluster.labels(GPU_NODE)
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert labels["nvidia.com/gpu.deploy.operator-validator"] == "true"
    waited = cluster.kubectl(
        "rollout", "status", "-n", NAMESPACE, "daemonset/nvidia-device-plugin", "--timeout=60s"
    )
    assert waited.returncode == 0, waited.stderr
    ds = cluster.get("daemonset", "-n", NAMESPACE, "nvidia-device-plugin")
    assert ds["status"]["numberReady"] == 1


WORKLOAD = """
apiVersion: v1
kind: Namespace
metadata: {name: e2e-ml}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: train, namespace: e2e-ml}
spec:
  replicas: 1
  selector: {matchLabels: {app: train}}
  template:
    metadata: {labels: {app: train}}
    spec:
      nodeSelector: {kubernetes.io/hostname: %(node)s}
      containers: [{name: train, image: example.com/train:1}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: train, namespace: e2e-ml}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: train}}
"""


def test_a_driver_rollout_blocked_by_a_budget_waits_cordoned_then_ends_uncordoned(
    cluster: Cluster,
) -> None:
    applied = cluster.kubectl("apply", "-f", "-", stdin=WORKLOAD % {"node": GPU_NODE})
    assert applied.returncode == 0, applied.stderr
    # (rollout status, not `wait pod -l`: that fails at once while the ReplicaSet has
    # not created the pod yet)
    waited = cluster.kubectl(
        "rollout", "status", "-n", "e2e-ml", "deployment/train", "--timeout=60s"
    )
    assert waited.returncode == 0, waited.stderr
    (cluster.inventory / "host_vars").mkdir(exist_ok=True)
    (cluster.inventory / "host_vars" / f"{GPU_NODE}.yml").write_text(
        'driver_version: "535.261.03"\n'
    )
    result = cluster.reconcile()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "drain blocked" in result.stdout, result.stdout
    node = cluster.get("node", GPU_NODE)
    assert node["spec"].get("unschedulable") is True, "the node stays cordoned"
    status = cluster.runner("status")
    assert "rollout cordoned: drain blocked" in status.stdout, status.stdout
    assert "PodDisruptionBudget e2e-ml/train allows no disruption" in status.stdout
    history = cluster.history()
    blocked = [e for e in history if e["component"] == "drain-blocked"]
    assert "e2e-ml/train-" in blocked[-1]["summary"], "the blocking pod is named"
    loaded = cluster.on_node(
        GPU_NODE, "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"
    )
    assert loaded == "535.309.01", "nothing changed on the node"
    # The budget allows the eviction now: the next cycle drains, applies, uncordons.
    relaxed = cluster.kubectl(
        "patch",
        "pdb",
        "-n",
        "e2e-ml",
        "train",
        "--type=merge",
        "-p",
        '{"spec": {"minAvailable": 0}}',
    )
    assert relaxed.returncode == 0, relaxed.stderr
    result = cluster.reconcile()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{GPU_NODE}: rolled-out" in result.stdout, result.stdout
    assert not cluster.get("node", GPU_NODE)["spec"].get("unschedulable")
    loaded = cluster.on_node(
        GPU_NODE, "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"
    )
    assert loaded == "535.261.03"
    phases = [e["component"] for e in cluster.history() if e["kind"] == "rollout"]
    assert phases[-7:] == [
        "queued",
        "cordoned",
        "drain-blocked",
        "drained",
        "applying",
        "applied",
        "done",
    ]


def test_a_gpu_fallen_off_the_bus_is_cordoned_drained_rebooted_and_uncordoned(
    cluster: Cluster,
) -> None:
    """Xid 79 on the T4 (`fleet.py fault … lost`): the node is cordoned and drained
    (the workload's pods evicted, its budget now allowing it) with its GPU health label
    saying what the GPU asks, rebooted under the inventory's driver_reboot_policy,
    applied, read again and uncordoned, the label removed."""
    faulted = subprocess.run([*FLEET, "fault", GPU_NODE, "lost", "--gpu", "0"], check=False)
    assert faulted.returncode == 0
    watch = cluster.watch_node(GPU_NODE)
    try:
        result = cluster.reconcile()
    finally:
        watch.terminate()
    seen = [line.strip() for line in watch.communicate()[0].splitlines()]
    assert result.returncode == 0, result.stdout + result.stderr
    assert "true reboot" in seen, seen  # cordoned, labelled nvidia.com/gpu.health=reboot
    assert "nvidia.com/gpu.health" not in cluster.labels(GPU_NODE)
    said = next((ln for ln in result.stdout.splitlines() if f"{GPU_NODE}:" in ln), "")
    # (the lost GPU also shows as drift: what the node's GPU services hold is gone)
    assert f"{GPU_NODE}: rolled-out; because " in said, result.stdout
    assert "GPU reboot owed" in said and "remediated by a reboot; health check passed" in said
    assert not cluster.get("node", GPU_NODE)["spec"].get("unschedulable")
    history = cluster.history()
    phases = [e["component"] for e in history if e["kind"] == "rollout"]
    assert phases[-6:] == ["queued", "cordoned", "drained", "applying", "applied", "done"]
    health = [e["summary"] for e in history if e["kind"] == "health"]
    assert health[-1] == "remediated by a reboot; health check passed", health


def test_a_site_preferring_a_taint_has_the_node_tainted_not_left_cordoned(
    cluster: Cluster,
) -> None:
    """The same fault on a host with gpufleet_health_out_of_service: taint: the node is
    kept free of new pods by the NoSchedule taint nvidia.com/gpu.health=reboot, not a
    cordon; its drain cordons it only while the pods are evicted (k8s_drain's way), and
    it is rebooted, applied, read again and put back with the taint off and the site's
    own taint kept. (--health-window 0: the remediation before this one does not make
    this one a quarantine.)"""
    host_vars = cluster.inventory / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / f"{GPU_NODE}.yml").write_text("gpufleet_health_out_of_service: taint\n")
    site_taint = "example.com/maintenance=planned:PreferNoSchedule"
    assert cluster.kubectl("taint", "node", GPU_NODE, site_taint).returncode == 0
    faulted = subprocess.run([*FLEET, "fault", GPU_NODE, "lost", "--gpu", "0"], check=False)
    assert faulted.returncode == 0
    watch = cluster.watch_node(GPU_NODE, TAINTED)
    try:
        result = cluster.runner("reconcile", "--once", *SHORT_BACKOFF, "--health-window", "0")
    finally:
        watch.terminate()
    seen = [line.strip() for line in watch.communicate()[0].splitlines()]
    assert result.returncode == 0, result.stdout + result.stderr
    said = next((ln for ln in result.stdout.splitlines() if f"{GPU_NODE}:" in ln), "")
    assert "remediated by a reboot; health check passed" in said, result.stdout
    # Tainted before the drain, cordoned by it, uncordoned the moment it ended, and
    # still tainted through the reboot and the apply.
    assert seen.index("rebootNoSchedule") < seen.index("true rebootNoSchedule"), seen
    assert seen.index("true rebootNoSchedule") < len(seen) - 1 - seen[::-1].index(
        "rebootNoSchedule"
    ), seen
    node = cluster.get("node", GPU_NODE)
    assert not node["spec"].get("unschedulable")
    assert [(t["key"], t.get("value"), t["effect"]) for t in node["spec"].get("taints", [])] == [
        ("example.com/maintenance", "planned", "PreferNoSchedule")
    ]
    assert "nvidia.com/gpu.health" not in node["metadata"].get("labels", {})
    phases = [e["component"] for e in cluster.history() if e["kind"] == "rollout"]
    assert phases[-6:] == ["queued", "cordoned", "drained", "applying", "applied", "done"]

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The cluster side's record and its drift check (module_utils/k8s_state.py).

The live objects here are shaped as the API server returns them (defaults, status,
managedFields and others' labels added); tests/e2e/test_cluster_e2e.py and the
molecule cluster scenario check the same against a real API server.
"""

from __future__ import annotations

import copy

from test_k8s_manifests import FLEETS, in_mode, settings

from ansible_collections.gpufleet.nvidia.plugins.filter import k8s
from ansible_collections.gpufleet.nvidia.plugins.module_utils import k8s_state

DAEMONSET = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {"name": "plugin", "namespace": "gpufleet", "labels": {"a": "b"}},
    "spec": {
        "template": {
            "spec": {
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                "containers": [
                    {
                        "name": "plugin",
                        "image": "nvcr.io/nvidia/k8s-device-plugin:v0.19.3",
                        "ports": [{"name": "metrics", "containerPort": 9400}],
                        "resources": {"limits": {"memory": 1}},
                        "env": [{"name": "KUBECONFIG", "value": ""}],
                    }
                ],
            }
        }
    },
}


def live(obj: dict) -> dict:
    """`obj` as the API server gives it back: defaults and status added."""
    served = copy.deepcopy(obj)
    served["metadata"]["uid"] = "1234"
    served["metadata"]["labels"]["someone.else/label"] = "x"
    container = served["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolicy"] = "IfNotPresent"
    container["ports"][0]["protocol"] = "TCP"
    container["resources"]["limits"]["memory"] = "1"
    container["env"][0].pop("value")  # an empty string is left out
    served["status"] = {"numberReady": 1}
    return served


def record() -> dict:
    return k8s_state.new_record(None, [DAEMONSET], [], [])


def test_what_the_server_adds_is_not_drift() -> None:
    assert k8s_state.drift(record(), [live(DAEMONSET)], []) == []


def test_an_edited_field_is_drift_and_named() -> None:
    edited = live(DAEMONSET)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "example.com/other:1"
    (item,) = k8s_state.drift(record(), [edited], [])
    assert (item["component"], item["kind"], item["name"]) == ("cluster", "DaemonSet", "plugin")
    assert item["current"] == "changed: spec.template.spec.containers[plugin].image"


def test_a_removed_toleration_is_drift() -> None:
    edited = live(DAEMONSET)
    edited["spec"]["template"]["spec"]["tolerations"] = []
    assert k8s_state.drift(record(), [edited], [])[0]["current"].startswith("changed: spec")


def test_a_deleted_object_is_drift() -> None:
    (item,) = k8s_state.drift(record(), [], [])
    assert (item["kind"], item["current"]) == ("DaemonSet", None)


def test_a_removed_or_changed_label_is_drift_of_that_nodes_host() -> None:
    nodes = [{"host": "h1", "name": "node-1", "labels": {"nvidia.com/gpu.present": "true"}}]
    kept = k8s_state.new_record(None, [], nodes, ["h1"])
    node = {"metadata": {"name": "node-1", "labels": {"nvidia.com/gpu.present": "true", "x": "y"}}}
    assert k8s_state.drift(kept, [], [node]) == []
    node["metadata"]["labels"].pop("nvidia.com/gpu.present")
    (item,) = k8s_state.drift(kept, [], [node])
    assert (item["kind"], item["host"]) == ("node-labels", "h1")
    assert item["current"] == {"nvidia.com/gpu.present": None}
    # A Node that left the cluster is nothing to repair.
    assert k8s_state.drift(kept, [], []) == []


def test_nodes_this_apply_could_not_describe_keep_their_entry_while_in_the_inventory() -> None:
    first = k8s_state.new_record(
        None,
        [],
        [
            {"host": "h1", "name": "n1", "labels": {"l": "1"}},
            {"host": "h2", "name": "n2", "labels": {"l": "2"}},
        ],
        ["h1", "h2"],
    )
    second = k8s_state.new_record(
        first, [], [{"host": "h1", "name": "n1", "labels": {"l": "3"}}], ["h1", "h2"]
    )
    assert second["nodes"] == {
        "n1": {"host": "h1", "labels": {"l": "3"}},
        "n2": {"host": "h2", "labels": {"l": "2"}},
    }
    third = k8s_state.new_record(second, [], [], ["h1"])
    assert list(third["nodes"]) == ["n1"], "a host gone from the inventory is forgotten"


def test_the_record_round_trips_through_its_configmap_and_is_never_pruned() -> None:
    configmap = k8s.k8s_record(None, [DAEMONSET], [], ["h1"], "gpufleet")
    assert configmap["metadata"]["name"] == "gpufleet-applied"
    assert "app.kubernetes.io/managed-by" not in configmap["metadata"]["labels"]
    assert k8s.k8s_drift(configmap, [live(DAEMONSET)], []) == {"recorded": True, "drift": []}
    assert k8s.k8s_drift(None, [], []) == {"recorded": False, "drift": []}
    broken = {"data": {"applied.json": "{not json"}}
    assert k8s.k8s_drift(broken, [], [])["recorded"] is False


def test_an_exporter_pruned_because_no_node_runs_it_in_cluster_mode_is_not_drift() -> None:
    """Every exporter moved to host mode: the apply prunes the exporter's objects and
    records what it sent, so the probe that follows finds no drift; against the
    earlier record the same cluster would be missing the exporter."""

    def listed(objects: list[dict]) -> list[dict]:
        # As the API server returns them: status and others' labels added.
        served = copy.deepcopy(objects)
        for obj in served:
            obj["metadata"]["uid"] = "1234"
            obj["metadata"]["labels"]["someone.else/label"] = "x"
            obj["status"] = {}
        return served

    hosts = ["h100", "t4", "cpu"]
    before = k8s.k8s_manifests(FLEETS["plain"], settings())
    old = k8s.k8s_record(None, before["objects"], before["nodes"], hosts, "gpufleet")
    after = k8s.k8s_manifests([in_mode(h, "host") for h in FLEETS["plain"]], settings(), None, old)
    new = k8s.k8s_record(old, after["objects"], after["nodes"], hosts, "gpufleet")
    cluster = listed(after["objects"])  # the exporter pruned
    nodes = [{"metadata": {"name": n["name"], "labels": n["labels"]}} for n in after["nodes"]]
    assert k8s.k8s_drift(new, cluster, nodes) == {"recorded": True, "drift": []}
    missing = {(d["kind"], d["name"]) for d in k8s.k8s_drift(old, cluster, nodes)["drift"]}
    assert ("DaemonSet", "nvidia-dcgm-exporter") in missing

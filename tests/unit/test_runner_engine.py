"""The runner judges stage outcomes as the collection's gating does, and turns
ansible-runner events into what a plan shows."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.nvidia.plugins.filter import summary
from runner.engine import ROLLOUT_TASK, STAGES, Change, EventCollector, HostRun, stage_passed

OUTCOMES = [
    {"status": "ready"},
    {"status": "pre-installed"},
    {"status": "disabled"},
    {"status": "unmanaged", "validated": True},
    {"status": "unmanaged", "validated": False},
    {"status": "failed", "reason": "no such version"},
    {"status": "reboot-required"},
]


@pytest.mark.parametrize("outcome", OUTCOMES, ids=lambda o: f"{o['status']}-{o.get('validated')}")
def test_stage_passed_agrees_with_the_collection(outcome):
    assert stage_passed(outcome) == summary.stage_passed(outcome)


def test_stages_are_the_collections():
    assert tuple(name for name, _fact in summary.STAGES) == STAGES


def test_an_answering_unmanaged_driver_is_no_failure():
    stages = {s: {"status": "ready"} for s in STAGES}
    stages["driver"] = {"status": "unmanaged", "validated": True}
    assert HostRun("a", stages=stages).succeeded
    stages["driver"] = {"status": "unmanaged", "validated": False, "reason": "no driver"}
    assert HostRun("a", stages=stages).failed_stage == ("driver", "no driver")
    assert HostRun("a", stages={"driver": {"status": "not-a-gpu-node"}}).succeeded


def test_a_planned_mig_layout_change_is_disruptive_a_rewritten_layouts_file_is_not():
    stages = {s: {"status": "ready"} for s in STAGES}
    copy = [Change("mig", "Put the MIG layouts on the node")]
    assert not HostRun("a", changes=copy, stages=stages).disruptive
    stages["mig"]["disruptive"] = True  # mig-parted found the GPUs off the layout
    say = [Change("mig", "Say what applying would change")]
    assert HostRun("a", changes=say, stages=stages).disruptive


def _ok(task: str, action: str, res: dict) -> dict:
    data = {"host": "a", "role": "driver", "task": task, "task_action": action, "res": res}
    return {"event": "runner_on_ok", "event_data": data}


def test_a_plan_shows_the_file_on_the_node_and_a_prediction_in_words():
    collector = EventCollector()
    pin = {
        "changed": True,
        "diff": [
            {
                "before_header": "/etc/apt/preferences.d/gpufleet-nvidia-driver.pref",
                "after_header": "/root/.ansible/tmp/ansible-local-1/tmpx/apt-pin.pref.j2",
                "before": "Pin: version 535.309.01-*\n",
                "after": "Pin: version 535.261.03-*\n",
            }
        ],
    }
    new_file = {
        "changed": True,
        "diff": [{"before": "", "after_header": "/tmp/x/pin.j2", "after": "Pin: version 1\n"}],
        "invocation": {"module_args": {"dest": "/etc/apt/preferences.d/new.pref"}},
    }
    said = {"changed": True, "msg": "would replace driver 535.309.01 with 535.261.03"}
    quiet = {"changed": True, "msg": "All items completed"}
    collector(_ok("Pin the driver", "ansible.builtin.template", pin))
    collector(_ok("Pin anew", "ansible.builtin.template", new_file))
    collector(_ok("Predict the replacement", "ansible.builtin.debug", said))
    collector(_ok("Install", "ansible.builtin.apt", quiet))
    diff, created, prediction, install = collector.hosts["a"].changes
    assert created.diff.splitlines()[0] == "--- /etc/apt/preferences.d/new.pref (now)"
    assert diff.diff.splitlines()[:2] == [
        "--- /etc/apt/preferences.d/gpufleet-nvidia-driver.pref (now)",
        "+++ /etc/apt/preferences.d/gpufleet-nvidia-driver.pref (planned)",
    ]
    assert "+Pin: version 535.261.03-*" in diff.diff
    assert prediction.diff == "would replace driver 535.309.01 with 535.261.03"
    assert install.diff == "", "a module's message is not a diff"


def test_the_cluster_probe_and_a_node_action_are_read_from_their_events():
    collector = EventCollector()
    probe = {
        "ansible_facts": {
            "k8s_manifests_probe": {
                "recorded": True,
                "drift": [
                    {"component": "cluster", "kind": "node-labels", "name": "n1", "host": "a"}
                ],
            }
        }
    }
    event = _ok("Compare the cluster with the record", "ansible.builtin.set_fact", probe)
    event["event_data"].update(host="localhost", role="k8s_manifests")
    collector(event)
    cordon = _ok(ROLLOUT_TASK, "kubernetes.core.k8s_drain", {"changed": False})
    cordon["event_data"]["role"] = ""
    collector(cordon)
    cluster = collector.probes["localhost"]
    assert cluster.recorded
    assert [(d["component"], d["host"]) for d in cluster.drift] == [("cluster", "a")]
    assert collector.hosts["a"].action_changed is False, "the node was cordoned already"


def _failed(task: str, role: str, msg: str) -> dict:
    data = {"host": "a", "role": role, "task": task, "task_action": "command", "res": {"msg": msg}}
    return {"event": "runner_on_failed", "event_data": data}


def test_a_stage_failure_its_outcome_answers_is_judged_by_the_outcome():
    """A check of the validator fails in check mode because the toolkit's spec is not
    written yet: the stage rescues it and says "unverified"; the plan is no failure."""
    collector = EventCollector()
    collector(_failed("Check that the CDI spec lists every GPU", "validator", "rc 1"))
    outcome = {"status": "unverified", "reason": "Check that the CDI spec lists every GPU"}
    publish = _ok(
        "Publish", "ansible.builtin.set_fact", {"ansible_facts": {"validator_stage": outcome}}
    )
    publish["event_data"]["role"] = "validator"
    collector(publish)
    collector(_failed("Apply the objects", "k8s_manifests", "connection refused"))
    collector.finish("failed")
    assert collector.hosts["a"].failures == ["k8s_manifests: Apply the objects: connection refused"]


def test_a_stage_that_stopped_before_its_outcome_is_a_failure():
    collector = EventCollector()
    collector(_failed("Install the driver packages", "driver", "no such version"))
    collector.finish("failed")
    assert collector.hosts["a"].failures == ["driver: Install the driver packages: no such version"]
    assert not collector.hosts["a"].succeeded

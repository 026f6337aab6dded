"""The runner judges stage outcomes as the collection's gating does, and turns
ansible-runner events into what a plan shows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.filter import summary
from runner.engine import (
    FORKS_VARIABLE,
    PROBE_MODULE,
    ROLLOUT_MODULE,
    STAGES,
    VERDICT_TAG,
    AnsibleEngine,
    Change,
    EngineError,
    EventCollector,
    HostRun,
    default_forks,
    inventory_forks,
    project_hash,
    stage_passed,
)

PROJECT = Path(__file__).resolve().parents[2]

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
    data = {
        "host": "a",
        "role": "driver",
        "task": task,
        "task_action": action,
        "resolved_action": action,
        "res": res,
    }
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
    cordon = _ok("Any name", ROLLOUT_MODULE, {"changed": False})
    cordon["event_data"]["role"] = ""
    collector(cordon)
    cluster = collector.probes["localhost"]
    assert cluster.recorded
    assert [(d["component"], d["host"]) for d in cluster.drift] == [("cluster", "a")]
    assert collector.hosts["a"].action_changed is False, "the node was cordoned already"


def test_a_slurm_action_is_read_from_its_fact():
    collector = EventCollector()
    fact = {"managed": True, "state": "MIXED+DRAIN", "admin_drained": False, "jobs": ["41"]}
    res = {"ansible_facts": {"gpufleet_slurm": fact}}
    event = _ok("Publish the node's Slurm side", "ansible.builtin.set_fact", res)
    event["event_data"]["role"] = ""
    collector(event)
    assert collector.hosts["a"].slurm == fact


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


def _tasks(playbook: str) -> list[dict]:
    plays = yaml.safe_load((PROJECT / playbook).read_text())
    found = []
    for play in plays:
        for task in play.get("tasks", []):
            found.extend([task, *task.get("block", [])])
    return found


def test_the_probe_is_found_by_its_module_whatever_its_task_is_called():
    collector = EventCollector()
    probe = {"changed": False, "recorded": True, "drifted": True, "drift": {"exporter": [{}]}}
    collector(_ok("A task renamed by someone", PROBE_MODULE, probe))
    record = {"changed": True, "digest": "abc"}  # the same module in record.yml
    collector(_ok("Record the managed state", PROBE_MODULE, record))
    assert collector.probes["a"].recorded
    assert [d["component"] for d in collector.probes["a"].drift] == ["exporter"], (
        "the record written after it is no probe"
    )


def test_the_playbooks_use_the_modules_and_tag_the_engine_reads():
    probes = [t for t in _tasks("playbooks/probe.yml") if PROBE_MODULE in t]
    assert len(probes) == 1 and probes[0][PROBE_MODULE].get("state", "probe") == "probe"
    assert [t for t in _tasks("playbooks/rollout.yml") if ROLLOUT_MODULE in t]
    verdicts = [t for t in _tasks("playbooks/report.yml") if "ansible.builtin.fail" in t]
    assert [t.get("tags") for t in verdicts] == [[VERDICT_TAG]], (
        "the runner skips the fleet-wide verdict by this tag; untagged, it would count "
        "as a failure of whichever host ran it"
    )


def test_forks_default_to_one_per_host_up_to_ten_per_cpu():
    assert default_forks(3, cpus=2) == 3
    assert default_forks(50, cpus=2) == 20
    assert default_forks(0, cpus=2) == 1


def test_the_inventory_sets_forks_once_for_the_fleet():
    assert inventory_forks({"a": {}, "b": {}}) is None
    assert inventory_forks({"a": {FORKS_VARIABLE: 25}, "b": {FORKS_VARIABLE: "25"}}) == 25
    with pytest.raises(EngineError, match=f"{FORKS_VARIABLE} on host b: expected a positive"):
        inventory_forks({"a": {FORKS_VARIABLE: 4}, "b": {FORKS_VARIABLE: "many"}})
    with pytest.raises(EngineError, match=r"expected one value for the whole inventory.*a 4, b 8"):
        inventory_forks({"a": {FORKS_VARIABLE: 4}, "b": {FORKS_VARIABLE: 8}})


def test_a_run_beside_the_loops_runs_has_its_own_run_directory(tmp_path: Path):
    """ansible-runner rotates the runs of a directory: a batch applying beside the
    loop's probes keeps its own, with the same inventory, forks and variables."""
    engine = AnsibleEngine(
        tmp_path, "inventory.yml", tmp_path / "ansible", forks=7, extravars={"x": 1}
    )
    other = engine.beside()
    assert other.work_dir == tmp_path / "ansible" / "beside"
    assert engine.work_dir == tmp_path / "ansible"
    assert (other.inventory_path, other.forks, other.extravars) == ("inventory.yml", 7, {"x": 1})


def test_the_project_hash_follows_what_runs_not_its_documentation(tmp_path: Path):
    tasks = tmp_path / "roles" / "driver" / "tasks" / "main.yml"
    tasks.parent.mkdir(parents=True)
    tasks.write_text("- ansible.builtin.debug: {msg: one}\n")
    readme = tmp_path / "roles" / "driver" / "README.md"
    readme.write_text("# The driver stage\n")
    fragment = tmp_path / "collections" / "ansible_collections" / "changelogs" / "f.yaml"
    fragment.parent.mkdir(parents=True)
    fragment.write_text("minor_changes: [a]\n")
    before = project_hash(tmp_path)
    readme.write_text("# The driver stage, explained better\n")
    fragment.write_text("minor_changes: [a, b]\n")
    assert project_hash(tmp_path) == before
    tasks.write_text("- ansible.builtin.debug: {msg: two}\n")
    assert project_hash(tmp_path) != before

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The runner judges stage outcomes as the collection's gating does, turns
ansible-runner events into what a plan shows, and reads the inventory and the
project as ansible-inventory and the files themselves say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.filter import summary
from conftest import local_inventory
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
    desired_hash,
    inventory_forks,
    project_hash,
    stage_passed,
)
from runner.progress import Progress, RunProgress
from runner.runs import REMEDY_FACT

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
    copy = [
        Change(
            "mig",
            "Put the MIG layouts on the node, and point nvidia-mig-manager at them"
            " and at the layout",
        )
    ]
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
    # gpufleet.nvidia.files names each file in its own diff.
    markers = {
        "changed": True,
        "diff": [
            {
                "before_header": "/run/v/toolkit-ready",
                "after_header": "/run/v/toolkit-ready",
                "before": "absent\n",
                "after": "present\n",
            },
            {
                "before_header": "/run/v/cuda-ready",
                "after_header": "/run/v/cuda-ready",
                "before": "present\n",
                "after": "absent\n",
            },
        ],
        "invocation": {"module_args": {"files": [{"path": "/run/v/toolkit-ready"}]}},
    }
    collector(_ok("Markers", "gpufleet.nvidia.files", markers))
    diff, created, prediction, install, both = collector.hosts["a"].changes
    assert [line for line in both.diff.splitlines() if line.startswith("---")] == [
        "--- /run/v/toolkit-ready (now)",
        "--- /run/v/cuda-ready (now)",
    ]
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


def test_a_remediation_is_read_from_the_fact_the_driver_role_sets():
    """The fact's name is the one roles/driver/tasks/remediate.yml sets."""
    tasks = yaml.safe_load((PROJECT / "roles/driver/tasks/remediate.yml").read_text())
    set_facts = [t["ansible.builtin.set_fact"] for t in tasks if "ansible.builtin.set_fact" in t]
    assert any(REMEDY_FACT in facts for facts in set_facts)
    collector = EventCollector()
    fact = {"done": "reboot", "reset_failed": "GPU Reset couldn't run", "waits": False}
    res = {"ansible_facts": {REMEDY_FACT: fact}}
    event = _ok("Record what was done", "ansible.builtin.set_fact", res)
    event["event_data"]["role"] = "driver"
    collector(event)
    assert collector.hosts["a"].remedy == fact
    assert collector.hosts["a"].changes == []


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


WRAPPED = (
    "Task failed: Finalization of task args for 'ansible.builtin.set_fact' failed: Error "
    "while resolving value for '_device_plugin_config': The filter plugin "
    "'gpufleet.nvidia.device_plugin_config' failed: sim-a100: GPU(s) 0, 1 have MIG enabled"
)


def test_a_refusal_raised_while_templating_is_in_the_roles_words_alone():
    """ansible-core wraps an error a filter raises in its own words; what reaches the
    host's failures is the filter's message (a module's failure keeps its task)."""
    collector = EventCollector()
    collector(_failed("Render the device plugin's config", "device_plugin", WRAPPED))
    collector(_failed("Install the plugin", "device_plugin", "No package matching 'x'"))
    collector.finish("failed")
    assert collector.hosts["a"].failures == [
        "device_plugin: sim-a100: GPU(s) 0, 1 have MIG enabled",
        "device_plugin: Install the plugin: No package matching 'x'",
    ]


def test_the_runner_and_the_collection_unwrap_alike():
    from ansible_collections.gpufleet.nvidia.plugins.filter import failures
    from runner.runs import UNWRAP

    assert UNWRAP.pattern == failures.WRAPPING.pattern


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
    assert collector.hosts["a"].record_changed, "a record written anew is said"


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
    # The controller's own plugin (playbooks/callback_plugins) changes nothing on a node.
    callback = tmp_path / "playbooks" / "callback_plugins" / "gpufleet_module_cache.py"
    callback.parent.mkdir(parents=True)
    callback.write_text("# one\n")
    before = project_hash(tmp_path)
    readme.write_text("# The driver stage, explained better\n")
    fragment.write_text("minor_changes: [a, b]\n")
    callback.write_text("# two\n")
    assert project_hash(tmp_path) == before
    tasks.write_text("- ansible.builtin.debug: {msg: two}\n")
    assert project_hash(tmp_path) != before


def test_the_project_is_hashed_again_only_when_a_file_of_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    tasks = tmp_path / "roles" / "driver" / "tasks" / "main.yml"
    tasks.parent.mkdir(parents=True)
    tasks.write_text("- ansible.builtin.debug: {msg: one}\n")
    (tmp_path / "site.yml").write_text("- import_playbook: playbooks/x.yml\n")
    reads: list[Path] = []
    read_bytes = Path.read_bytes

    def counted(path: Path) -> bytes:
        reads.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counted)
    engine = AnsibleEngine(tmp_path, "inventory.yml", tmp_path / "ansible")

    def hashed() -> str:
        reads.clear()
        desired = engine.desired_hashes({"a": {"x": 1}})
        return desired["a"]

    first = hashed()
    assert len(reads) == 2
    assert first == desired_hash(project_hash(tmp_path), {"x": 1})
    assert hashed() == first and reads == [], "an unchanged project is not read again"
    tasks.write_text("- ansible.builtin.debug: {msg: two, more: 1}\n")
    edited = hashed()
    assert edited != first and reads, "an edited role is hashed again"
    stat = tasks.stat()
    tasks.write_text("- ansible.builtin.debug: {msg: six, more: 1}\n")  # the same size
    os.utime(tasks, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert hashed() not in (first, edited)
    same = hashed()
    (tasks.parent / "extra.yml").write_text("- ansible.builtin.debug: {msg: x}\n")
    assert hashed() != same, "a file added to a role counts"
    (tasks.parent / "extra.yml").unlink()
    assert hashed() == same and reads, "and so does its removal"


# ansible-inventory --list against the engine's in-process reading, in a Python of
# their own: Ansible keeps its configuration from its first import in a process (here
# the engine's), and the tests before may have imported it in pytest's.
_COMPARE = """
import json, os, sys
from pathlib import Path
from runner import engine, inventory

project, work, cases = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
environ = dict(os.environ)
in_process = inventory.ansible

def read(case, how):
    inventory.ansible = in_process if how == "in_process" else lambda *_: None
    try:
        reader = engine.AnsibleEngine(project, case["inventory"], work, hosts=case["hosts"])
        hostvars = reader.inventory(case["limit"])
        return {"hostvars": hostvars}
    except engine.EngineError as error:
        return {"error": str(error)}

results = []
for case in cases:
    for path, text in case.get("write", {}).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    results.append({how: read(case, how) for how in ("in_process", "ansible_inventory")})
env = engine.AnsibleEngine(project, "", work)._env()
print(json.dumps({
    "results": results,
    "unusable": inventory._ANSIBLE.unusable(env, project),
    "environ_kept": dict(os.environ) == environ,
}))
"""

_HOSTS = """
all:
  vars: {site: lab}
  hosts:
    bare:
  children:
    gpu_nodes:
      vars: {driver_branch: "550"}
      children:
        h100:
          hosts:
            n1: {ansible_host: 10.0.0.1, gpusim_profile: h100-sxm-8}
            n2:
        t4:
          hosts:
            n3:
    login:
      hosts:
        l1: {ansible_user: admin}
"""
_SITE = {
    "hosts.yml": _HOSTS,
    # Through ansible-inventory's JSON: a date becomes a string, an integer key a
    # string key, an !unsafe string a marked one.
    "group_vars/all.yml": "ntp: [a, b]\nreleased: 2024-01-02\nby_id: {1: one}\n"
    "raw: !unsafe '{{ not_templated }}'\n",
    "group_vars/gpu_nodes/driver.yml": "driver_branch: '535'\ndriver_reboot_policy: never\n",
    "group_vars/h100.yml": "driver_branch: '560'\nmig: {enabled: true}\n",
    "host_vars/n2.yml": "mig: {enabled: false, layout: all-1g.10gb}\n",
}


def _vaulted(path: Path) -> bool:
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return any("$ANSIBLE_VAULT" in f.read_text() for f in files)


# Name -> (inventory, --limit, files written before the read[, --hosts, default all:
# every host]). TMP is a temporary directory; the repository's inventories are named
# relative to the project.
_CASES: dict[
    str, tuple[str, str | None, dict[str, str]] | tuple[str, str | None, dict[str, str], str]
] = {
    **{
        path.name: (str(path.relative_to(PROJECT)), None, {})
        for path in sorted((PROJECT / "inventories").iterdir())
        if not _vaulted(path)
    },
    "example-limited": ("inventories/example", "gpu_nodes:!hgx_h100", {}),
    "sim-limited": ("inventories/sim", "sim-t4,sim-a100", {}),
    "children-group-vars-host-vars": (
        "TMP/site",
        None,
        {f"TMP/site/{n}": t for n, t in _SITE.items()},
    ),
    "limit-a-parent-group": ("TMP/site", "gpu_nodes", {}),
    "limit-hosts-of-a-file": ("TMP/site/hosts.yml", "n2,l1", {}),
    "limit-an-intersection": ("TMP/site", "h100:&gpu_nodes", {}),
    "host-vars-added-since": ("TMP/site", None, {"TMP/site/host_vars/n3.yml": "x: 3\n"}),
    "ini": ("TMP/hosts.ini", None, {"TMP/hosts.ini": "[gpu]\nn-a p=t4-1 f=3\n[gpu:vars]\ny=no\n"}),
    "host-list": ("n5,n6,", None, {}),
    "limit-matching-no-host": ("TMP/site", "no-such-host", {}),
    "limit-from-a-missing-file": ("TMP/site", "@TMP/no-such-file", {}),
    "managed-hosts": ("TMP/site", None, {}, "gpu_nodes"),
    "managed-hosts-limited": ("TMP/site", "n3,l1,n1", {}, "gpu_nodes"),
    "managed-hosts-a-pattern": ("TMP/site", None, {}, "gpu_nodes:!t4"),
    "managed-hosts-none": ("TMP/site", None, {}, "dgx"),
    "limit-outside-the-managed-hosts": ("TMP/site", "l1", {}, "gpu_nodes"),
    "managed-hosts-named-in-the-inventory": (
        "TMP/named",
        None,
        {
            "TMP/named/hosts.yml": "gpu_nodes:\n  hosts:\n    n7:\n",
            "TMP/named/group_vars/all.yml": "gpufleet_hosts: dgx\n",
        },
        "gpu_nodes",
    ),
    "unparsable": ("TMP/bad.yml", None, {"TMP/bad.yml": "all:\n  hosts: [unclosed\n"}),
    "missing": ("TMP/missing.yml", None, {}),
}


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each case read by the engine in process and with ansible-inventory, in that
    order, in one Python (so later reads find Ansible imported and its caches warm)."""
    tmp = str(tmp_path_factory.mktemp("inventories"))
    cases = [
        {
            # The repository's inventories by their path: the engine reads from where
            # it was started (here not the project), as -i would.
            "inventory": inventory.replace("TMP", tmp)
            if inventory.startswith("TMP") or "," in inventory
            else str(PROJECT / inventory),
            "limit": limit and limit.replace("TMP", tmp),
            "write": {path.replace("TMP", tmp): text for path, text in files.items()},
            "hosts": hosts[0] if hosts else "all",
        }
        for inventory, limit, files, *hosts in _CASES.values()
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _COMPARE, str(PROJECT), f"{tmp}/work", json.dumps(cases)],
        capture_output=True,
        text=True,
        cwd=tmp,  # not the project: the engine reads from where it was started
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    return {**run, "results": dict(zip(_CASES, run["results"], strict=True))}


def test_the_inventory_is_read_in_process_leaving_the_environment_as_it_was(compared):
    assert compared["unusable"] == "", "the engine fell back to ansible-inventory"
    assert compared["environ_kept"]


@pytest.mark.parametrize("case", list(_CASES))
def test_the_inventory_read_in_process_is_ansible_inventorys(compared, case: str):
    """The same hosts with the same variables, even in JSON (and so the same desired
    state hashes); the same errors, in Ansible's words rather than its output's."""
    read = compared["results"][case]
    ours, theirs = read["in_process"], read["ansible_inventory"]
    if "error" in theirs:
        assert ours["error"].split(": ")[0] == theirs["error"].split(": ")[0]
        return
    assert ours == theirs
    assert json.dumps(ours) == json.dumps(theirs), "the same order too"


def test_the_inventorys_variables_are_ansibles(compared):
    hostvars = compared["results"]["host-vars-added-since"]["in_process"]["hostvars"]
    assert list(hostvars) == ["bare", "l1", "n1", "n2", "n3"]
    assert hostvars["n1"]["driver_branch"] == "560", "h100 is a child of gpu_nodes"
    assert hostvars["n3"]["driver_branch"] == "535", "group_vars over the group's vars"
    assert hostvars["n3"]["x"] == 3, "a host_vars file added between two reads"
    assert hostvars["n2"]["mig"] == {"enabled": False, "layout": "all-1g.10gb"}
    assert hostvars["bare"]["released"] == "2024-01-02"
    assert hostvars["bare"]["by_id"] == {"1": "one"}
    assert hostvars["bare"]["raw"] == {"__ansible_unsafe": "{{ not_templated }}"}
    assert not {"inventory_hostname", "groups", "playbook_dir"} & set(hostvars["bare"])
    limited = compared["results"]["limit-an-intersection"]["in_process"]["hostvars"]
    assert list(limited) == ["n1", "n2"]


def test_an_unreadable_inventory_is_an_error_in_ansibles_words(compared):
    error = compared["results"]["unparsable"]["in_process"]["error"]
    assert error.startswith("inventory ") and " cannot be read: No inventory was parsed" in error
    assert "Failed to parse inventory with 'yaml' plugin: YAML parsing failed" in error
    error = compared["results"]["limit-matching-no-host"]["in_process"]["error"]
    assert error.startswith("--limit 'no-such-host' matches no host gpufleet manages in ")


def test_only_the_managed_hosts_are_read(compared):
    """The hosts of --hosts (the group gpu_nodes by default), of those --limit leaves;
    a site's other hosts (bare, the login node l1) are not among them."""
    results = compared["results"]
    assert list(results["managed-hosts"]["in_process"]["hostvars"]) == ["n1", "n2", "n3"]
    assert list(results["managed-hosts-limited"]["in_process"]["hostvars"]) == ["n1", "n3"]
    assert list(results["managed-hosts-a-pattern"]["in_process"]["hostvars"]) == ["n1", "n2"]
    error = results["managed-hosts-none"]["in_process"]["error"]
    assert error.startswith("no host of inventory ") and " is in 'dgx', the hosts gpufleet" in error
    assert "put the GPU nodes in a group gpu_nodes, or name them with --hosts PATTERN" in error
    error = results["limit-outside-the-managed-hosts"]["in_process"]["error"]
    assert error.startswith("--limit 'l1' matches no host gpufleet manages in inventory ")
    assert error.endswith("(the hosts of 'gpu_nodes': --hosts PATTERN names others)")
    # A play's hosts are chosen before inventory variables exist: set there, it would
    # be silently ignored by ansible-playbook.
    error = results["managed-hosts-named-in-the-inventory"]["in_process"]["error"]
    assert error.startswith("gpufleet_hosts is set in inventory ") and "(on n7)" in error
    assert error.endswith("give the pattern as --hosts (now 'gpu_nodes')")


def test_a_runtime_change_is_disruptive_only_where_its_restart_stops_containers():
    stages = {s: {"status": "ready"} for s in STAGES}
    stages["runtime_config"].update(changed=["containerd"], disruptive=[])
    change = [Change("runtime_config", "Put the nvidia runtime into each runtime's configuration")]
    assert not HostRun("a", changes=change, stages=stages).disruptive, "nothing runs on it"
    stages["runtime_config"]["disruptive"] = ["containerd"]
    assert HostRun("a", changes=change, stages=stages).disruptive


def test_a_failed_tasks_progress_line_names_the_runs_ansible_output(tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "fail.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Fail here\n      ansible.builtin.fail:\n        msg: broken on purpose\n"
    )
    inventory = local_inventory(tmp_path / "inventory.yml", "n1")
    said: list[tuple[str, str]] = []

    class Said(Progress):
        def said(self, run: RunProgress, host: str, text: str) -> None:
            said.append((host, text))

    engine = AnsibleEngine(project, str(inventory), tmp_path / "ansible", progress=Said())
    engine._run("apply", "fail.yml", ["n1"])
    ((host, line),) = [(h, t) for h, t in said if t.startswith("failed:")]
    assert host == "n1" and line.startswith("failed: Fail here; Ansible's output: "), line
    output = Path(line.split("Ansible's output: ", 1)[1])
    assert output.is_relative_to(tmp_path / "ansible" / "artifacts")
    assert "broken on purpose" in output.read_text()


@pytest.fixture
def pty_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The sleeps taken in this process (ptyprocess's `time` is Python's: recorded, then
    taken). pexpect polls with sleeps of 0.0001 s; ptyprocess's delay after close is 0.1 s."""
    import ptyprocess.ptyprocess as pty_module

    # ptyprocess as it comes, whichever test installed runner.ptyclose before this one
    close = pty_module.PtyProcess.close
    monkeypatch.setattr(pty_module.PtyProcess, "close", getattr(close, "__wrapped__", close))
    sleeps: list[float] = []
    sleep = pty_module.time.sleep

    def recorded(seconds: float) -> None:
        sleeps.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(pty_module.time, "sleep", recorded)
    return sleeps


def test_a_run_closes_its_exited_playbooks_terminal_without_waiting(
    tmp_path: Path, pty_sleeps: list[float]
):
    project = tmp_path / "project"
    project.mkdir()
    (project / "ok.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n"
    )
    inventory = local_inventory(tmp_path / "inventory.yml", "n1")
    engine = AnsibleEngine(project, str(inventory), tmp_path / "ansible")
    assert engine._run("probe", "ok.yml", ["n1"]).hosts["n1"].reachable
    assert max(pty_sleeps, default=0) < 0.01, "ptyprocess waited after the playbook had exited"


def test_a_terminal_whose_process_still_runs_is_closed_as_ptyprocess_does(
    pty_sleeps: list[float],
):
    import pexpect

    from runner import ptyclose

    ptyclose.install()
    child = pexpect.spawn("sleep", ["30"])
    child.close()
    assert pty_sleeps[:1] == [child.ptyproc.delayafterclose] and pty_sleeps[0] > 0
    assert not child.isalive() and child.signalstatus is not None, "the child is stopped"

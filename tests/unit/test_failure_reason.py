# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's failure_reason filter: what a stage's outcome says when a task of
its role failed, on the messages ansible-core 2.19 really gives (captured from
ansible-playbook runs of a failing filter, a fail task and a command)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.nvidia.plugins.filter.failures import failure_reason

FILTER_REFUSAL = {
    "changed": False,
    "msg": "Task failed: Finalization of task args for 'ansible.builtin.set_fact' failed: "
    "Error while resolving value for '_device_plugin_config': The filter plugin "
    "'gpufleet.nvidia.device_plugin_config' failed: sim-a100: GPU(s) 0, 1 have MIG "
    "enabled; set device_plugin_mig_strategy to single or mixed",
}
CONDITIONAL = {"msg": "Task failed: The filter plugin 'boom' failed: hostx: no layout named x"}
FAIL_TASK = {
    "changed": False,
    "msg": "slurm_gres_manage is true for sim-h100-b, but `slurmd -C` did not answer there "
    "(No such file or directory).\nInstall Slurm's slurmd on the node first, or set "
    "slurm_gres_manage to false.",
}
COMMAND = {"msg": "non-zero return code", "rc": 3, "stderr": "err\n  more", "stdout": "out"}
# A command that is not installed (ansible-core 2.19's whole result for argv [docker, info]
# on a node without Docker's client).
NOT_FOUND = {
    "changed": False,
    "cmd": "docker info",
    "exception": "(traceback unavailable)",
    "failed": True,
    "msg": "Error executing command.",
    "rc": 2,
    "stderr": "",
    "stdout": "",
}


@pytest.mark.parametrize(
    ("result", "task", "fields", "reason"),
    [
        (
            FILTER_REFUSAL,
            "Render the config",
            (),
            "sim-a100: GPU(s) 0, 1 have MIG enabled; set device_plugin_mig_strategy to "
            "single or mixed",
        ),
        (CONDITIONAL, "Pick the layout", (), "hostx: no layout named x"),
        (
            FAIL_TASK,
            "Refuse a node without slurmd",
            ("stderr",),
            "Refuse a node without slurmd: slurm_gres_manage is true for sim-h100-b, but "
            "`slurmd -C` did not answer there (No such file or directory). Install Slurm's "
            "slurmd on the node first, or set slurm_gres_manage to false.",
        ),
        (COMMAND, "Run it", ("stderr", "stdout"), "Run it: non-zero return code err more out"),
        ({}, "Run it", (), "Run it: failed"),
        (
            NOT_FOUND,
            "",
            (),
            "Error executing command. (docker info: No such file or directory)",
        ),
    ],
    ids=["filter", "conditional", "fail-task", "command", "no-message", "not-found"],
)
def test_a_reason_is_in_the_words_of_whoever_failed(result, task, fields, reason):
    assert failure_reason(result, task, fields) == reason


def test_a_long_message_is_cut_at_a_word_as_jinjas_truncate_cuts():
    """The limit is the message's (as `msg | truncate(limit)` was): the task's name
    comes on top, and the words that matter at the end of an apt error survive."""
    from jinja2 import Environment

    message = " ".join(("E: Could not get lock " + "word " * 100).split())
    jinja = Environment().from_string("{{ m | truncate(40) }}").render(m=message)
    assert failure_reason({"msg": message}, "Install it", limit=40) == "Install it: " + jinja
    assert failure_reason({"msg": "x" * 44}, "", limit=40) == "x" * 44, "Jinja's leeway"

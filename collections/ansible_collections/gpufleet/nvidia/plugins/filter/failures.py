# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""failure_reason: a failed task's reason in the words of whoever failed it."""

from __future__ import annotations

import os
import re

# What ansible-core wraps around an error raised while it templates a task (a
# filter, lookup or test of ours that refuses, a conditional): the words the role
# wrote come after the last of these (ansible-core 2.19's, and the older
# conditional's). runner.runs.UNWRAP holds the same patterns (a unit test keeps them
# equal).
WRAPPING = re.compile(
    r"^(?:Task failed: "
    r"|Finalization of task args for '[^']*' failed: "
    r"|Error while resolving value for '[^']*': "
    r"|The (?:filter|lookup|test) plugin '[^']*' failed: "
    r"|The conditional check '[^']*' failed\. The error was: )+"
)


def unwrap(message):
    """(the message without Ansible's wrapping, whether there was any)."""
    text = WRAPPING.sub("", message)
    return text, text != message


# ansible-core's message for a command its module could not start (not found, not
# executable), with the errno as rc and nothing else.
NOT_RUN = "Error executing command."


def _command(cmd):
    return " ".join(str(part) for part in cmd) if isinstance(cmd, (list, tuple)) else str(cmd)


def _truncate(text, limit, leeway=5):
    """As Jinja's truncate filter cuts (at a word, "..." after it, a few characters
    of leeway), which the stages used before this filter."""
    if len(text) <= limit + leeway:
        return text
    return text[: limit - 3].rsplit(" ", 1)[0] + "..."


def failure_reason(result, task="", fields=(), limit=300):
    """The reason a task failed, for a stage's outcome: the message (unwrapped)
    followed by what `fields` of the result hold (stderr, stdout, content), on one
    line, cut at about `limit` characters. A module's failure is prefixed with the
    task's name (`task`), which says what was being done; a refusal raised while
    templating stands alone, in the words the role wrote."""
    result = result or {}
    text, wrapped = unwrap(str(result.get("msg") or "failed"))
    if text == NOT_RUN and result.get("cmd") and isinstance(result.get("rc"), int):
        # A command that could not be started: which one, and the system's error
        # (its rc is the errno; ansible-core says no more).
        rc = result["rc"]
        why = os.strerror(rc) if 0 < rc < 256 else f"rc {rc}"
        text = f"{text} ({_command(result['cmd'])}: {why})"
    extra = [str(result.get(name) or "") for name in fields]
    text = _truncate(re.sub(r"\s+", " ", " ".join([text, *extra])).strip(), int(limit))
    return f"{task}: {text}" if task and not wrapped else text


class FilterModule:
    def filters(self):
        return {"failure_reason": failure_reason}

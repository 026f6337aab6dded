# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""One sleep fewer per playbook run: ptyprocess's close() without its wait for a
process whose exit was already collected.

ansible-runner starts ansible-playbook on a pseudo-terminal (pexpect, which uses
ptyprocess), reads it until the process has exited and been reaped, and only then
closes the terminal. ptyprocess's `PtyProcess.close` always sleeps `delayafterclose`
(0.1 s) before it asks whether the child is still alive, to give the kernel time to
update the child's status. Once `isalive()` or `wait()` has collected the exit status
(`terminated` is true) there is nothing left to wait for: the sleep is a fixed 0.1 s
on every run, a tenth of a 5-node sweep (docs/reconciler.md, "The sweep against its
floor"). Neither ansible-runner nor pexpect lets a caller set the delay, so `install`
wraps the method once per process; a child that has not been reaped is closed exactly
as before, delay included.
"""

from __future__ import annotations

import functools
from typing import Any


def install() -> None:
    """Make `PtyProcess.close` skip its delay for a child already reaped (idempotent)."""
    from ptyprocess import PtyProcess

    if getattr(PtyProcess.close, "_gpufleet_reaped_no_delay", False):
        return
    original = PtyProcess.close

    @functools.wraps(original)
    def close(self: Any, force: bool = True) -> None:
        if self.terminated:
            self.delayafterclose = 0
        original(self, force)

    close._gpufleet_reaped_no_delay = True  # type: ignore[attr-defined]
    PtyProcess.close = close

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reconcile loop: level-triggered, cheap in steady state.

A cycle is five phases over one `Cycle` (runner.cycle), each a function in the
module of its concern (docs/reconciler.md has the map):

1. due (runner.sweep): read the inventory, hash each host's desired state, pick the
   hosts not quarantined, backing off or refused;
2. probe (runner.sweep, runner.cluster): one task per host comparing the node with
   its last apply's record, and one read of the cluster;
3. plan (runner.sweep): check mode on the candidates whose change could disrupt
   their node; the others are applied without one;
4. apply (runner.apply): the changes that disrupt nothing, and the cluster side;
5. roll (runner.rolling, runner.out_of_service): disruptive changes through their
   pool's rollout, a batch at a time across cycles.

What happens to a host is decided by pure functions (runner.decide); the state is
written by runner.writer alone. Time, randomness and sleeping are injected, so the
loop's logic runs on fake time in tests.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence

from runner import apply, rolling, sweep
from runner.cycle import Context, Cycle, CycleReport, HostOutcome, Settings, Stop
from runner.decide import backoff_delay, jitter
from runner.engine import Engine
from runner.observe import LogObserver, Observer, Observers
from runner.state import StateStore
from runner.words import drift_summary
from runner.writer import Writer, release

log = logging.getLogger("runner")

__all__ = [
    "CycleReport",
    "HostOutcome",
    "LogObserver",
    "Observer",
    "Observers",
    "Reconciler",
    "Settings",
    "Stop",
    "backoff_delay",
    "drift_summary",
    "release",
]


class Reconciler:
    def __init__(
        self,
        engine: Engine,
        store: StateStore,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        stop: Stop | None = None,
        observers: Sequence[Observer] = (),
        background: bool = False,
    ) -> None:
        """`background`: a rollout batch's apply runs beside the cycles (the
        long-running loop); otherwise the cycle waits for it (one cycle, tests)."""
        writer = Writer(store, clock, Observers(observers))
        self.ctx = Context(
            engine, writer, settings, clock, rng or random.Random(), stop or Stop(), background
        )
        self.sleep = sleep

    @property
    def observe(self) -> Observers:
        return self.ctx.writer.observe

    @observe.setter
    def observe(self, observers: Observers) -> None:
        self.ctx.writer.observe = observers

    @property
    def stop(self) -> Stop:
        return self.ctx.stop

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    @property
    def clock(self) -> Callable[[], float]:
        return self.ctx.clock

    def run(self, once: bool) -> CycleReport:
        """Run cycles until stopped (or one, with `once`); returns the last report.
        A batch whose apply is under way is waited for and finished first."""
        try:
            while True:
                report = self.cycle()
                if once or self.stop.requested or not self._wait(report):
                    # A stop that came after the cycle ended (while it waited, or from a
                    # batch's thread) interrupts the run all the same.
                    report.interrupted = self.stop.requested
                    rolling.finish_batches(self.ctx, report)
                    return report
        finally:
            if self.ctx.executor is not None:
                self.ctx.executor.shutdown(wait=True)
                self.ctx.executor = None

    def cycle(self) -> CycleReport:
        """collect → due → probe → plan → apply → roll."""
        ctx, work = self.ctx, Cycle(CycleReport(started=self.ctx.clock()))
        try:
            rolling.collect(ctx, work)
            if sweep.due(ctx, work):
                sweep.probe(ctx, work)
                if sweep.has_work(ctx, work):
                    sweep.plan(ctx, work)
                    apply.apply(ctx, work)
                    rolling.roll(ctx, work)
        finally:
            work.report.finished = ctx.clock()
            work.report.interrupted = self.stop.requested
            ctx.observe.cycle_finished(work.report)
        return work.report

    def _wait(self, report: CycleReport) -> bool:
        """Sleep until the next cycle is due (a rollout's next batch may make it
        sooner), in short steps so that a stop request is honoured promptly and a
        batch that ends starts the next cycle. False when a stop was requested."""
        clock = self.ctx.clock
        delay = self.ctx.settings.interval * jitter(self.ctx.settings, self.ctx.rng)
        if report.next_batch_at is not None:
            delay = min(delay, max(0.0, report.next_batch_at - clock()))
            log.info("next cycle (a rollout's next batch) in %.0f s", delay)
        else:
            log.info("next cycle in %.0f s", delay)
        deadline = clock() + delay
        while (
            not self.stop.requested
            and clock() < deadline
            and not any(b.result.done() for b in self.ctx.batches.values())
        ):
            self.sleep(min(1.0, deadline - clock()))
        return not self.stop.requested

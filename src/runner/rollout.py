# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rollout pools and their policies, read from the inventory.

A disruptive change (a driver reload, a kernel move, a MIG layout, a container runtime
restart) reaches the hosts of a pool a batch at a time (at most one under way per pool),
within the pool's budget. A host's pool is its `gpufleet_rollout_pool` (set in the
group_vars of a group of like nodes; "all" when unset); each pool's policy comes from
the variables below, which must agree across the pool's hosts, and falls back to the
reconciler's options. Pools roll independently: a pool of training nodes can take two at
a time while a pool of inference nodes takes one, and a failure in one halts that pool
only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any

POOL_VARIABLE = "gpufleet_rollout_pool"
DEFAULT_POOL = "all"


class RolloutPhase(StrEnum):
    """A host's phase in a rollout: queued, then out of service for its change (in
    flight: cordoned, drained, its change applying, applied), or halted until an
    operator releases it. The values are those stored and printed."""

    QUEUED = "queued"
    CORDONED = "cordoned"
    DRAINED = "drained"
    APPLYING = "applying"
    APPLIED = "applied"
    HALTED = "halted"


IN_FLIGHT = (
    RolloutPhase.CORDONED,
    RolloutPhase.DRAINED,
    RolloutPhase.APPLYING,
    RolloutPhase.APPLIED,
)
# The phases that count against the pool's max_unavailable.
UNAVAILABLE = (*IN_FLIGHT, RolloutPhase.HALTED)
PHASES = (RolloutPhase.QUEUED, *UNAVAILABLE)
# A host whose change is still on its way (a halted one waits for a release, which
# plans it again).
ROLLING = (RolloutPhase.QUEUED, *IN_FLIGHT)


class PolicyError(Exception):
    """A rollout variable in the inventory is wrong; the message names the variable,
    the host and the expected form."""


@dataclass(frozen=True)
class RolloutPolicy:
    # Hosts per batch.
    max_parallel: int = 1
    # Hosts of the pool out of service at once (halted hosts count: they stay so).
    max_unavailable: int = 1
    # Seconds from the end of one batch to the start of the next.
    pause: float = 0.0
    # Halted hosts at which the pool's rollout stops until one is released.
    max_failures: int = 1


# Policy field -> inventory variable, and how a value is read.
VARIABLES = {f.name: f"gpufleet_rollout_{f.name}" for f in fields(RolloutPolicy)}


def _positive_int(value: Any) -> int | None:
    text = str(value)
    return int(text) if not isinstance(value, bool) and text.isdigit() and int(text) > 0 else None


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


_READERS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "max_parallel": (_positive_int, "a positive integer"),
    "max_unavailable": (_positive_int, "a positive integer"),
    "pause": (_seconds, "seconds, a number >= 0"),
    "max_failures": (_positive_int, "a positive integer"),
}


# Whether a rollout drains a host in Slurm around its change: auto (when slurmd runs
# on it; the default), true or false; and how long it waits for the jobs on the node
# to end before it halts, naming them.
SLURM_DRAIN = "slurm_drain"
SLURM_DRAIN_TIMEOUT = "slurm_drain_timeout"
DEFAULT_SLURM_DRAIN_TIMEOUT = 3600.0


def slurm_drain(host: str, hostvars: Mapping[str, Any]) -> tuple[str, float]:
    """The host's (slurm_drain, slurm_drain_timeout); PolicyError for a wrong form."""
    value = hostvars.get(SLURM_DRAIN, "auto")
    mode = str(value).lower() if isinstance(value, (bool, str)) else ""
    if mode not in ("auto", "true", "false"):
        raise PolicyError(
            f"{SLURM_DRAIN} on host {host}: expected auto, true or false, got {value!r}"
        )
    raw = hostvars.get(SLURM_DRAIN_TIMEOUT, DEFAULT_SLURM_DRAIN_TIMEOUT)
    timeout = _seconds(raw)
    if not timeout:
        raise PolicyError(
            f"{SLURM_DRAIN_TIMEOUT} on host {host}: expected seconds, a number > 0, got {raw!r}"
        )
    return mode, timeout


# How a Kubernetes node taken out for its GPUs' health is kept free of new pods:
# cordon (the default) or a NoSchedule taint (playbooks/rollout.yml does either).
HEALTH_OUT_OF_SERVICE = "gpufleet_health_out_of_service"


def health_out_of_service(host: str, hostvars: Mapping[str, Any]) -> str:
    """The host's gpufleet_health_out_of_service; PolicyError for another value."""
    value = hostvars.get(HEALTH_OUT_OF_SERVICE, "cordon")
    if value not in ("cordon", "taint"):
        raise PolicyError(
            f"{HEALTH_OUT_OF_SERVICE} on host {host}: expected cordon or taint, got {value!r}"
        )
    return str(value)


def pool_of(hostvars: Mapping[str, Any]) -> str:
    return str(hostvars.get(POOL_VARIABLE) or DEFAULT_POOL)


def policies(
    hostvars: Mapping[str, Mapping[str, Any]], default: RolloutPolicy
) -> dict[str, RolloutPolicy]:
    """Each pool's policy: the inventory's rollout variables over `default`.

    Raises PolicyError for a value of the wrong form (a Slurm drain setting and
    gpufleet_health_out_of_service too), for hosts of one pool that disagree, and for
    a batch that could never start (max_parallel above max_unavailable)."""
    found: dict[str, dict[str, tuple[str, Any]]] = {}
    for host, values in sorted(hostvars.items()):
        pool = pool_of(values)
        seen = found.setdefault(pool, {})
        for name, variable in VARIABLES.items():
            if variable not in values:
                continue
            read, form = _READERS[name]
            value = read(values[variable])
            if value is None:
                raise PolicyError(
                    f"{variable} on host {host}: expected {form}, got {values[variable]!r}"
                )
            if name in seen and seen[name][1] != value:
                other, theirs = seen[name]
                raise PolicyError(
                    f"{variable}: hosts of rollout pool {pool!r} disagree ({other} has "
                    f"{theirs}, {host} has {value}); expected one value per pool, set in "
                    "the group_vars of its group"
                )
            seen[name] = (host, value)
    for host, values in sorted(hostvars.items()):
        slurm_drain(host, values)
        health_out_of_service(host, values)
    result = {}
    for pool, seen in found.items():
        policy = replace(default, **{name: value for name, (_host, value) in seen.items()})
        if policy.max_parallel > policy.max_unavailable:
            raise PolicyError(
                f"{VARIABLES['max_parallel']} {policy.max_parallel} exceeds "
                f"{VARIABLES['max_unavailable']} {policy.max_unavailable} in rollout pool "
                f"{pool!r}: a batch could never start"
            )
        result[pool] = policy
    return result

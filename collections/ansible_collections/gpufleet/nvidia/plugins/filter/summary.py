# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters that turn gpu_facts results into words for reports."""

from __future__ import annotations


def node_summary(facts):
    if not facts.get("gpu_count"):
        return "not a GPU node (no NVIDIA device on the PCI bus)"
    gpus = facts.get("gpus") or [{}]
    name = gpus[0].get("name") or "unknown NVIDIA GPU"
    text = f"{facts['gpu_count']}x {name}"
    if facts.get("nvswitch_count"):
        text += f" + {facts['nvswitch_count']} NVSwitch"
    driver = facts.get("driver") or {}
    text += f"; driver {driver.get('state', 'unknown')}"
    if driver.get("version"):
        text += f" {driver['version']}"
    if driver.get("module_type"):
        text += f" ({driver['module_type']})"
    if facts.get("nouveau_loaded"):
        text += "; nouveau loaded"
    return text


# Stages in the order they run, with the fact each one publishes.
STAGES = (
    ("driver", "driver_stage"),
    ("mig", "mig_stage"),
    ("toolkit", "toolkit_stage"),
    ("runtime_config", "runtime_config_stage"),
    ("validator", "validator_stage"),
    ("device_plugin", "device_plugin_stage"),
    ("exporter", "exporter_stage"),
    ("slurm_gres", "slurm_gres_stage"),
)
# Statuses under which the next stage may build on a stage ("disabled": switched
# off by its mode, which does not hold later stages back).
PASSING = ("ready", "pre-installed", "disabled")


def stage_passed(outcome):
    status = outcome.get("status")
    # A driver gpufleet does not manage but that answers is as good as pre-installed.
    return status in PASSING or (status == "unmanaged" and bool(outcome.get("validated")))


def ready_for(hostvars, stage):
    """Whether every stage before `stage` passed on the host (so `stage` may run)."""
    names = [name for name, _fact in STAGES]
    if stage not in names:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(names)}")
    return all(
        stage_passed(hostvars.get(fact) or {}) for _name, fact in STAGES[: names.index(stage)]
    )


def stages_not_passed(hostvars, stages):
    """'<stage> <status>' for each of `stages` that published an outcome on the host
    and did not pass; a stage that did not run (no outcome) is not counted."""
    names = [name for name, _fact in STAGES]
    unknown = [s for s in stages if s not in names]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}; stages are {', '.join(names)}")
    found = []
    for name, fact in STAGES:
        outcome = hostvars.get(fact)
        if name in stages and outcome and not stage_passed(outcome):
            found.append(f"{name} {outcome.get('status')}")
    return found


def furthest_stage(hostvars):
    """The last stage of the uninterrupted run of passed stages from the first."""
    furthest = None
    for name, fact in STAGES:
        if not stage_passed(hostvars.get(fact) or {}):
            break
        furthest = name
    return furthest


def node_report(hostvars):
    """One line for a host: its hardware, each stage's status and why, how far it got."""
    facts = (hostvars.get("ansible_facts") or {}).get("gpufleet")
    name = hostvars.get("inventory_hostname", "?")
    if facts is None:
        return f"{name}: no facts (unreachable, or not part of this run)"
    parts = [node_summary(facts)]
    if not facts.get("gpu_count"):
        return f"{name}: " + "; ".join(parts)
    for stage, fact in STAGES:
        outcome = hostvars.get(fact)
        if not outcome:
            continue
        text = f"{stage}: {outcome['status']}"
        if outcome.get("reason"):
            text += f" ({outcome['reason']})"
        parts.append(text)
    furthest = furthest_stage(hostvars)
    parts.append(f"validated up to: {furthest}" if furthest else "nothing validated")
    return f"{name}: " + "; ".join(parts)


def stage_failures(hostvars_list):
    """'host: stage failed: reason' for every stage that failed on one of the hosts."""
    failures = []
    for hostvars in hostvars_list:
        name = hostvars.get("inventory_hostname", "?")
        for stage, fact in STAGES:
            outcome = hostvars.get(fact) or {}
            if outcome.get("status") == "failed":
                failures.append(
                    f"{name}: {stage} failed: {outcome.get('reason') or 'no reason given'}"
                )
    return failures


class FilterModule:
    def filters(self):
        return {
            "node_summary": node_summary,
            "node_report": node_report,
            "stage_failures": stage_failures,
            "ready_for": ready_for,
            "furthest_stage": furthest_stage,
            "stages_not_passed": stages_not_passed,
        }

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The alerting and recording rules shipped for the reconciler's metrics, checked by
Prometheus's own promtool (Debian's, unpacked by tests/tools/consumers.sh): the rules
load, and each alert fires when it should and not before (the cases are in
fixtures/prometheus/gpufleet-rules.test.yml)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parents[2]
PROMTOOL = PROJECT / ".cache" / "consumers" / "usr" / "bin" / "promtool"
RULES = PROJECT / "roles" / "k8s_manifests" / "files" / "monitoring" / "gpufleet-rules.yml"
RULE_TESTS = Path(__file__).parent / "fixtures" / "prometheus" / "gpufleet-rules.test.yml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL.is_file(), "run tests/tools/consumers.sh (make unit does)"
    return subprocess.run(
        [str(PROMTOOL), *args], capture_output=True, text=True, check=False, cwd=PROJECT
    )


def rule_series() -> set[str]:
    """Every gpufleet and GPU Operator series name the rules' expressions read."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    exprs = " ".join(rule["expr"] for group in groups for rule in group["rules"])
    return set(re.findall(r"\b(?:gpufleet|gpu_operator)_[a-z_]+\b", exprs))


def test_promtool_accepts_the_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 13 rules found" in result.stdout


def test_each_alert_fires_when_it_should_and_not_before() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_recording_rules_are_named_level_metric_operations() -> None:
    # Prometheus's naming practice: the labels kept, the metric, what was done to it.
    groups = yaml.safe_load(RULES.read_text())["groups"]
    records = [rule for group in groups for rule in group["rules"] if "record" in rule]
    assert records
    for rule in records:
        level, metric, operations = rule["record"].split(":")
        kept = re.search(r"\bby \(([^)]*)\)", rule["expr"])
        labels = [label.strip() for label in kept.group(1).split(",")] if kept else []
        assert level == ("_".join(labels) if labels else "fleet"), rule["record"]
        assert metric.startswith(("gpufleet_", "gpu_operator_")), rule["record"]
        assert re.fullmatch(r"[a-z0-9_]+", operations), rule["record"]


def test_every_alert_has_a_test() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        check["alertname"]
        for case in cases
        for check in case.get("alert_rule_test", [])
        if check["exp_alerts"]
    }
    assert alerts == fired


def test_the_rules_read_only_series_the_reconciler_exports() -> None:
    from prometheus_client import generate_latest

    from runner.metrics import Metrics

    exported = set(re.findall(r"^# TYPE (\S+)", generate_latest(Metrics().registry).decode(), re.M))
    # A counter's samples carry _total; its TYPE line does not.
    exported |= {f"{name}_total" for name in exported}
    read = rule_series()
    assert read, "no series found in the rules"
    assert read <= exported, sorted(read - exported)


DASHBOARD = PROJECT / "roles" / "k8s_manifests" / "files" / "monitoring" / "gpufleet-dashboard.json"


def dashboard_targets() -> list[tuple[str, str]]:
    import json

    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels if p["type"] != "row" for t in p["targets"]]


def test_the_dashboard_follows_grafanas_dashboard_linter_conventions() -> None:
    """What Grafana's dashboard-linter checks (its rules, by name), checked here by hand:
    the linter itself cannot be built on these machines (see the README)."""
    import json

    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"  # template-datasource-rule
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):  # template-job-rule, template-instance-rule
        var = variables[name]
        assert (var["label"], var["multi"], var["allValue"]) == (name, True, ".+")
        assert var["datasource"]["uid"] == "${datasource}"
        assert var["refresh"] == 2  # template-on-time-change-reload-rule
    assert dashboard["editable"] is False  # template-uneditable-rule
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        title = panel["title"]
        assert title and panel["description"], title  # panel-title-description-rule
        assert panel["datasource"]["uid"] == "${datasource}", title  # panel-datasource-rule
        assert panel["fieldConfig"]["defaults"]["unit"], title  # panel-units-rule
        assert panel["targets"], title  # panel-no-targets-rule
    for title, expr in dashboard_targets():
        assert 'job=~"$job"' in expr and 'instance=~"$instance"' in expr, title
        for counter in re.findall(r"\b\w+_(?:total|bucket)\b", expr):  # target-counter-agg-rule
            assert re.search(
                rf"(rate|increase)\({counter}\{{[^}}]*\}}\[\$__rate_interval\]", expr
            ), title


def test_the_dashboard_reads_only_series_the_reconciler_or_dcgm_exporter_exports() -> None:
    from prometheus_client import generate_latest

    from runner.metrics import Metrics

    exported = set(re.findall(r"^# TYPE (\S+)", generate_latest(Metrics().registry).decode(), re.M))
    exported |= {f"{name}_total" for name in exported} | {f"{name}_bucket" for name in exported}
    read = {
        name
        for _, expr in dashboard_targets()
        for name in re.findall(r"\b(?:gpufleet|gpu_operator)_[a-z_]+\b", expr)
    }
    assert read and read <= exported, sorted(read - exported)
    dcgm = {name for _, expr in dashboard_targets() for name in re.findall(r"\bDCGM_FI_\w+", expr)}
    # The collectors file the simulated dcgm-exporter package ships (upstream's
    # default-counters.csv has both fields too); the role keeps it unless
    # exporter_collectors is set.
    defaults = (
        PROJECT / "tests" / "sim" / "repo" / "standins" / "default-counters.csv"
    ).read_text()
    collected = {line.split(",")[0].strip() for line in defaults.splitlines() if line[:1] != "#"}
    assert dcgm and dcgm <= collected, sorted(dcgm - collected)

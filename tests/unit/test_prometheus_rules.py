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
RULES = PROJECT / "src" / "runner" / "monitoring" / "gpufleet-rules.yml"
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
    assert "SUCCESS: 10 rules found" in result.stdout


def test_each_alert_fires_when_it_should_and_not_before() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


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

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpufleet monitoring`: the shipped rules and dashboard made for a site (runbook
URLs, the exporters' job), checked by Prometheus's promtool and against Kubernetes's
schemas, and each runbook link landing on its section of docs/monitoring.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from test_prometheus_rules import RULES, promtool

from runner import alerting, cli, output

PROJECT = Path(__file__).resolve().parents[2]
RUNBOOKS = PROJECT / "docs" / "monitoring.md"
WIKI = "https://wiki.example.org/gpu/monitoring"

# The exporters scraped under the site's own job name: down for 12 minutes pages.
EXPORTER_DOWN = """
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: up{job="gpu-metrics", instance="node-a:9400"}
        values: 0x15
      - series: up{job="dcgm-exporter", instance="node-b:9400"}
        values: 0x15
    alert_rule_test:
      - eval_time: 12m
        alertname: GpufleetExporterDown
        exp_alerts:
          - exp_labels: {severity: warning, instance: "node-a:9400"}
            exp_annotations:
              summary: dcgm-exporter on node-a:9400 stopped reporting
              description: >-
                The GPU metrics of node-a:9400 are missing for 10 minutes. The
                exporter stage repairs a stopped service on the next cycle; if it keeps
                failing, `python -m runner status` shows the exporter stage's reason.
              runbook_url: https://wiki.example.org/gpu/monitoring#gpufleetexporterdown
"""


def _alerts(document: dict) -> list[dict]:
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def test_by_default_the_rules_are_the_shipped_file():
    assert alerting.rules() == yaml.safe_load(RULES.read_text())


def test_the_sites_job_and_runbooks_reach_prometheus(tmp_path):
    rendered = alerting.rules(WIKI, "gpu-metrics")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rendered))
    checked = promtool("check", "rules", str(tmp_path / "rules.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Only the site's job pages: the default one's exporter is no longer watched.
    (tmp_path / "down.test.yml").write_text(EXPORTER_DOWN)
    tested = promtool("test", "rules", str(tmp_path / "down.test.yml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alerts_runbook_is_a_section_of_the_monitoring_page():
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line[4:].strip().lower()).replace(" ", "-")
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("### ")
    }
    alerts = _alerts(alerting.rules(WIKI))
    assert alerts
    for alert in alerts:
        url, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        assert url == WIKI
        assert anchor in anchors, f"docs/monitoring.md has no section for {alert['alert']}"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--runbook-url", "wiki/monitoring"], "--runbook-url 'wiki/monitoring': expected an http"),
        (["--runbook-url", WIKI + "#alerts"], "without a #fragment"),
        (["--exporter-job", "dcgm("], "--exporter-job 'dcgm(': not a regular expression"),
        (["--exporter-job", 'a"b'], "without quotes or backslashes"),
        (["--kubernetes", "--label", "release"], "--label 'release': expected KEY=VALUE"),
        (["--kubernetes", "--name", "GPU_rules"], "--name 'GPU_rules': expected a Kubernetes name"),
    ],
)
def test_a_bad_setting_is_a_usage_error_naming_the_option(capsys, argv, said):
    assert cli.main(["monitoring", "rules", *argv, "--json"]) == output.Exit.USAGE
    captured = capsys.readouterr()
    assert said in captured.err
    error = json.loads(captured.out)
    assert (error["kind"], error["data"]["exit_code"]) == ("error", 2)


def test_rules_as_a_prometheus_rule_for_the_operator(capsys):
    argv = ["--kubernetes", "--namespace", "monitoring", "--label", "release=prometheus"]
    assert cli.main(["monitoring", "rules", "--runbook-url", WIKI, *argv]) == output.Exit.OK
    rule = yaml.safe_load(capsys.readouterr().out)
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"] == {
        "name": "gpufleet",
        "namespace": "monitoring",
        "labels": {"app.kubernetes.io/managed-by": "gpufleet", "release": "prometheus"},
    }
    assert rule["spec"] == alerting.rules(WIKI)


def test_the_dashboard_as_a_configmap_for_grafanas_sidecar(capsys):
    argv = ["monitoring", "dashboard", "--kubernetes", "--exporter-job", "gpu-metrics", "--json"]
    assert cli.main(argv) == output.Exit.OK
    printed = json.loads(capsys.readouterr().out)
    assert printed["kind"] == "monitoring"
    configmap = printed["data"]
    kubernetes_validate.validate(configmap, "1.31.0", strict=True)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(configmap["data"]["gpufleet-dashboard.json"])
    job = next(v for v in board["templating"]["list"] if v["name"] == "job")
    assert job["definition"] == 'label_values(up{job=~".*gpufleet.*|gpu-metrics"}, job)'


def test_the_dashboard_as_grafana_imports_it(capsys):
    assert cli.main(["monitoring", "dashboard"]) == output.Exit.OK
    board = json.loads(capsys.readouterr().out)
    assert board["uid"] and board["panels"]


def test_the_cli_and_the_cluster_side_ship_the_same_exporter_job():
    role = yaml.safe_load((PROJECT / "roles/k8s_manifests/defaults/main.yml").read_text())
    shipped = alerting.shared().DEFAULT_EXPORTER_JOB
    assert alerting.DEFAULT_EXPORTER_JOB == shipped == role["k8s_manifests_exporter_job"]
    assert alerting.shared().SHIPPED_SELECTOR in alerting.shipped(alerting.shared().RULES_FILE)

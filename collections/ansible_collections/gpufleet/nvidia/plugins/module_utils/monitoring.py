# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet's own monitoring made for a site: its Prometheus rules, each alert given
a `runbook_url` and the exporters' scrape job matched by the site's selector, as a
rule document or a Prometheus Operator PrometheusRule; its Grafana dashboard, as
JSON or a ConfigMap that Grafana's dashboard sidecar loads.

The shipped documents are roles/k8s_manifests/files/monitoring/ (RULES_FILE,
DASHBOARD_FILE); callers read them and pass them in. The reconciler's `monitoring`
verb and the k8s_manifests role's filter both make their objects here.

Facts from upstream, restated: the Prometheus Operator's PrometheusRule
(monitoring.coreos.com/v1) carries the rule file's `groups` under `spec`;
kube-prometheus-stack's Grafana sidecar loads dashboards from ConfigMaps labelled
grafana_dashboard: "1" by default.
"""

from __future__ import annotations

import copy
import json
import re
from urllib.parse import urlsplit

RULES_FILE = "gpufleet-rules.yml"
DASHBOARD_FILE = "gpufleet-dashboard.json"
# The selector the shipped rules carry: a scrape job whose name contains "dcgm", as
# the GPU Operator's ServiceMonitor and most scrape configs name the exporters'.
DEFAULT_EXPORTER_JOB = ".*dcgm.*"
SHIPPED_SELECTOR = f'job=~"{DEFAULT_EXPORTER_JOB}"'
# The dashboard's `job` variable: the reconciler's scrape jobs and the exporters'.
SHIPPED_JOBS = ".*(gpufleet|dcgm).*"
DASHBOARD_LABEL = ("grafana_dashboard", "1")


class MonitoringError(ValueError):
    """A setting the objects cannot be made with; the message names it."""


def check_runbook_url(url, setting):
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.fragment:
        raise MonitoringError(
            f"{setting} {url!r}: expected an http(s) URL without a #fragment, where "
            "docs/monitoring.md is served (each alert's section is appended as #anchor)"
        )
    return url


def check_exporter_job(regex, setting):
    if not isinstance(regex, str) or not regex or '"' in regex or "\\" in regex:
        raise MonitoringError(
            f"{setting} {regex!r}: expected a non-empty regular expression of the exporters' "
            "scrape job name without quotes or backslashes, such as 'gpu-metrics'"
        )
    try:
        re.compile(regex)
    except re.error as err:
        raise MonitoringError(f"{setting} {regex!r}: not a regular expression: {err}") from err
    return regex


def rules(document, runbook_url=None, exporter_job=DEFAULT_EXPORTER_JOB):
    """The rule `document` with every alert given `runbook_url` + '#' + its name in
    lower case (the anchor of its section in docs/monitoring.md), and the exporters'
    job matched by `exporter_job`. Both are checked by the caller."""
    data = copy.deepcopy(document)
    selector = f'job=~"{exporter_job}"'
    for group in data["groups"]:
        for rule in group["rules"]:
            rule["expr"] = rule["expr"].replace(SHIPPED_SELECTOR, selector)
            if runbook_url and "alert" in rule:
                anchor = rule["alert"].lower()
                rule["annotations"]["runbook_url"] = f"{runbook_url}#{anchor}"
    return data


def dashboard(text, exporter_job=DEFAULT_EXPORTER_JOB):
    """The dashboard (its JSON `text`), its `job` variable offering the reconciler's
    jobs and the exporters' (`exporter_job`)."""
    return json.loads(text.replace(SHIPPED_JOBS, f".*gpufleet.*|{exporter_job}"))


def prometheus_rule(document, metadata):
    """The rule document as the Prometheus Operator's PrometheusRule; `metadata`'s
    labels are those its Prometheus's ruleSelector asks for."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": document,
    }


def dashboard_configmap(document, metadata):
    """The dashboard in a ConfigMap labelled for Grafana's dashboard sidecar."""
    key, value = DASHBOARD_LABEL
    # The site's labels win: a sidecar may look for another value.
    labelled = {**metadata, "labels": {key: value, **(metadata.get("labels") or {})}}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": labelled,
        "data": {DASHBOARD_FILE: json.dumps(document, indent=2, sort_keys=True)},
    }

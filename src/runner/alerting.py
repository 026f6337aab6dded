# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The monitoring the package ships, rendered for a site (`monitoring` verb): the
Prometheus rules with each alert's `runbook_url` and the site's selector of the
exporters' scrape job, as a rule file or a Prometheus Operator PrometheusRule; the
Grafana dashboard, as JSON or a ConfigMap that Grafana's dashboard sidecar loads."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import yaml

# The selector the shipped rules carry: a scrape job whose name contains "dcgm", as
# the GPU Operator's ServiceMonitor and most scrape configs name the exporters'.
DEFAULT_EXPORTER_JOB = ".*dcgm.*"
_SHIPPED_SELECTOR = f'job=~"{DEFAULT_EXPORTER_JOB}"'
# The dashboard's `job` variable: the reconciler's scrape jobs and the exporters'.
_SHIPPED_JOBS = ".*(gpufleet|dcgm).*"
# What kube-prometheus-stack's Grafana sidecar looks for by default.
DASHBOARD_LABEL = ("grafana_dashboard", "1")
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpufleet"}
_LABEL_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (the dashboard in its ConfigMap) as blocks."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def _yaml(document: Any) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=100)


class MonitoringError(ValueError):
    """A setting of the rendering that cannot be used; the message says which."""


def _shipped(name: str) -> str:
    return (resources.files("runner") / "monitoring" / name).read_text(encoding="utf-8")


def check_runbook_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.fragment:
        raise MonitoringError(
            f"--runbook-url {url!r}: expected an http(s) URL without a #fragment, where "
            "docs/monitoring.md is served (each alert's section is appended as #anchor)"
        )
    return url


def check_exporter_job(regex: str) -> str:
    try:
        re.compile(regex)
    except re.error as err:
        raise MonitoringError(f"--exporter-job {regex!r}: not a regular expression: {err}") from err
    if '"' in regex or "\\" in regex or not regex:
        raise MonitoringError(
            f"--exporter-job {regex!r}: expected a non-empty regular expression of the "
            "exporters' scrape job name without quotes or backslashes, such as 'gpu-metrics'"
        )
    return regex


def rules(runbook_url: str | None = None, exporter_job: str = DEFAULT_EXPORTER_JOB) -> Any:
    """The rule file's document: every alert given `runbook_url` + '#' + its name in
    lower case (the anchor of its section in docs/monitoring.md), and the exporters'
    job matched by `exporter_job`."""
    data = yaml.safe_load(_shipped("gpufleet-rules.yml"))
    selector = f'job=~"{check_exporter_job(exporter_job)}"'
    for group in data["groups"]:
        for rule in group["rules"]:
            rule["expr"] = rule["expr"].replace(_SHIPPED_SELECTOR, selector)
            if runbook_url and "alert" in rule:
                anchor = rule["alert"].lower()
                rule["annotations"]["runbook_url"] = f"{check_runbook_url(runbook_url)}#{anchor}"
    return data


def dashboard(exporter_job: str = DEFAULT_EXPORTER_JOB) -> Any:
    """The dashboard, its `job` variable offering the reconciler's jobs and the
    exporters' (`exporter_job`)."""
    jobs = f".*gpufleet.*|{check_exporter_job(exporter_job)}"
    return json.loads(_shipped("gpufleet-dashboard.json").replace(_SHIPPED_JOBS, jobs))


def _metadata(name: str, namespace: str | None, labels: dict[str, str]) -> dict[str, Any]:
    if not _DNS_NAME.fullmatch(name) or len(name) > 63:
        raise MonitoringError(f"--name {name!r}: expected a Kubernetes name (a-z, 0-9, '-')")
    if namespace is not None and not _DNS_NAME.fullmatch(namespace):
        raise MonitoringError(f"--namespace {namespace!r}: expected a Kubernetes namespace name")
    meta: dict[str, Any] = {"name": name, "labels": {**MANAGED_BY, **labels}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def parse_labels(pairs: list[str]) -> dict[str, str]:
    """KEY=VALUE arguments as labels, each checked as Kubernetes checks them."""
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _LABEL_NAME.fullmatch(key) or not re.fullmatch(r"[-A-Za-z0-9_.]*", value):
            raise MonitoringError(f"--label {pair!r}: expected KEY=VALUE, a Kubernetes label")
        labels[key] = value
    return labels


def prometheus_rule(
    document: Any, name: str, namespace: str | None, labels: dict[str, str]
) -> dict[str, Any]:
    """The rule document as the Prometheus Operator's PrometheusRule (its `spec` holds
    the `groups`); `labels` are those its Prometheus's ruleSelector asks for."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _metadata(name, namespace, labels),
        "spec": document,
    }


def dashboard_configmap(
    document: Any, name: str, namespace: str | None, labels: dict[str, str]
) -> dict[str, Any]:
    """The dashboard in a ConfigMap labelled for Grafana's dashboard sidecar."""
    key, value = DASHBOARD_LABEL
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(name, namespace, {key: value, **labels}),
        "data": {"gpufleet-dashboard.json": json.dumps(document, indent=2, sort_keys=True)},
    }


def render(args: Any) -> tuple[Any, str]:
    """What the `monitoring` verb prints: the object, and its text form (YAML, or
    the dashboard's JSON as Grafana imports it)."""
    labels = parse_labels(args.label)
    if args.what == "rules":
        document = rules(args.runbook_url, args.exporter_job)
        if args.kubernetes:
            document = prometheus_rule(document, args.name, args.namespace, labels)
        return document, _yaml(document)
    document = dashboard(args.exporter_job)
    if not args.kubernetes:
        return document, json.dumps(document, indent=2) + "\n"
    document = dashboard_configmap(document, args.name, args.namespace, labels)
    return document, _yaml(document)

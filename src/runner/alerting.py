# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The monitoring the package ships, rendered for a site (`monitoring` verb): the
Prometheus rules with each alert's `runbook_url` and the site's selector of the
exporters' scrape job, as a rule file or a Prometheus Operator PrometheusRule; the
Grafana dashboard, as JSON or a ConfigMap that Grafana's dashboard sidecar loads.

The documents and how they are made for a site are the k8s_manifests role's and the
collection's (roles/k8s_manifests/files/monitoring, module_utils/monitoring.py),
which the cluster side renders and applies from too; this module reads them from
the project the reconciler runs (a checkout or the installed package's copy)."""

from __future__ import annotations

import importlib.util
import json
import re
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

# The collection's module, found in the project (not imported as a collection:
# ansible's collection loader is not needed to print a file).
_MODULE = "collections/ansible_collections/gpufleet/nvidia/plugins/module_utils/monitoring.py"
_FILES = "roles/k8s_manifests/files/monitoring"
# The selector the shipped rules carry (module_utils/monitoring.py, which a unit
# test keeps equal).
DEFAULT_EXPORTER_JOB = ".*dcgm.*"
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


def _project() -> Path:
    from runner.cli import find_project  # the CLI knows where the project is

    return find_project()


@cache
def shared() -> ModuleType:
    """The collection's module_utils/monitoring.py."""
    spec = importlib.util.spec_from_file_location("gpufleet_monitoring", _project() / _MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shipped(name: str) -> str:
    """A shipped document's text (RULES_FILE or DASHBOARD_FILE)."""
    return (_project() / _FILES / name).read_text(encoding="utf-8")


class MonitoringError(ValueError):
    """A setting of the rendering that cannot be used; the message says which."""


def _checked(check: Any, value: str, option: str) -> str:
    """`check` (one of the shared module's) of `value`, its error in this module's type."""
    try:
        return str(check(value, option))
    except shared().MonitoringError as err:
        raise MonitoringError(str(err)) from err


def rules(runbook_url: str | None = None, exporter_job: str = DEFAULT_EXPORTER_JOB) -> Any:
    """The rule file's document: every alert given `runbook_url` + '#' + its name in
    lower case (the anchor of its section in docs/monitoring.md), and the exporters'
    job matched by `exporter_job`."""
    if runbook_url:
        _checked(shared().check_runbook_url, runbook_url, "--runbook-url")
    _checked(shared().check_exporter_job, exporter_job, "--exporter-job")
    document = yaml.safe_load(shipped(shared().RULES_FILE))
    return shared().rules(document, runbook_url, exporter_job)


def dashboard(exporter_job: str = DEFAULT_EXPORTER_JOB) -> Any:
    """The dashboard, its `job` variable offering the reconciler's jobs and the
    exporters' (`exporter_job`)."""
    _checked(shared().check_exporter_job, exporter_job, "--exporter-job")
    return shared().dashboard(shipped(shared().DASHBOARD_FILE), exporter_job)


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
    """The rule document as the Prometheus Operator's PrometheusRule; `labels` are
    those its Prometheus's ruleSelector asks for."""
    return dict(shared().prometheus_rule(document, _metadata(name, namespace, labels)))


def dashboard_configmap(
    document: Any, name: str, namespace: str | None, labels: dict[str, str]
) -> dict[str, Any]:
    """The dashboard in a ConfigMap labelled for Grafana's dashboard sidecar."""
    return dict(shared().dashboard_configmap(document, _metadata(name, namespace, labels)))


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

# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters that turn the inventory's node facts into the Kubernetes objects to apply.

Documentation: k8s_manifests.yml, k8s_node_labels.yml, k8s_record.yml and
k8s_drift.yml next to this file.
"""

from __future__ import annotations

import os

import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.filter.summary import stage_passed
from ansible_collections.gpufleet.nvidia.plugins.module_utils.lazy import LazyModule

k8s = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.k8s_objects")
k8s_state = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.k8s_state")
mig_config = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_config")
monitoring = LazyModule("ansible_collections.gpufleet.nvidia.plugins.module_utils.monitoring")

# GPU Operator component names of the stages whose outcome a deploy label reports.
_STAGE_COMPONENTS = (
    ("driver", "driver_stage"),
    ("container-toolkit", "toolkit_stage"),
    ("operator-validator", "validator_stage"),
)
# Components that run either as a DaemonSet (mode "cluster") or on the host.
_MODE_COMPONENTS = (
    ("device-plugin", "device_plugin_stage"),
    ("dcgm-exporter", "exporter_stage"),
)


def _deploy_value(outcome):
    """true: gpufleet deploys it and it passed; pre-installed: present, not ours; false."""
    if not stage_passed(outcome):
        return "false"
    return "true" if outcome.get("status") == "ready" else "pre-installed"


def _mode_value(outcome):
    if outcome.get("status") != "ready":
        return "false"
    return "true" if outcome.get("mode") == "cluster" else "pre-installed"


def k8s_node_labels(hostvars):
    """The nvidia.com/ labels gpufleet owns on one host's Node; None without facts."""
    name = hostvars.get("inventory_hostname", "?")
    facts = (hostvars.get("ansible_facts") or {}).get("gpufleet")
    if facts is None:
        return None
    if not facts.get("gpu_count"):
        return {k8s.LABEL_PREFIX + "gpu.present": "false"}
    labels = dict(facts.get("labels") or {})
    for component, fact in _STAGE_COMPONENTS:
        labels[f"nvidia.com/gpu.deploy.{component}"] = _deploy_value(hostvars.get(fact) or {})
    for component, fact in _MODE_COMPONENTS:
        labels[f"nvidia.com/gpu.deploy.{component}"] = _mode_value(hostvars.get(fact) or {})
    plugin = hostvars.get("device_plugin_stage") or {}
    config = plugin.get("config") or k8s.plugin_config()
    labels[k8s.PLUGIN_CONFIG_LABEL] = config["name"]
    labels["nvidia.com/gpu.sharing-strategy"] = config["sharing"]
    labels["nvidia.com/gpu.replicas"] = str(config["replicas"])
    labels["nvidia.com/mps.capable"] = "true" if config["sharing"] == "mps" else "false"
    if "nvidia.com/mig.capable" in labels:
        labels["nvidia.com/mig.strategy"] = config["mig_strategy"]
    labels.update(_mig_labels(facts["gpus"], config["mig_strategy"], labels))
    mig = hostvars.get("mig_stage") or {}
    if mig.get("config"):
        # As the GPU Operator's mig-manager reports the layout it was asked for.
        labels["nvidia.com/mig.config"] = mig["config"]
        labels["nvidia.com/mig.config.state"] = _MIG_STATE.get(mig.get("status"), "pending")
    try:
        for key, value in labels.items():
            k8s.check_label(key, value, f"host {name}")
    except k8s.K8sInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return dict(sorted(labels.items()))


# mig_stage status -> nvidia.com/mig.config.state (mig-manager's values).
_MIG_STATE = {"ready": "success", "failed": "failed"}


def _mig_profiles(gpus):
    return {d.get("profile") for g in gpus for d in g.get("mig_devices") or []}


def _mig_labels(gpus, strategy, labels):
    """GPU Feature Discovery's MIG labels: with `single`, the node's GPUs are its MIG
    devices (all of one profile); with `mixed`, each profile is counted on its own
    (`+` in a profile name becomes `.`, as the device plugin names its resources)."""
    devices = [d for g in gpus for d in g.get("mig_devices") or [] if d.get("profile")]
    if strategy == "none" or not devices:
        return {}
    product = labels.get("nvidia.com/gpu.product", "")
    out = {}
    by_profile = {}
    for device in devices:
        by_profile.setdefault(device["profile"], []).append(device)
    for profile, group in sorted(by_profile.items()):
        shape = mig_config.parse_profile(profile)
        prefix = (
            "nvidia.com/gpu"
            if strategy == "single"
            else f"nvidia.com/mig-{profile.replace('+', '.')}"
        )
        out[f"{prefix}.count"] = str(len(group))
        out[f"{prefix}.product"] = f"{product}-MIG-{profile.replace('+', '.')}"
        out[f"{prefix}.memory"] = str(group[0].get("memory_mib") or 0)
        out[f"{prefix}.multiprocessors"] = str(group[0].get("multiprocessor_count") or 0)
        out[f"{prefix}.slices.gi"] = str(shape.slices)
        out[f"{prefix}.slices.ci"] = str(shape.compute)
    return out


def _check_settings(settings):
    k8s.check_dns_label(settings["namespace"], "k8s_manifests_namespace")
    k8s.check_label(k8s.OWNER_LABEL, settings["managed_by"], "k8s_manifests_field_manager")
    for key, value in settings["images"].items():
        k8s.check_image(value, f"k8s_manifests_{key}_image")
    k8s.check_dns_label(settings["plugin_configmap"], "k8s_manifests_device_plugin_configmap")
    if settings["runtime_class_name"]:
        k8s.check_dns_label(settings["runtime_class_name"], "k8s_manifests_runtime_class_name")
    if settings["daemonset_runtime_class"]:
        k8s.check_dns_label(
            settings["daemonset_runtime_class"], "k8s_manifests_daemonset_runtime_class"
        )
    port = settings["exporter_port"]
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise k8s.K8sInputError(
            f"k8s_manifests_exporter_port: {port!r} is not a port (expected 1-65535)"
        )
    if not k8s.DURATION.match(str(settings["exporter_scrape_interval"])):
        raise k8s.K8sInputError(
            "k8s_manifests_exporter_scrape_interval: "
            f"{settings['exporter_scrape_interval']!r} is not a duration (expected e.g. 30s, 1m)"
        )
    for secret in settings.get("image_pull_secrets") or []:
        k8s.check_dns_label(secret, "k8s_manifests_image_pull_secrets")


def k8s_manifests(hostvars_list, settings, node_names=None, previous=None):
    """Everything the k8s_manifests role renders and applies, as plain data.

    Returns ``objects`` (cluster objects, in the order to apply them), ``nodes`` (the
    labelled part of each Node: host, name, labels, object), ``without_facts``
    (hosts that could not be described, e.g. unreachable ones, or not in this run)
    and ``exporter_hosts`` (the hosts that run dcgm-exporter in cluster mode; without
    one, the exporter's objects are left out: see exporter_cluster_hosts).

    `previous` is the record ConfigMap of the last apply (or None): a host without
    facts whose Node it labelled keeps counting with those labels, so a run limited
    to some hosts does not drop the device plugin configuration (or the MPS daemon,
    or MIG's capability) that the other Nodes still select.
    """
    node_names = node_names or {}
    try:
        _check_settings(settings)
        nodes, without_facts = [], []
        for hostvars in hostvars_list:
            host = hostvars.get("inventory_hostname", "?")
            labels = k8s_node_labels(hostvars)
            if labels is None:
                without_facts.append(host)
                continue
            name = str(node_names.get(host, host))
            k8s.check_node_name(name, f"k8s_manifests_node_names[{host!r}]")
            nodes.append(
                {
                    "host": host,
                    "name": name,
                    "labels": labels,
                    "object": k8s.node_object(name, labels),
                }
            )
        configs = {"default": k8s.plugin_config()}
        for hostvars in hostvars_list:
            config = (hostvars.get("device_plugin_stage") or {}).get("config")
            if config:
                configs[config["name"]] = config
        for config in _recorded_configs(previous, without_facts):
            configs.setdefault(config["name"], config)
        objects = [k8s.namespace(settings)]
        if settings["runtime_class_name"]:
            objects.append(k8s.runtime_class(settings))
        if settings["device_plugin"]:
            objects += k8s.device_plugin_objects(settings, list(configs.values()))
        exporter_hosts = exporter_cluster_hosts(
            hostvars_list, settings["exporter_default_mode"], previous
        )
        if settings["exporter"] and exporter_hosts:
            objects += k8s.exporter_objects(settings, settings["service_monitor"])
        objects += monitoring_objects(settings)
    except (k8s.K8sInputError, monitoring.MonitoringError) as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return {
        "objects": objects,
        "nodes": nodes,
        "without_facts": without_facts,
        "exporter_hosts": exporter_hosts,
    }


def monitoring_objects(settings):
    """gpufleet's own monitoring where the site asks for it: its rules as a
    PrometheusRule (`alert_rules`), its dashboard as a ConfigMap for Grafana's
    sidecar (`dashboard`), from the documents in `monitoring_dir` (the role's
    files/monitoring), made for the site's exporter job and runbook URL."""
    if not settings.get("alert_rules") and not settings.get("dashboard"):
        return []
    job = monitoring.check_exporter_job(settings["exporter_job"], "k8s_manifests_exporter_job")
    url = settings["runbook_url"]
    if url:
        monitoring.check_runbook_url(url, "k8s_manifests_runbook_url")
    k8s.check_dns_label(settings["monitoring_namespace"], "k8s_manifests_monitoring_namespace")
    objects = []
    if settings["alert_rules"]:
        rules = monitoring.rules(
            yaml.safe_load(_shipped(settings, monitoring.RULES_FILE)), url, job
        )
        meta = _monitoring_meta(settings, "gpufleet-rules", "alert_rules_labels")
        objects.append(monitoring.prometheus_rule(rules, meta))
    if settings["dashboard"]:
        board = monitoring.dashboard(_shipped(settings, monitoring.DASHBOARD_FILE), job)
        meta = _monitoring_meta(settings, "gpufleet-dashboard", "dashboard_labels")
        objects.append(monitoring.dashboard_configmap(board, meta))
    return objects


def _shipped(settings, name):
    with open(os.path.join(settings["monitoring_dir"], name), encoding="utf-8") as text:
        return text.read()


def _monitoring_meta(settings, name, setting):
    labels = settings[setting]
    for key, value in labels.items():
        k8s.check_label(key, value, "k8s_manifests_" + setting)
    owned = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/part-of": k8s.PART_OF,
        k8s.OWNER_LABEL: settings["managed_by"],
    }
    return {
        "name": name,
        "namespace": settings["monitoring_namespace"],
        "labels": {**owned, **labels},
    }


def exporter_cluster_hosts(hostvars_list, default_mode, previous=None):
    """The GPU hosts that run dcgm-exporter in cluster mode, as the DaemonSet's pod.

    A host's mode is the one its exporter stage ran with in this run
    (exporter_stage.mode), else its exporter_mode as the inventory sets it, else
    `default_mode` (the exporter role's default). A host counts when it is known to
    have GPUs: from its facts, or, for a host without facts in this run (a run
    limited to other hosts, the cluster side run alone), from the labels the record
    `previous` holds for its Node; a host the cluster side never labelled gets no
    pod anyway. Without any such host the DaemonSet would be scheduled on no node,
    so the exporter's objects are not built (and an apply prunes those it made).
    """
    record = k8s_state.parse_record(previous) or {}
    recorded_gpus = {
        entry.get("host")
        for entry in (record.get("nodes") or {}).values()
        if (entry.get("labels") or {}).get(k8s.LABEL_PREFIX + "gpu.present") == "true"
    }
    hosts = []
    for hostvars in hostvars_list:
        host = hostvars.get("inventory_hostname", "?")
        mode = (
            (hostvars.get("exporter_stage") or {}).get("mode")
            or hostvars.get("exporter_mode")
            or default_mode
        )
        facts = (hostvars.get("ansible_facts") or {}).get("gpufleet")
        has_gpus = bool(facts.get("gpu_count")) if facts is not None else host in recorded_gpus
        if mode == "cluster" and has_gpus:
            hosts.append(host)
    return hosts


def _recorded_configs(previous, hosts):
    """The device plugin configurations the recorded labels of `hosts`' Nodes select."""
    record = k8s_state.parse_record(previous) or {}
    for entry in (record.get("nodes") or {}).values():
        labels = entry.get("labels") or {}
        sharing = labels.get("nvidia.com/gpu.sharing-strategy")
        if entry.get("host") not in hosts or sharing is None:
            continue
        yield k8s.plugin_config(
            sharing,
            int(labels.get("nvidia.com/gpu.replicas", "1")),
            labels.get("nvidia.com/mig.strategy", "none"),
            where=f"the recorded labels of host {entry.get('host')}",
        )


def device_plugin_config(gpus, sharing, replicas, mig_strategy, host="node"):
    """The node's device plugin configuration, checked against its GPUs' MIG modes.

    `gpus` are gpu_facts' GPUs (mig_mode True/False, or None where the GPU has no MIG).
    `auto` follows the GPUs as they are (after the MIG stage laid them out): none where
    no GPU has MIG enabled, single where every GPU has and its devices are of one
    profile, mixed otherwise.
    """
    if mig_strategy == "auto":
        mig_strategy = _strategy_of(gpus)
    try:
        config = k8s.plugin_config(sharing, replicas, mig_strategy, where=host)
    except k8s.K8sInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    enabled = [str(i) for i, gpu in enumerate(gpus) if gpu.get("mig_mode") is True]
    capable = [gpu for gpu in gpus if gpu.get("mig_mode") is not None]
    problem = None
    if enabled and mig_strategy == "none":
        problem = (
            f"GPU(s) {', '.join(enabled)} have MIG enabled, so device_plugin_mig_strategy "
            "must be single or mixed (none would advertise no usable GPU there)"
        )
    elif mig_strategy != "none" and not capable:
        problem = f"device_plugin_mig_strategy={mig_strategy} but no GPU here supports MIG"
    elif mig_strategy == "single" and len(enabled) != len(gpus):
        problem = (
            "device_plugin_mig_strategy=single needs MIG enabled on every GPU; "
            f"{len(enabled)} of {len(gpus)} have it (use mixed)"
        )
    elif mig_strategy == "single" and len(_mig_profiles(gpus)) > 1:
        problem = (
            "device_plugin_mig_strategy=single needs one MIG profile on every GPU; "
            f"here are {', '.join(sorted(_mig_profiles(gpus)))} (use mixed)"
        )
    if problem:
        raise AnsibleFilterError(f"{host}: {problem}")
    return config


def _strategy_of(gpus):
    enabled = [gpu for gpu in gpus if gpu.get("mig_mode") is True]
    if not enabled:
        return "none"
    if len(enabled) == len(gpus) and len(_mig_profiles(gpus)) <= 1:
        return "single"
    return "mixed"


def device_plugin_config_file(config):
    """The device plugin's config file for one configuration, as YAML."""
    return k8s.plugin_config_text(config)


def k8s_files(objects):
    """A stable file name for each object, numbered in apply order: 00-namespace-x.yaml."""
    return [
        {
            "name": f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml",
            "object": obj,
        }
        for index, obj in enumerate(objects)
    ]


def k8s_render_files(objects, directory, header):
    """The entries of gpufleet.nvidia.files that write each object to its file of
    k8s_files in `directory`: `header` on the first line, then the object's YAML."""
    return [
        {
            "path": os.path.join(directory, entry["name"]),
            "content": f"{header}\n{k8s_to_yaml(entry['object'])}",
            "mode": "0644",
        }
        for entry in k8s_files(objects)
    ]


def k8s_unwanted(resources, objects, kind):
    """Those of `resources` (listed from the cluster, of one kind) not among `objects`."""

    def key(obj):
        return obj["metadata"].get("namespace") or "", obj["metadata"]["name"]

    wanted = {key(obj) for obj in objects if obj["kind"] == kind}
    return [resource for resource in resources if key(resource) not in wanted]


def k8s_prunable(reads, kinds, objects):
    """[{api_version, kind, namespace, name}] to delete: for each kind of `kinds`
    ([{api_version, kind}]), those of its resources in `reads` (k8s_read's results for
    those kinds, in the same order) that `objects` no longer holds."""
    return [
        {
            "api_version": entry["api_version"],
            "kind": entry["kind"],
            "namespace": resource["metadata"].get("namespace") or "",
            "name": resource["metadata"]["name"],
        }
        for entry, read in zip(kinds, reads, strict=True)
        for resource in k8s_unwanted(read.get("resources") or [], objects, entry["kind"])
    ]


def k8s_record(previous, objects, nodes, hosts, namespace):
    """The record ConfigMap after an apply (see module_utils/k8s_state.py).

    `previous` is the record ConfigMap as listed (or None), `nodes` the labelled
    Nodes ([{host, name, labels}]), `hosts` the hosts the cluster side describes."""
    record = k8s_state.new_record(
        k8s_state.parse_record(previous), [k8s.plain(o) for o in objects], nodes, list(hosts)
    )
    return k8s_state.record_configmap(record, namespace)


def k8s_drift(record, objects, nodes):
    """{recorded, drift}: the cluster compared with the record ConfigMap `record`
    (as listed, or None), from the owned `objects` and the `nodes` listed."""
    parsed = k8s_state.parse_record(record)
    if parsed is None:
        return {"recorded": False, "drift": []}
    return {"recorded": True, "drift": k8s_state.drift(parsed, objects, nodes)}


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (ConfigMap data stays readable)."""


def _str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def k8s_to_yaml(obj):
    """One object as a YAML document, keys in the order they were built."""
    return yaml.dump(
        k8s.plain(obj), Dumper=_Dumper, default_flow_style=False, sort_keys=False, width=100
    )


class FilterModule:
    def filters(self):
        return {
            "k8s_manifests": k8s_manifests,
            "k8s_node_labels": k8s_node_labels,
            "k8s_files": k8s_files,
            "k8s_render_files": k8s_render_files,
            "device_plugin_config": device_plugin_config,
            "device_plugin_config_file": device_plugin_config_file,
            "k8s_to_yaml": k8s_to_yaml,
            "k8s_unwanted": k8s_unwanted,
            "k8s_prunable": k8s_prunable,
            "k8s_record": k8s_record,
            "k8s_drift": k8s_drift,
        }

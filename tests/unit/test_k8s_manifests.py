# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The cluster side: node labels from each GPU profile, the manifests (schema-valid for
every supported Kubernetes minor, and right where the schemas cannot tell), and bad
input refused before anything is built."""

from __future__ import annotations

import copy
import functools
import json
import re

import kubernetes_validate
import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.filter import k8s
from ansible_collections.gpufleet.nvidia.plugins.module_utils import discovery, pci, smi
from conftest import PROJECT, real_smi_outputs
from gpusim import profiles

PROFILE_DIR = PROJECT / "tests" / "sim" / "kit" / "profiles"
KUBERNETES_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0")
READY = {"status": "ready"}


def profile_facts(name: str) -> dict:
    """gpu_facts' facts for a node of this profile with the 535 driver loaded: read by its
    parsers from Debian's nvidia-smi running on the mock NVML (a copy: tests edit it)."""
    return copy.deepcopy(_profile_facts(name))


@functools.cache
def _profile_facts(name: str) -> dict:
    prof = profiles.load(PROFILE_DIR, name, f"node-{name}")
    devices = [
        pci.PciDevice(g.sysfs_name, 0x10DE, g.device_id, g.pci_class, g.numa_node, "nvidia")
        for g in prof.gpus
    ]
    rows = xml = None
    if devices:
        csv_out, xml_out, listed = real_smi_outputs(name, f"node-{name}")
        rows = smi.parse_query_csv(csv_out)
        xml = smi.parse_query_xml(xml_out)
        if any(row["mig.mode.current"] for row in rows):  # as gpu_facts does
            smi.name_mig_devices(xml, smi.parse_list(listed))
    gpus = discovery.gpu_list(devices, rows, xml)
    driver = {"state": "loaded", "version": "535.261.03"} if devices else {"state": "absent"}
    return {
        "gpu_count": len(gpus),
        "gpus": gpus,
        "labels": discovery.labels(gpus, driver, (xml or {}).get("cuda_version")),
    }


def host(name: str, profile: str, sharing="none", replicas=1, mig="none", **stages) -> dict:
    facts = profile_facts(profile)
    config = k8s.device_plugin_config(facts["gpus"], sharing, replicas, mig, name)
    hostvars = {
        "inventory_hostname": name,
        "ansible_facts": {"gpufleet": facts},
        "driver_stage": READY,
        "toolkit_stage": READY,
        "runtime_config_stage": READY,
        "validator_stage": READY,
        "device_plugin_stage": {"status": "ready", "mode": "cluster", "config": config},
        "exporter_stage": {"status": "ready", "mode": "cluster"},
    }
    hostvars.update(stages)
    return hostvars


@functools.cache
def _role_vars() -> dict:
    return yaml.safe_load((PROJECT / "roles/k8s_manifests/vars/main.yml").read_text())


def settings(**changes) -> dict:
    """The role's settings at their defaults (vars/main.yml over defaults/main.yml)."""
    raw = yaml.safe_load((PROJECT / "roles/k8s_manifests/defaults/main.yml").read_text())
    # Defaults that name another default ("{{ k8s_manifests_registry }}/...") resolved
    # as Ansible would.
    defaults = {
        name: re.sub(r"\{\{ (k8s_manifests_\w+) \}\}", lambda m: str(raw[m[1]]), value)
        if isinstance(value, str)
        else value
        for name, value in raw.items()
    }
    image = {
        key: defaults[f"k8s_manifests_{key}_image"] for key in ("device_plugin", "dcgm_exporter")
    }
    result = {
        "namespace": defaults["k8s_manifests_namespace"],
        "managed_by": defaults["k8s_manifests_field_manager"],
        "images": image,
        "image_pull_policy": defaults["k8s_manifests_image_pull_policy"],
        "image_pull_secrets": [],
        "priority_class_name": defaults["k8s_manifests_priority_class_name"],
        "extra_tolerations": [],
        "runtime_class_name": defaults["k8s_manifests_runtime_class_name"],
        "runtime_class_handler": defaults["k8s_manifests_runtime_class_handler"],
        "daemonset_runtime_class": defaults["k8s_manifests_daemonset_runtime_class"],
        "device_plugin": True,
        "plugin_configmap": defaults["k8s_manifests_device_plugin_configmap"],
        "exporter": True,
        "exporter_default_mode": _role_vars()["_k8s_manifests_settings"]["exporter_default_mode"],
        "exporter_port": defaults["k8s_manifests_exporter_port"],
        "exporter_collectors": "",
        "exporter_scrape_interval": defaults["k8s_manifests_exporter_scrape_interval"],
        "service_monitor": True,
        "alert_rules": False,
        "alert_rules_labels": {},
        "runbook_url": defaults["k8s_manifests_runbook_url"],
        "dashboard": defaults["k8s_manifests_dashboard"],
        "dashboard_labels": {},
        "monitoring_namespace": defaults["k8s_manifests_namespace"],
        "exporter_job": defaults["k8s_manifests_exporter_job"],
        "monitoring_dir": str(PROJECT / "roles/k8s_manifests/files/monitoring"),
    }
    result.update(changes)
    return result


def single_mig_host(name: str) -> dict:
    """An a100-mig node laid out as seven 1g.5gb on each GPU, under the single strategy."""
    hostvars = host(name, "a100-mig", mig="mixed")
    gpus = hostvars["ansible_facts"]["gpufleet"]["gpus"]
    one = next(d for g in gpus for d in g["mig_devices"] if d["profile"] == "1g.5gb")
    for gpu in gpus:
        gpu["mig_devices"] = [dict(one, index=i) for i in range(7)]
    config = k8s.device_plugin_config(gpus, "none", 1, "single", name)
    hostvars["device_plugin_stage"]["config"] = config
    return hostvars


FLEETS = {
    "plain": [host("h100", "h100-sxm-8"), host("t4", "t4-1"), host("cpu", "none")],
    "time-slicing": [
        host("a100", "a100-pcie-2", sharing="time-slicing", replicas=4),
        host("t4", "t4-1"),
    ],
    "mps": [host("t4", "t4-1", sharing="mps", replicas=2), host("h100", "h100-sxm-8")],
    "mig": [
        host("mig-a", "a100-mig", mig="mixed"),
        single_mig_host("mig-b"),
        host("a100", "a100-pcie-2"),
    ],
}


def build(fleet: str, **changes) -> dict:
    return k8s.k8s_manifests(FLEETS[fleet], settings(**changes))


def every_object(built: dict) -> list[dict]:
    return built["objects"] + [node["object"] for node in built["nodes"]]


# --- schemas ------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_every_manifest_is_valid_for_each_supported_kubernetes(fleet, version):
    built = build(fleet, exporter_collectors="DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization.\n")
    checked = 0
    for obj in every_object(built):
        if obj["kind"] in ("ServiceMonitor", "PrometheusRule"):
            continue  # CRDs of the Prometheus operator: no upstream schema (checked below;
            # molecule `cluster` applies them to an API server that has the CRDs)
        # Through YAML, as a user applies the rendered file.
        document = yaml.safe_load(k8s.k8s_to_yaml(obj))
        kubernetes_validate.validate(document, version, strict=True)
        checked += 1
    assert checked >= 10


def test_rendered_files_are_numbered_in_apply_order_each_headed_and_read_back_whole():
    objects = build("plain")["objects"]
    entries = k8s.k8s_render_files(objects, "/srv/manifests", "# Rendered here")
    assert entries[0]["path"] == "/srv/manifests/00-namespace-gpufleet.yaml"
    assert {e["mode"] for e in entries} == {"0644"}
    for entry, obj, named in zip(entries, objects, k8s.k8s_files(objects), strict=True):
        assert entry["path"] == f"/srv/manifests/{named['name']}"
        first, rest = entry["content"].split("\n", 1)
        assert first == "# Rendered here"
        assert rest == k8s.k8s_to_yaml(obj)


def test_gpufleets_monitoring_is_applied_only_where_the_site_asks_and_made_for_it():
    assert {o["kind"] for o in build("plain")["objects"]}.isdisjoint({"PrometheusRule"})
    objects = build(
        "plain",
        alert_rules=True,
        alert_rules_labels={"release": "kube-prometheus-stack"},
        runbook_url="https://wiki.example.org/gpufleet/monitoring",
        dashboard=True,
        dashboard_labels={"grafana_dashboard": "gpu"},
        monitoring_namespace="monitoring",
        exporter_job="gpu-metrics",
    )["objects"]
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    (board,) = [o for o in objects if o["metadata"]["name"] == "gpufleet-dashboard"]
    for obj in (rule, board):
        assert obj["metadata"]["namespace"] == "monitoring"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpufleet"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    alerts = [r for r in rules if "alert" in r]
    assert alerts and all(
        r["annotations"]["runbook_url"]
        == f"https://wiki.example.org/gpufleet/monitoring#{r['alert'].lower()}"
        for r in alerts
    )
    exprs = " ".join(r["expr"] for r in rules)
    assert 'job=~"gpu-metrics"' in exprs and "dcgm" not in exprs
    # The site's sidecar label wins over the default value "1".
    assert board["metadata"]["labels"]["grafana_dashboard"] == "gpu"
    dashboard = json.loads(board["data"]["gpufleet-dashboard.json"])
    assert "gpu-metrics" in json.dumps(dashboard["templating"])
    kubernetes_validate.validate(yaml.safe_load(k8s.k8s_to_yaml(board)), KUBERNETES_VERSIONS[-1])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"exporter_job": 'dcgm"'}, "k8s_manifests_exporter_job"),
        ({"runbook_url": "wiki/gpufleet"}, "k8s_manifests_runbook_url"),
        (
            {"alert_rules_labels": {"release": "kube prometheus"}},
            "k8s_manifests_alert_rules_labels",
        ),
        ({"monitoring_namespace": "Monitoring"}, "k8s_manifests_monitoring_namespace"),
    ],
)
def test_bad_monitoring_settings_are_refused_naming_the_variable(changes, message):
    with pytest.raises(AnsibleFilterError, match=message):
        build("plain", alert_rules=True, **changes)


def test_service_monitor_selects_the_exporter_service():
    objects = build("plain")["objects"]
    monitor = next(o for o in objects if o["kind"] == "ServiceMonitor")
    service = next(o for o in objects if o["kind"] == "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    labels = monitor["spec"]["selector"]["matchLabels"]
    assert labels.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]


# --- semantics the schemas cannot check -------------------------------------------


def daemonsets(built: dict) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in built["objects"] if o["kind"] == "DaemonSet"}


@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_daemonsets_select_their_pods_and_run_only_on_gpu_nodes(fleet):
    built = build(fleet)
    for name, ds in daemonsets(built).items():
        pod = ds["spec"]["template"]
        selector = ds["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items(), name
        spec = pod["spec"]
        assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true", name
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
            "tolerations"
        ]
        assert spec["priorityClassName"] == "system-node-critical"
        assert spec["runtimeClassName"] == "nvidia"
        volumes = {v["name"] for v in spec["volumes"]}
        for container in spec.get("initContainers", []) + spec["containers"]:
            mounts = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounts <= volumes, (name, container["name"], mounts - volumes)
        if "serviceAccountName" in spec:
            accounts = [o for o in built["objects"] if o["kind"] == "ServiceAccount"]
            assert spec["serviceAccountName"] in {a["metadata"]["name"] for a in accounts}


def test_device_plugin_is_unprivileged_with_every_capability_dropped():
    plugin_ds = daemonsets(build("plain"))["nvidia-device-plugin"]
    spec = plugin_ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["nvidia.com/gpu.deploy.device-plugin"] == "true"
    for container in spec["initContainers"] + spec["containers"]:
        context = container["securityContext"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        assert "add" not in context["capabilities"]
        assert context["allowPrivilegeEscalation"] is False
        assert not context.get("privileged")
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert "/var/lib/kubelet/device-plugins" in paths
    env = {e["name"]: e.get("value") for e in spec["initContainers"][0]["env"]}
    assert env["NODE_LABEL"] == "nvidia.com/device-plugin.config"


def test_no_pod_of_any_fleet_is_privileged():
    for fleet in FLEETS:
        for name, ds in daemonsets(build(fleet)).items():
            spec = ds["spec"]["template"]["spec"]
            for container in spec.get("initContainers", []) + spec["containers"]:
                context = container.get("securityContext", {})
                assert not context.get("privileged"), (fleet, name, container["name"])
                mounts = container.get("volumeMounts", [])
                assert all("mountPropagation" not in m for m in mounts), (name, mounts)


def test_the_mps_control_daemon_gets_cap_sys_admin_and_the_nodes_shared_memory():
    spec = daemonsets(build("mps"))["nvidia-device-plugin-mps-control-daemon"]["spec"]
    pod = spec["template"]["spec"]
    daemon = next(c for c in pod["containers"] if c["name"] == "mps-control-daemon")
    # nvidia-smi -c EXCLUSIVE_PROCESS, which the driver allows with CAP_SYS_ADMIN only.
    assert daemon["securityContext"]["capabilities"] == {"add": ["SYS_ADMIN"]}
    assert daemon["securityContext"]["allowPrivilegeEscalation"] is False
    assert [c["name"] for c in pod["initContainers"]] == ["config-manager-init"]
    shm = next(v for v in pod["volumes"] if v["name"] == "mps-shm")
    # Mounted on the node by the device_plugin role (run-nvidia-mps-shm.mount).
    assert shm["hostPath"] == {"path": "/run/nvidia/mps/shm", "type": "Directory"}


def test_mig_strategies_add_only_cap_sys_admin_to_the_plugin():
    spec = daemonsets(build("mig"))["nvidia-device-plugin"]["spec"]["template"]["spec"]
    plugin = next(c for c in spec["containers"] if c["name"] == "nvidia-device-plugin")
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert not plugin["securityContext"].get("privileged")


@pytest.mark.parametrize(
    ("collectors", "added"),
    [
        ("", None),
        ("DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization.\n", None),
        ("# DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, off.\nDCGM_FI_DEV_FB_USED, gauge, x.\n", None),
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the engine is active.\n",
            ["SYS_ADMIN"],
        ),
    ],
)
def test_the_exporter_gets_cap_sys_admin_only_for_profiling_fields(collectors, added):
    spec = daemonsets(build("plain", exporter_collectors=collectors))["nvidia-dcgm-exporter"]
    (container,) = spec["spec"]["template"]["spec"]["containers"]
    context = container["securityContext"]
    assert not context.get("privileged")
    assert context.get("capabilities", {}).get("add") == added


def test_each_node_names_a_config_the_configmap_has():
    for fleet in FLEETS:
        built = build(fleet)
        configmap = next(o for o in built["objects"] if o["kind"] == "ConfigMap")
        for node in built["nodes"]:
            chosen = node["labels"].get("nvidia.com/device-plugin.config")
            if chosen is not None:
                assert chosen in configmap["data"], (fleet, node["name"])
        for text in configmap["data"].values():
            assert yaml.safe_load(text)["version"] == "v1"


def test_sharing_configurations_follow_the_plugin_config_format():
    data = next(o for o in build("time-slicing")["objects"] if o["kind"] == "ConfigMap")["data"]
    assert yaml.safe_load(data["time-slicing-4"]) == {
        "version": "v1",
        "flags": {"migStrategy": "none"},
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
    }
    mps = next(o for o in build("mps")["objects"] if o["kind"] == "ConfigMap")["data"]
    assert yaml.safe_load(mps["mps-2"])["sharing"]["mps"]["resources"][0]["replicas"] == 2
    mig = next(o for o in build("mig")["objects"] if o["kind"] == "ConfigMap")["data"]
    assert yaml.safe_load(mig["mig-mixed"])["flags"]["migStrategy"] == "mixed"
    assert yaml.safe_load(mig["mig-single"])["flags"]["migStrategy"] == "single"


def test_mps_brings_the_control_daemon_only_where_mps_is_chosen():
    assert "nvidia-device-plugin-mps-control-daemon" not in daemonsets(build("plain"))
    ds = daemonsets(build("mps"))["nvidia-device-plugin-mps-control-daemon"]
    assert ds["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/mps.capable"] == "true"
    labels = {n["name"]: n["labels"] for n in build("mps")["nodes"]}
    assert labels["t4"]["nvidia.com/mps.capable"] == "true"
    assert labels["h100"]["nvidia.com/mps.capable"] == "false"


def test_exporter_serves_port_9400_with_pod_attribution():
    built = build("plain")
    spec = daemonsets(built)["nvidia-dcgm-exporter"]["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert {"name": "DCGM_EXPORTER_LISTEN", "value": ":9400"} in container["env"]
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert "/var/lib/kubelet/pod-resources" in paths
    service = next(o for o in built["objects"] if o["kind"] == "Service")
    assert service["spec"]["selector"].items() <= spec_labels(built, "nvidia-dcgm-exporter")
    assert service["spec"]["ports"][0]["targetPort"] == 9400


def spec_labels(built: dict, name: str):
    return daemonsets(built)[name]["spec"]["template"]["metadata"]["labels"].items()


def test_every_object_carries_the_ownership_label_and_images_are_configurable():
    built = build(
        "plain",
        images={
            "device_plugin": "mirror.local:5000/nv/dp:v1",
            "dcgm_exporter": "mirror.local:5000/nv/dcgm:3",
        },
    )
    for obj in built["objects"]:
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpufleet"
    images = {
        c["image"]
        for ds in daemonsets(built).values()
        for c in ds["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"mirror.local:5000/nv/dp:v1", "mirror.local:5000/nv/dcgm:3"}


def test_unwanted_lists_only_our_objects_missing_from_the_set():
    objects = build("plain")["objects"]
    listed = [
        {"metadata": {"name": "nvidia-device-plugin", "namespace": "gpufleet"}},
        {"metadata": {"name": "nvidia-device-plugin", "namespace": "old-namespace"}},
        {"metadata": {"name": "retired-exporter", "namespace": "gpufleet"}},
    ]
    unwanted = k8s.k8s_unwanted(listed, objects, "DaemonSet")
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in unwanted] == [
        ("old-namespace", "nvidia-device-plugin"),
        ("gpufleet", "retired-exporter"),
    ]


def test_prunable_names_kind_and_version_of_what_each_kinds_read_has_in_excess():
    """One read of several kinds (k8s_read's results, in the kinds' order): what each
    lists that the set lacks, with the kind and version to delete it by. A kind whose
    API the cluster lacks (no Prometheus operator) lists nothing."""
    objects = build("plain")["objects"]
    kinds = [
        {"api_version": "apps/v1", "kind": "DaemonSet"},
        {"api_version": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole"},
        {"api_version": "monitoring.coreos.com/v1", "kind": "ServiceMonitor"},
    ]
    reads = [
        {
            "api_found": True,
            "resources": [
                {"metadata": {"name": "nvidia-device-plugin", "namespace": "gpufleet"}},
                {"metadata": {"name": "retired-exporter", "namespace": "gpufleet"}},
            ],
        },
        {"api_found": True, "resources": [{"metadata": {"name": "gpufleet-old-role"}}]},
        {"api_found": False, "resources": []},
    ]
    assert k8s.k8s_prunable(reads, kinds, objects) == [
        {
            "api_version": "apps/v1",
            "kind": "DaemonSet",
            "namespace": "gpufleet",
            "name": "retired-exporter",
        },
        {
            "api_version": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "namespace": "",
            "name": "gpufleet-old-role",
        },
    ]
    with pytest.raises(ValueError):  # a read missing: not one kind's answer taken for another's
        k8s.k8s_prunable(reads[:2], kinds, objects)


# --- dcgm-exporter only where a node runs it in cluster mode -------------------------

EXPORTER_KINDS = {"DaemonSet", "Service", "ServiceMonitor", "ConfigMap"}
COLLECTORS = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization.\n"


def in_mode(hostvars: dict, mode: str) -> dict:
    """The host with its exporter stage run in `mode`."""
    return {**hostvars, "exporter_stage": {"status": "ready", "mode": mode}}


def exporter_objects(built: dict) -> list[str]:
    return [
        f"{o['kind']}/{o['metadata']['name']}"
        for o in built["objects"]
        if o["metadata"]["name"].startswith("nvidia-dcgm-exporter")
    ]


def test_the_default_mode_is_the_exporter_roles_default():
    exporter = yaml.safe_load((PROJECT / "roles/exporter/defaults/main.yml").read_text())
    assert settings()["exporter_default_mode"] == exporter["exporter_mode"]


def test_with_every_exporter_on_its_host_no_exporter_object_is_built_and_the_old_is_pruned():
    """The issue's case: every node's exporter in host mode left a DaemonSet scheduled
    on no node. Now nothing of the exporter is built, so the apply prunes what an
    earlier apply made of it, and only that."""
    fleet = [in_mode(h, "host") for h in FLEETS["plain"]]
    built = k8s.k8s_manifests(fleet, settings(exporter_collectors=COLLECTORS))
    assert exporter_objects(built) == []
    assert built["exporter_hosts"] == []
    assert "nvidia-device-plugin" in daemonsets(built)
    assert {n["labels"].get("nvidia.com/gpu.deploy.dcgm-exporter") for n in built["nodes"]} == {
        "pre-installed",
        None,  # the CPU node: gpu.present=false only
    }
    # What the cluster lists with gpufleet's ownership label, from the earlier apply.
    before = k8s.k8s_manifests(FLEETS["plain"], settings(exporter_collectors=COLLECTORS))
    pruned = {
        f"{kind}/{o['metadata']['name']}"
        for kind in EXPORTER_KINDS
        for o in k8s.k8s_unwanted(
            [o for o in before["objects"] if o["kind"] == kind], built["objects"], kind
        )
    }
    assert pruned == {
        "ConfigMap/nvidia-dcgm-exporter-collectors",
        "DaemonSet/nvidia-dcgm-exporter",
        "Service/nvidia-dcgm-exporter",
        "ServiceMonitor/nvidia-dcgm-exporter",
    }
    assert pruned == set(exporter_objects(before)), "the device plugin's objects stay"


def test_one_gpu_node_in_cluster_mode_brings_the_daemonset():
    h100, t4, cpu = FLEETS["plain"]
    fleet = [in_mode(h100, "host"), in_mode(t4, "cluster"), in_mode(cpu, "host")]
    built = k8s.k8s_manifests(fleet, settings())
    assert built["exporter_hosts"] == ["t4"]
    exporter = daemonsets(built)["nvidia-dcgm-exporter"]
    node_selector = exporter["spec"]["template"]["spec"]["nodeSelector"]
    assert node_selector["nvidia.com/gpu.deploy.dcgm-exporter"] == "true"
    # ... which the T4's Node has and the H100's does not: one pod, on the T4.
    deploy = {
        n["host"]: n["labels"].get("nvidia.com/gpu.deploy.dcgm-exporter") for n in built["nodes"]
    }
    assert deploy == {"h100": "pre-installed", "t4": "true", "cpu": None}
    assert {"Service/nvidia-dcgm-exporter", "ServiceMonitor/nvidia-dcgm-exporter"} <= set(
        exporter_objects(built)
    )


def test_a_node_without_gpus_in_cluster_mode_brings_no_daemonset():
    h100, t4, cpu = FLEETS["plain"]
    fleet = [in_mode(h100, "host"), in_mode(t4, "none"), in_mode(cpu, "cluster")]
    assert exporter_objects(k8s.k8s_manifests(fleet, settings())) == []


def test_without_the_stages_outcome_the_inventorys_mode_decides_then_the_default():
    """A host whose exporter stage did not run (an earlier stage failed on it) counts
    by its exporter_mode; where the inventory sets none, by the exporter role's default."""
    t4 = {k: v for k, v in host("t4", "t4-1").items() if k != "exporter_stage"}

    def counted(hostvars: dict, **changes) -> list[str]:
        return k8s.k8s_manifests([hostvars], settings(**changes))["exporter_hosts"]

    assert counted(t4) == []
    assert counted({**t4, "exporter_mode": "cluster"}) == ["t4"]
    assert counted({**t4, "exporter_mode": "host"}) == []
    assert counted(t4, exporter_default_mode="cluster") == ["t4"]


def test_a_run_without_the_cluster_mode_nodes_facts_keeps_the_daemonset_by_the_record():
    """The cluster side run alone, or limited to other hosts: a host without facts in
    this run counts when the record holds its Node as a GPU node; one the record never
    labelled (localhost, a host never reached) does not."""
    everyone = [in_mode(host("t4", "t4-1"), "cluster"), in_mode(host("h100", "h100-sxm-8"), "host")]
    first = k8s.k8s_manifests(everyone, settings())
    record = k8s.k8s_record(None, first["objects"], first["nodes"], ["t4", "h100"], "gpufleet")
    limited = [
        {"inventory_hostname": "t4", "exporter_mode": "cluster"},
        in_mode(host("h100", "h100-sxm-8"), "host"),
        {"inventory_hostname": "localhost", "exporter_mode": "cluster"},
    ]
    later = k8s.k8s_manifests(limited, settings(), None, record)
    assert later["exporter_hosts"] == ["t4"]
    assert "nvidia-dcgm-exporter" in daemonsets(later)
    without = k8s.k8s_manifests(limited, settings())
    assert without["exporter_hosts"] == []
    assert "nvidia-dcgm-exporter" not in daemonsets(without)


# --- node labels ------------------------------------------------------------------

EXPECTED_PRODUCTS = {
    "h100-sxm-8": ("NVIDIA-H100-80GB-HBM3", "8", "hopper", "9", "0", "true"),
    "a100-pcie-2": ("NVIDIA-A100-PCIE-40GB", "2", "ampere", "8", "0", "true"),
    "a100-mig": ("NVIDIA-A100-SXM4-40GB", "2", "ampere", "8", "0", "true"),
    "t4-1": ("Tesla-T4", "1", "turing", "7", "5", "false"),
}


@pytest.mark.parametrize("profile", sorted(EXPECTED_PRODUCTS))
def test_labels_of_each_profile_use_gfd_names(profile):
    mig = "mixed" if profile == "a100-mig" else "none"
    labels = k8s.k8s_node_labels(host("n", profile, mig=mig))
    product, count, family, major, minor, mig_capable = EXPECTED_PRODUCTS[profile]
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.product"] == product
    assert labels["nvidia.com/gpu.count"] == count
    assert labels["nvidia.com/gpu.family"] == family
    assert labels["nvidia.com/gpu.compute.major"] == major
    assert labels["nvidia.com/gpu.compute.minor"] == minor
    assert labels["nvidia.com/mig.capable"] == mig_capable
    assert re.fullmatch(r"[0-9]+", labels["nvidia.com/gpu.memory"])
    assert labels["nvidia.com/cuda.driver-version.full"] == "535.261.03"
    assert labels["nvidia.com/cuda.driver-version.major"] == "535"
    assert labels["nvidia.com/cuda.runtime-version.major"] == "12"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    if mig_capable == "true":
        assert labels["nvidia.com/mig.strategy"] == mig
    for key, value in labels.items():
        assert key.startswith("nvidia.com/")
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", value), key


def test_mixed_strategy_labels_each_mig_profile_as_gfd_does():
    # a100-mig: GPU 0 holds two 3g.20gb instances, GPU 1 seven 1g.5gb.
    labels = k8s.k8s_node_labels(host("n", "a100-mig", mig="mixed"))
    mig = {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-")}
    assert mig == {
        "nvidia.com/mig-1g.5gb.count": "7",
        "nvidia.com/mig-1g.5gb.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/mig-1g.5gb.memory": "4864",
        "nvidia.com/mig-1g.5gb.multiprocessors": "14",
        "nvidia.com/mig-1g.5gb.slices.gi": "1",
        "nvidia.com/mig-1g.5gb.slices.ci": "1",
        "nvidia.com/mig-3g.20gb.count": "2",
        "nvidia.com/mig-3g.20gb.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
        "nvidia.com/mig-3g.20gb.memory": mig["nvidia.com/mig-3g.20gb.memory"],
        "nvidia.com/mig-3g.20gb.multiprocessors": "42",
        "nvidia.com/mig-3g.20gb.slices.gi": "3",
        "nvidia.com/mig-3g.20gb.slices.ci": "3",
    }
    assert int(mig["nvidia.com/mig-3g.20gb.memory"]) > 4 * 4864
    assert labels["nvidia.com/gpu.count"] == "2"  # whole GPUs still counted as such
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"


def test_single_strategy_makes_the_mig_devices_the_nodes_gpus():
    labels = k8s.k8s_node_labels(single_mig_host("n"))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.memory"] == "4864"
    assert labels["nvidia.com/gpu.slices.gi"] == "1"
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert not [k for k in labels if k.startswith("nvidia.com/mig-")]


def test_single_strategy_with_several_profiles_is_refused():
    gpus = host("n", "a100-mig", mig="mixed")["ansible_facts"]["gpufleet"]["gpus"]
    with pytest.raises(
        AnsibleFilterError, match=r"one MIG profile on every GPU; here are 1g\.5gb, 3g\.20gb"
    ):
        k8s.device_plugin_config(gpus, "none", 1, "single", "n")


def test_the_layout_asked_and_its_state_are_labelled():
    ready = host(
        "n", "a100-mig", mig="mixed", mig_stage={"status": "ready", "config": "all-balanced"}
    )
    labels = k8s.k8s_node_labels(ready)
    assert labels["nvidia.com/mig.config"] == "all-balanced"
    assert labels["nvidia.com/mig.config.state"] == "success"
    failed = host("n", "a100-mig", mig="mixed", mig_stage={"status": "failed", "config": "x"})
    assert k8s.k8s_node_labels(failed)["nvidia.com/mig.config.state"] == "failed"
    left = host("n", "a100-mig", mig="mixed", mig_stage={"status": "disabled", "config": ""})
    assert "nvidia.com/mig.config" not in k8s.k8s_node_labels(left)


def test_a_node_without_gpus_is_only_marked_not_present():
    assert k8s.k8s_node_labels(host("cpu", "none")) == {"nvidia.com/gpu.present": "false"}


def test_deploy_labels_follow_the_stages():
    labels = k8s.k8s_node_labels(
        host(
            "n",
            "t4-1",
            driver_stage={"status": "pre-installed"},
            validator_stage={"status": "failed", "reason": "no GPU in the container"},
            exporter_stage={"status": "ready", "mode": "host"},
        )
    )
    assert labels["nvidia.com/gpu.deploy.driver"] == "pre-installed"
    assert labels["nvidia.com/gpu.deploy.container-toolkit"] == "true"
    assert labels["nvidia.com/gpu.deploy.operator-validator"] == "false"
    assert labels["nvidia.com/gpu.deploy.dcgm-exporter"] == "pre-installed"


def test_time_slicing_labels_the_replicas_and_strategy():
    labels = k8s.k8s_node_labels(host("n", "a100-pcie-2", sharing="time-slicing", replicas=4))
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/device-plugin.config"] == "time-slicing-4"


def test_node_names_can_be_mapped():
    built = k8s.k8s_manifests(FLEETS["plain"], settings(), {"t4": "gpu-t4.example.org"})
    assert [n["name"] for n in built["nodes"]] == ["h100", "gpu-t4.example.org", "cpu"]


def test_a_host_without_facts_is_named_not_labelled():
    built = k8s.k8s_manifests([{"inventory_hostname": "gone"}, host("t4", "t4-1")], settings())
    assert built["without_facts"] == ["gone"]
    assert [n["name"] for n in built["nodes"]] == ["t4"]


def test_a_run_limited_to_some_hosts_keeps_what_the_others_nodes_select():
    """The reconciler applies only the hosts that need it: the device plugin's
    configurations and the MPS daemon the other Nodes were given stay."""
    everyone = [host("shared", "t4-1", "mps", 4), host("t4", "t4-1")]
    first = k8s.k8s_manifests(everyone, settings())
    record = k8s.k8s_record(None, first["objects"], first["nodes"], ["shared", "t4"], "gpufleet")
    later = k8s.k8s_manifests(
        [{"inventory_hostname": "shared"}, host("t4", "t4-1")], settings(), None, record
    )
    configmap = next(o for o in later["objects"] if o["kind"] == "ConfigMap")
    assert sorted(configmap["data"]) == ["default", "mps-4"]
    assert "nvidia-device-plugin-mps-control-daemon" in daemonsets(later)
    assert [n["name"] for n in later["nodes"]] == ["t4"], "only hosts with facts are labelled"
    without = k8s.k8s_manifests([{"inventory_hostname": "shared"}, host("t4", "t4-1")], settings())
    assert "mps-4" not in next(o for o in without["objects"] if o["kind"] == "ConfigMap")["data"]


# --- bad input --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sharing", "replicas", "mig", "profile", "message"),
    [
        ("time-slicing", 0, "none", "t4-1", "device_plugin_replicas=0"),
        ("mps", -2, "none", "t4-1", "device_plugin_replicas=-2"),
        ("none", 1, "balanced", "a100-mig", "device_plugin_mig_strategy='balanced'"),
        ("sharing", 1, "none", "t4-1", "device_plugin_sharing='sharing'"),
        ("none", 4, "none", "t4-1", "device_plugin_replicas=4 needs"),
        ("mps", 2, "mixed", "a100-mig", "cannot be combined"),
        ("none", 1, "none", "a100-mig", "have MIG enabled"),
        ("none", 1, "single", "a100-pcie-2", "needs MIG enabled on every GPU"),
        ("none", 1, "mixed", "t4-1", "no GPU here supports MIG"),
    ],
)
def test_bad_device_plugin_choices_are_refused(sharing, replicas, mig, profile, message):
    with pytest.raises(AnsibleFilterError, match=re.escape(message)):
        k8s.device_plugin_config(profile_facts(profile)["gpus"], sharing, replicas, mig, "n")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {
                "images": {
                    "device_plugin": "nvcr.io/nvidia/k8s-device-plugin: v0.19",
                    "dcgm_exporter": "x",
                }
            },
            "k8s_manifests_device_plugin_image",
        ),
        ({"managed_by": "gpu fleet"}, "k8s_manifests_field_manager"),
        ({"namespace": "GPU_Fleet"}, "k8s_manifests_namespace"),
        ({"exporter_port": 0}, "k8s_manifests_exporter_port"),
        ({"exporter_scrape_interval": "soon"}, "k8s_manifests_exporter_scrape_interval"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(changes, message):
    with pytest.raises(AnsibleFilterError, match=message):
        k8s.k8s_manifests(FLEETS["plain"], settings(**changes))


def test_a_node_name_kubernetes_rejects_is_refused():
    with pytest.raises(AnsibleFilterError, match=r"k8s_manifests_node_names\['t4'\]"):
        k8s.k8s_manifests(FLEETS["plain"], settings(), {"t4": "Node With Spaces"})


def test_a_label_value_kubernetes_rejects_is_refused():
    bad = host("t4", "t4-1")
    bad["ansible_facts"]["gpufleet"]["labels"]["nvidia.com/gpu.product"] = "Tesla T4 (rev a1)"
    with pytest.raises(AnsibleFilterError, match=r"host t4: label nvidia.com/gpu.product="):
        k8s.k8s_node_labels(bad)


def test_the_auto_mig_strategy_follows_the_gpus_as_laid_out():
    """auto, the default: none without MIG, single where every GPU is of one profile
    (the layout a new user tried, all-1g.5gb, alone), mixed otherwise."""
    plain = profile_facts("t4-1")["gpus"]
    assert k8s.device_plugin_config(plain, "none", 1, "auto", "n")["mig_strategy"] == "none"
    single = single_mig_host("n")["ansible_facts"]["gpufleet"]["gpus"]
    config = k8s.device_plugin_config(single, "none", 1, "auto", "n")
    assert (config["mig_strategy"], config["name"]) == ("single", "mig-single")
    several = host("n", "a100-mig", mig="mixed")["ansible_facts"]["gpufleet"]["gpus"]
    assert k8s.device_plugin_config(several, "none", 1, "auto", "n")["mig_strategy"] == "mixed"
    one_off = [dict(single[0]), dict(single[1], mig_mode=False, mig_devices=[])]
    assert k8s.device_plugin_config(one_off, "none", 1, "auto", "n")["mig_strategy"] == "mixed"

# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Kubernetes objects gpufleet applies, built as plain data (no cluster needed).

Everything here is a pure function of the settings and the nodes, so the manifests
can be rendered for review, validated against the Kubernetes schemas and applied,
all from the same objects.

Facts from upstream, restated (not copied):
- NVIDIA k8s-device-plugin (Helm chart and README): image nvcr.io/nvidia/k8s-device-plugin;
  its config file (version v1, flags.migStrategy, sharing.timeSlicing / sharing.mps
  resources with replicas); the config-manager program in the same image picks the
  file named by the node label nvidia.com/device-plugin.config from a ConfigMap
  mounted at /available-configs and writes /config/config.yaml (init container
  once, sidecar watching and sending SIGHUP); it needs get/list/watch on nodes; the
  plugin drops all capabilities unless a MIG strategy other than none is in use
  (then it needs CAP_SYS_ADMIN); MPS sharing needs the mps-control-daemon DaemonSet
  on nodes labelled nvidia.com/mps.capable=true, with /run/nvidia/mps from the host.
- dcgm-exporter: image nvcr.io/nvidia/k8s/dcgm-exporter:<dcgm>-<exporter>-<os>,
  DCGM_EXPORTER_LISTEN / DCGM_EXPORTER_KUBERNETES, port 9400, CAP_SYS_ADMIN, the
  kubelet's pod-resources socket directory for pod attribution.
- GPU Operator: nvidia.com/gpu.deploy.<component> labels select where each
  operand runs; RuntimeClass nvidia with handler nvidia.
"""

from __future__ import annotations

import re

import yaml

PART_OF = "gpufleet"
# Every object we create carries this label; pruning deletes only objects with it.
OWNER_LABEL = "app.kubernetes.io/managed-by"
LABEL_PREFIX = "nvidia.com/"
PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
SHARING_STRATEGIES = ("none", "time-slicing", "mps")
MIG_STRATEGIES = ("none", "single", "mixed")
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
MPS_ROOT = "/run/nvidia/mps"
GPU_RESOURCE = "nvidia.com/gpu"

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
# A Prometheus duration as ServiceMonitor intervals take it.
DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")
# registry[:port]/path[:tag][@digest], no whitespace; the same shape kubelet accepts.
IMAGE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]{1,2}[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)


class K8sInputError(ValueError):
    """A setting that would produce an object Kubernetes rejects (names the setting)."""


# --- checks -----------------------------------------------------------------------


def check_label(key, value, where):
    prefix, slash, name = key.rpartition("/")
    if slash and not DNS_SUBDOMAIN.match(prefix):
        raise K8sInputError(f"{where}: label key {key!r} has an invalid prefix {prefix!r}")
    if not LABEL_NAME.match(name):
        raise K8sInputError(
            f"{where}: label key {key!r} is not a valid label name "
            "(at most 63 characters: letters, digits, '-', '_', '.', alphanumeric at both ends)"
        )
    if not isinstance(value, str) or not LABEL_VALUE.match(value):
        raise K8sInputError(
            f"{where}: label {key}={value!r} has a value Kubernetes rejects "
            "(expected a string of at most 63 characters: letters, digits, '-', '_', '.', "
            "beginning and ending with a letter or digit, or empty)"
        )


def _require(pattern, value, where, what):
    if not isinstance(value, str) or not pattern.match(value):
        raise K8sInputError(f"{where}: {value!r} is not {what}")


def check_image(reference, where):
    _require(
        IMAGE,
        reference,
        where,
        "an image reference (expected registry/path/name:tag or ...@sha256:<digest>, no spaces)",
    )


def check_dns_label(name, where):
    _require(
        DNS_LABEL,
        name,
        where,
        "a valid name (expected a DNS label: at most 63 lower-case letters, digits and '-', "
        "beginning and ending with a letter or digit)",
    )


def check_node_name(name, where):
    _require(
        DNS_SUBDOMAIN,
        name,
        where,
        "a valid Kubernetes node name (expected lower-case letters, digits, '-' and '.')",
    )


# --- device plugin configurations -------------------------------------------------


def plugin_config(sharing="none", replicas=1, mig_strategy="none", where="device plugin"):
    """A checked per-node device plugin configuration, with the name nodes select it by."""
    if sharing not in SHARING_STRATEGIES:
        raise K8sInputError(
            f"{where}: device_plugin_sharing={sharing!r}; expected one of "
            f"{', '.join(SHARING_STRATEGIES)}"
        )
    if mig_strategy not in MIG_STRATEGIES:
        raise K8sInputError(
            f"{where}: device_plugin_mig_strategy={mig_strategy!r}; expected one of "
            f"{', '.join(MIG_STRATEGIES)}"
        )
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise K8sInputError(
            f"{where}: device_plugin_replicas={replicas!r}; expected a whole number of at "
            "least 1 (how many containers may share one GPU)"
        )
    if sharing == "none" and replicas != 1:
        raise K8sInputError(
            f"{where}: device_plugin_replicas={replicas} needs device_plugin_sharing "
            "time-slicing or mps (without sharing each GPU goes to one container)"
        )
    if sharing == "mps" and mig_strategy != "none":
        # The device plugin's README: MPS sharing is not supported with MIG.
        raise K8sInputError(
            f"{where}: device_plugin_sharing=mps cannot be combined with "
            f"device_plugin_mig_strategy={mig_strategy} (MPS does not share MIG devices)"
        )
    parts = [] if sharing == "none" else [f"{sharing}-{replicas}"]
    if mig_strategy != "none":
        parts.append(f"mig-{mig_strategy}")
    name = "-".join(parts) or "default"
    return {"name": name, "sharing": sharing, "replicas": replicas, "mig_strategy": mig_strategy}


def plugin_config_document(config):
    """The device plugin's own config file (version v1) for one configuration."""
    document = {"version": "v1", "flags": {"migStrategy": config["mig_strategy"]}}
    if config["sharing"] != "none":
        key = "timeSlicing" if config["sharing"] == "time-slicing" else "mps"
        document["sharing"] = {
            key: {"resources": [{"name": GPU_RESOURCE, "replicas": config["replicas"]}]}
        }
    return document


def plugin_config_text(config):
    """That config file as YAML (the ConfigMap entry and the host service's file alike)."""
    return _yaml(plugin_config_document(config))


# --- objects ----------------------------------------------------------------------


def _labels(settings, component):
    return {
        "app.kubernetes.io/name": component,
        "app.kubernetes.io/part-of": PART_OF,
        OWNER_LABEL: settings["managed_by"],
    }


def _meta(settings, name, component, namespaced=True):
    meta = {"name": name, "labels": _labels(settings, component)}
    if namespaced:
        meta["namespace"] = settings["namespace"]
    return meta


def _tolerations(settings):
    return [
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
        *settings.get("extra_tolerations", []),
    ]


def _pod_spec(settings, deploy_label, extra):
    spec = {
        "priorityClassName": settings["priority_class_name"],
        "nodeSelector": {"nvidia.com/gpu.present": "true", deploy_label: "true"},
        "tolerations": _tolerations(settings),
    }
    if settings.get("daemonset_runtime_class"):
        spec["runtimeClassName"] = settings["daemonset_runtime_class"]
    if settings.get("image_pull_secrets"):
        spec["imagePullSecrets"] = [{"name": s} for s in settings["image_pull_secrets"]]
    spec.update(extra)
    return spec


def _daemonset(settings, name, component, pod_spec):
    selector = {"app.kubernetes.io/name": component, "app.kubernetes.io/part-of": PART_OF}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(settings, name, component),
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": _labels(settings, component)},
                "spec": pod_spec,
            },
        },
    }


def _gpu_env():
    """Every GPU visible to the container, through the NVIDIA runtime (fresh dicts: a
    shared one would come out of the YAML dumper as an anchor and alias)."""
    return [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
    ]


def _node_name_env():
    return {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def _device_plugin_container(settings, name, command, fields):
    """A container of the device plugin image (which also carries config-manager and
    mps-control-daemon)."""
    return {
        "name": name,
        "image": settings["images"]["device_plugin"],
        "imagePullPolicy": settings["image_pull_policy"],
        "command": command,
        **fields,
    }


def _config_manager(settings, name, oneshot, signal_process):
    """The device plugin image's config-manager, as the init container or the sidecar."""
    env = {
        "ONESHOT": "true" if oneshot else "false",
        "KUBECONFIG": "",
        "NODE_LABEL": PLUGIN_CONFIG_LABEL,
        "CONFIG_FILE_SRCDIR": "/available-configs",
        "CONFIG_FILE_DST": "/config/config.yaml",
        "DEFAULT_CONFIG": "default",
        "FALLBACK_STRATEGIES": "named,single",
        "SEND_SIGNAL": "false" if oneshot else "true",
        "SIGNAL": "" if oneshot else "1",  # SIGHUP
        "PROCESS_TO_SIGNAL": "" if oneshot else signal_process,
    }
    return _device_plugin_container(
        settings,
        name,
        ["config-manager"],
        {
            "env": [
                _node_name_env(),
                *({"name": key, "value": value} for key, value in env.items()),
            ],
            "volumeMounts": [
                {"name": "available-configs", "mountPath": "/available-configs"},
                {"name": "config", "mountPath": "/config"},
            ],
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        },
    )


def _config_volumes(settings):
    return [
        {"name": "available-configs", "configMap": {"name": settings["plugin_configmap"]}},
        {"name": "config", "emptyDir": {}},
    ]


def device_plugin_objects(settings, configs):
    """ServiceAccount, RBAC, ConfigMap and DaemonSet(s) of the device plugin."""
    component = "nvidia-device-plugin"
    name = component
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(settings, name, component),
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta(settings, f"gpufleet-{name}", component, namespaced=False),
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _meta(settings, f"gpufleet-{name}", component, namespaced=False),
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": settings["namespace"]}],
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"gpufleet-{name}",
        },
    }
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(settings, settings["plugin_configmap"], component),
        "data": {
            config["name"]: plugin_config_text(config)
            for config in sorted(configs, key=lambda c: c["name"])
        },
    }
    mig = any(c["mig_strategy"] != "none" for c in configs)
    security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if mig:
        # Reading MIG devices needs CAP_SYS_ADMIN (the plugin's chart adds it likewise).
        security["capabilities"]["add"] = ["SYS_ADMIN"]
    plugin = _device_plugin_container(
        settings,
        "nvidia-device-plugin",
        ["nvidia-device-plugin"],
        {
            "env": [
                {"name": "CONFIG_FILE", "value": "/config/config.yaml"},
                {"name": "MPS_ROOT", "value": MPS_ROOT},
                {"name": "FAIL_ON_INIT_ERROR", "value": "true"},
                *_gpu_env(),
            ],
            "securityContext": security,
            "volumeMounts": [
                {"name": "device-plugins", "mountPath": DEVICE_PLUGIN_DIR},
                {"name": "mps-root", "mountPath": "/mps"},
                {"name": "mps-shm", "mountPath": "/dev/shm"},
                {"name": "cdi-root", "mountPath": "/var/run/cdi"},
                {"name": "available-configs", "mountPath": "/available-configs"},
                {"name": "config", "mountPath": "/config"},
            ],
        },
    )
    if settings.get("device_plugin_resources"):
        plugin["resources"] = settings["device_plugin_resources"]
    pod = _pod_spec(
        settings,
        "nvidia.com/gpu.deploy.device-plugin",
        {
            "serviceAccountName": name,
            "shareProcessNamespace": True,
            "initContainers": [_config_manager(settings, "config-manager-init", True, "")],
            "containers": [
                plugin,
                _config_manager(settings, "config-manager", False, "nvidia-device-plugin"),
            ],
            "volumes": [
                {
                    "name": "device-plugins",
                    "hostPath": {"path": DEVICE_PLUGIN_DIR, "type": "Directory"},
                },
                {"name": "mps-root", "hostPath": {"path": MPS_ROOT, "type": "DirectoryOrCreate"}},
                {"name": "mps-shm", "hostPath": {"path": f"{MPS_ROOT}/shm"}},
                {
                    "name": "cdi-root",
                    "hostPath": {"path": "/var/run/cdi", "type": "DirectoryOrCreate"},
                },
                *_config_volumes(settings),
            ],
        },
    )
    objects = [account, role, binding, configmap, _daemonset(settings, name, component, pod)]
    if any(c["sharing"] == "mps" for c in configs):
        objects.append(_mps_daemonset(settings, name))
    return objects


def _mps_daemonset(settings, account):
    """The MPS control daemon, on nodes whose configuration shares GPUs through MPS."""
    component = "nvidia-device-plugin-mps-control-daemon"
    daemon = _device_plugin_container(
        settings,
        "mps-control-daemon",
        ["mps-control-daemon"],
        {
            "env": [
                _node_name_env(),
                {"name": "CONFIG_FILE", "value": "/config/config.yaml"},
                *_gpu_env(),
            ],
            # The control daemon puts every GPU it serves in EXCLUSIVE_PROCESS compute
            # mode (nvidia-smi -c), which the driver allows only with CAP_SYS_ADMIN,
            # and starts nvidia-cuda-mps-control; the GPUs come from the NVIDIA
            # runtime (NVIDIA_VISIBLE_DEVICES), not from a privileged container.
            "securityContext": {
                "privileged": False,
                "allowPrivilegeEscalation": False,
                "capabilities": {"add": ["SYS_ADMIN"]},
            },
            "volumeMounts": [
                {"name": "mps-root", "mountPath": "/mps"},
                {"name": "mps-shm", "mountPath": "/dev/shm"},
                {"name": "available-configs", "mountPath": "/available-configs"},
                {"name": "config", "mountPath": "/config"},
            ],
        },
    )
    pod = _pod_spec(
        settings,
        "nvidia.com/gpu.deploy.device-plugin",
        {
            "serviceAccountName": account,
            "shareProcessNamespace": True,
            "hostPID": True,
            "initContainers": [_config_manager(settings, "config-manager-init", True, "")],
            "containers": [
                daemon,
                _config_manager(settings, "config-manager", False, "/usr/bin/mps-control-daemon"),
            ],
            "volumes": [
                {"name": "mps-root", "hostPath": {"path": MPS_ROOT, "type": "DirectoryOrCreate"}},
                # The tmpfs the device_plugin role mounts on the node (upstream's
                # chart mounts it from a privileged init container): without it the
                # pod does not start, rather than share memory through /run.
                {"name": "mps-shm", "hostPath": {"path": f"{MPS_ROOT}/shm", "type": "Directory"}},
                *_config_volumes(settings),
            ],
        },
    )
    pod["nodeSelector"]["nvidia.com/mps.capable"] = "true"
    return _daemonset(settings, component, component, pod)


def profiling_fields(collectors):
    """The DCGM profiling fields (DCP, DCGM_FI_PROF_*) a collectors CSV names."""
    names = (line.split(",")[0].strip() for line in collectors.splitlines())
    return [name for name in names if name.startswith("DCGM_FI_PROF_")]


def exporter_objects(settings, service_monitor):
    """dcgm-exporter: DaemonSet and Service (+ ConfigMap of collectors, ServiceMonitor)."""
    component = "nvidia-dcgm-exporter"
    port = settings["exporter_port"]
    args = []
    objects = []
    mounts = [{"name": "pod-resources", "mountPath": POD_RESOURCES_DIR, "readOnly": True}]
    volumes = [{"name": "pod-resources", "hostPath": {"path": POD_RESOURCES_DIR}}]
    if settings.get("exporter_collectors"):
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _meta(settings, f"{component}-collectors", component),
                "data": {"collectors.csv": settings["exporter_collectors"]},
            }
        )
        args = ["-f", "/etc/dcgm-exporter/gpufleet/collectors.csv"]
        mounts.append({"name": "collectors", "mountPath": "/etc/dcgm-exporter/gpufleet"})
        volumes.append({"name": "collectors", "configMap": {"name": f"{component}-collectors"}})
    container = {
        "name": "dcgm-exporter",
        "image": settings["images"]["dcgm_exporter"],
        "imagePullPolicy": settings["image_pull_policy"],
        "env": [
            {"name": "DCGM_EXPORTER_LISTEN", "value": f":{port}"},
            {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
            *_gpu_env(),
        ],
        "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            # DCGM's profiling fields (DCGM_FI_PROF_*) need CAP_SYS_ADMIN; nothing else
            # the exporter reads does, so it is added only for collectors naming them.
            **(
                {"capabilities": {"add": ["SYS_ADMIN"]}}
                if profiling_fields(settings.get("exporter_collectors") or "")
                else {}
            ),
        },
        "readinessProbe": {"httpGet": {"path": "/health", "port": port}},
        "volumeMounts": mounts,
    }
    if args:
        container["args"] = args
    pod = _pod_spec(
        settings,
        "nvidia.com/gpu.deploy.dcgm-exporter",
        {"automountServiceAccountToken": False, "containers": [container], "volumes": volumes},
    )
    selector = {"app.kubernetes.io/name": component, "app.kubernetes.io/part-of": PART_OF}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(settings, component, component),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "metrics", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }
    objects += [_daemonset(settings, component, component, pod), service]
    if service_monitor:
        objects.append(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "ServiceMonitor",
                "metadata": _meta(settings, component, component),
                "spec": {
                    "selector": {"matchLabels": selector},
                    "namespaceSelector": {"matchNames": [settings["namespace"]]},
                    "endpoints": [
                        {
                            "port": "metrics",
                            "path": "/metrics",
                            "interval": settings["exporter_scrape_interval"],
                        }
                    ],
                },
            }
        )
    return objects


def runtime_class(settings):
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": _meta(
            settings, settings["runtime_class_name"], "nvidia-runtime-class", namespaced=False
        ),
        "handler": settings["runtime_class_handler"],
    }


def namespace(settings):
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": _meta(settings, settings["namespace"], "gpufleet", namespaced=False),
    }


def node_object(name, labels):
    """The part of a Node gpufleet owns: its labels (applied server-side)."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def plain(value):
    """Ansible's own str/dict/list subclasses (tagged values) as plain Python types."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    return value


def _yaml(data):
    return yaml.safe_dump(plain(data), default_flow_style=False, sort_keys=False)

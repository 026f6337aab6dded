# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The forms of the roles' settings that argument specs cannot say.

A role's ``meta/argument_specs.yml`` keeps what a spec can express: types, choices,
element types. What it cannot (ranges, URL schemes, absolute paths, package version
shapes, names Kubernetes accepts, settings that depend on each other) is here, in one
table, so that the settings check before any stage (action ``settings_check``) and
each role on its own refuse the same values with the same words.

``check(options, values)`` judges the settings of one host for one role (its argument
spec's options; the host's values, spec defaults filled in) and returns one sentence per
bad setting, each naming the variable, the form expected and the value found:

1. the kind, as written (``kind_problem``): a role is given the value as the host has
   it, not Ansible's conversion of it - for a ``str`` 42 stays a number (``| length``
   fails on it), for a ``bool`` "false" stays a string (ansible-core refuses it as a
   condition), for an ``int`` "9400" stays a string, for a ``list`` "a,b" stays a string;
2. the argument spec (choices, elements), as Ansible does when the role starts;
3. the forms of ``RULES`` and the settings that go together (``problems``).

``coverage(name, option)`` says which of these judges a variable; a unit test holds
every role's argument spec to it, so that no variable is left to a role to refuse
after earlier stages have run.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpufleet.nvidia.plugins.module_utils import monitoring, secureboot
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_plan import (
    BRANCH_RE,
    VERSION_RE,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.k8s_objects import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    DURATION,
    IMAGE,
    LABEL_VALUE,
    K8sInputError,
    check_label,
    plugin_config,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_config import (
    MigConfigError,
    layout_strategy,
    parse_config,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.openpgp import normalise

_REGISTRY = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$")
# Debian's package names and versions (deb-version: [epoch:]upstream[-revision]).
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
# A kernel release as `uname -r` prints it: 6.1.0-41-amd64, 6.8.0-49-generic,
# 5.14.0-427.13.1.el9_4.x86_64 (also the tail of its package's name).
_KERNEL_RELEASE = re.compile(r"^[0-9]+\.[0-9]+[0-9A-Za-z.+_~-]*$")
_DEB_VERSION = re.compile(r"^([0-9]+:)?[0-9][A-Za-z0-9.+~]*(-[A-Za-z0-9.+~]+)?$")
_TOOLKIT_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(~rc\.[0-9]+)?(-[0-9]+)?$")
# A systemd unit name (the .service suffix may be left out).
_UNIT = re.compile(r"^[A-Za-z0-9:_.@-]+$")
_RUNTIME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_CHECKSUM = re.compile(r"^(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$")
_MIG_CONFIG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HOST_PORT = re.compile(r"^[^\s:/]+:[0-9]{1,5}$")
# A GRES type as gres.conf and slurm.conf take it (gpu:<type>:<count>).
_SLURM_TYPE = re.compile(r"^[A-Za-z0-9_.-]+$")

RUNTIMES = ("containerd", "docker", "crio")
TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _url(value, schemes=("http", "https", "file")):
    if not isinstance(value, str) or re.search(r"[\s\"'`;$\\<>|]", value):
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return False
    if parts.scheme not in schemes:
        return False
    if parts.scheme == "file":
        return parts.path.startswith("/")
    return bool(parts.hostname)


def _absolute(value, suffixes=()):
    return (
        isinstance(value, str)
        and value.startswith("/")
        and not re.search(r"[\s\"'`;$\\]", value)
        and (not suffixes or value.endswith(suffixes))
    )


def _passes(check, *args):
    """Whether a check of module_utils that raises on a bad value passes."""
    try:
        check(*args, "")
    except ValueError:
        return False
    return True


def _labels_ok(value):
    return isinstance(value, Mapping) and all(
        _passes(check_label, str(key), label) for key, label in value.items()
    )


def _optional(check):
    return lambda value: value in ("", None) or check(value)


def _int_range(low, high):
    return lambda value: (
        isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    )


def _match(pattern, max_length=None):
    return lambda value: (
        isinstance(value, str)
        and bool(pattern.match(value))
        and (max_length is None or len(value) <= max_length)
    )


def _each(check):
    return lambda values: all(check(value) for value in values)


_URL = (_url, "an http(s):// or file:/// URL with a host and no spaces or shell characters")
_LABELS = (
    _labels_ok,
    "Kubernetes labels: keys of [prefix/]name, values of at most 63 letters, digits, -, _ "
    "or . (quote numbers and booleans)",
)
_PATH = (_absolute, "an absolute path without spaces, quotes or shell characters")
_OPTIONAL_PATH = (_optional(_absolute), "an absolute path, or empty")
_PORT = (_int_range(1, 65535), "a TCP port, 1-65535")
_UNIT_NAMES = (_each(_match(_UNIT)), "systemd unit names")
# The value of an apt_preferences(5) "Pin:" line.
_SELECTOR = (
    _optional(
        _match(
            re.compile(
                r"^(release [A-Za-z]=[^\s,\"']+(,\s*[A-Za-z]=[^\s,\"']+)*"
                r"|origin \"?[A-Za-z0-9.-]*\"?|version [A-Za-z0-9.+~:*-]+)$"
            )
        )
    ),
    'an apt_preferences "Pin:" value such as "origin developer.download.nvidia.com" or '
    '"release l=CUDA" (or empty)',
)
_OPTIONAL_CHECKSUM = (
    _optional(_match(_CHECKSUM)),
    "sha256:<64 hex digits> or sha512:<128 hex digits> (or empty)",
)
_OPTIONAL_PACKAGE_VERSION = (
    _optional(_match(_DEB_VERSION)),
    'a Debian package version such as "3.3.9" or "1:3.3.9-1" (or empty: the newest)',
)
_SUBDOMAIN = (_match(DNS_SUBDOMAIN, 253), "a Kubernetes object name (lower-case a-z, 0-9, - and .)")
_DNS_NAME = (_match(DNS_LABEL), "a Kubernetes name (a DNS label: a-z, 0-9 and -, at most 63)")
_TIMEOUT = (_int_range(1, 86400), "a whole number of seconds from 1 to 86400")
_LOCK_TIMEOUT = (_int_range(0, 3600), "a whole number of seconds from 0 to 3600")
# A refresh of apt's lists is stopped past this (it is an async task's time limit).
_UPDATE_TIMEOUT = (_int_range(30, 3600), "a whole number of seconds from 30 to 3600")
# OpenPGP primary-key fingerprints: 40 hex digits (version 4 keys) or 64 (version 6),
# spaced in groups as people copy them or not.
_FINGERPRINT = re.compile(r"^([0-9A-F]{40}|[0-9A-F]{64})$")


def _pem(label):
    """A check of an optional PEM block whose label ends with `label`; it says what is
    wrong without repeating the value (a key must not reach a log)."""

    def check(value):
        if value == "":
            return ""
        if not re.search(
            rf"-----BEGIN [A-Z ]*{label}-----.+-----END [A-Z ]*{label}-----", value, re.S
        ):
            return f"the value ({len(value)} characters) holds no {label} block"
        if label == "CERTIFICATE" and secureboot.pem_fingerprint(value) is None:
            return f"the {label} block of the value ({len(value)} characters) is not base64"
        return ""

    return check


def _fingerprints(values):
    return bool(values) and all(
        isinstance(value, str) and _FINGERPRINT.match(normalise(value)) for value in values
    )


_KEY_FINGERPRINTS = (
    _fingerprints,
    "a non-empty list of OpenPGP key fingerprints (40 or 64 hex digits, spaces allowed)",
)

# dcgm-exporter's collectors CSV, as it reads it (internal/pkg/counters/counter_config.go):
# a line that begins with # is a comment and an empty one is skipped; every other line is
# exactly three fields, a DCGM field name, a Prometheus metric type and a help text.
PROM_TYPES = ("gauge", "counter", "histogram", "summary", "label")
_FIELD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _collectors_problem(text):
    """'' for a collectors CSV dcgm-exporter takes (or empty: its defaults), else what is
    wrong with it, naming the line."""
    if text == "":
        return ""
    fields_named = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        fields = [field.strip(" ") for field in next(csv.reader([line]), [])]
        where = f"line {number} ({line.strip()!r})"
        if len(fields) != 3:
            return f"{where} has {len(fields)} field(s), not 3"
        if not _FIELD_NAME.match(fields[0]):
            return f"{where} does not begin with a DCGM field name"
        if fields[1] not in PROM_TYPES:
            return f"{where} has the metric type {fields[1]!r}"
        fields_named += 1
    if not fields_named:
        return "it names no field (leave it empty for the package's default counters)"
    return ""


_COLLECTORS = (
    _collectors_problem,
    "the text of a dcgm-exporter collectors CSV, a line per field: <DCGM field>, "
    f"<{'|'.join(PROM_TYPES)}>, <help> (# begins a comment), or empty for the "
    "package's default counters",
)

# variable -> (check, expected form). A variable missing from a host's settings (its
# role not being checked) is not looked at.
RULES = {
    "driver_apt_lock_timeout": _LOCK_TIMEOUT,
    "driver_apt_update_timeout": _UPDATE_TIMEOUT,
    "driver_branch": (
        _optional(_match(BRANCH_RE)),
        'a three-digit driver branch such as "535" (or empty: the installed one, or the default)',
    ),
    "driver_version": (
        _optional(_match(VERSION_RE)),
        'an NVIDIA driver version such as "535.261.03" (or empty: the newest of the branch)',
    ),
    "driver_cuda_repo_base_url": _URL,
    "driver_cuda_repo_key_fingerprints": _KEY_FINGERPRINTS,
    "driver_cuda_repo_apt_selector": _SELECTOR,
    "driver_debian_mirror": _URL,
    "driver_debian_security_mirror": _URL,
    "driver_kernel_headers_packages": (_each(_match(_PACKAGE)), "Debian package names"),
    "driver_kernel_release": (
        _optional(_match(_KERNEL_RELEASE, 100)),
        'a kernel release as uname -r prints it, such as "6.1.0-41-amd64" (or empty: the'
        " kernels installed stay)",
    ),
    "driver_secure_boot_signing_key": (
        _pem("PRIVATE KEY"),
        "a private key in PEM form (-----BEGIN PRIVATE KEY-----), or empty",
    ),
    "driver_secure_boot_signing_certificate": (
        _pem("CERTIFICATE"),
        "a certificate in PEM form (-----BEGIN CERTIFICATE-----), or empty",
    ),
    "driver_reboot_timeout": _TIMEOUT,
    "driver_reboot_boot_time_command": (
        lambda value: isinstance(value, str) and value.strip() != "",
        "a shell command that prints the boot time",
    ),
    "driver_gpu_consumers": _UNIT_NAMES,
    "driver_sysfs_root": _PATH,
    "driver_validations_dir": _PATH,
    "mig_apt_lock_timeout": _LOCK_TIMEOUT,
    "mig_config": (_optional(_match(_MIG_CONFIG)), "a layout name of the MIG file (or empty)"),
    "mig_config_file": _OPTIONAL_PATH,
    "mig_manager_package": (_match(_PACKAGE), "a Debian package name"),
    "mig_manager_version": (
        _match(re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")),
        'a mig-parted release such as "0.10.0"',
    ),
    "mig_manager_release_url": _URL,
    "mig_manager_package_checksum": _OPTIONAL_CHECKSUM,
    "mig_gpu_consumers": _UNIT_NAMES,
    "toolkit_apt_lock_timeout": _LOCK_TIMEOUT,
    "toolkit_apt_update_timeout": _UPDATE_TIMEOUT,
    "toolkit_version": (
        _optional(_match(_TOOLKIT_VERSION)),
        'a toolkit version such as "1.17.8" or "1.17.8-1" (or empty: the newest)',
    ),
    "toolkit_repo_base_url": _URL,
    "toolkit_repo_key_fingerprints": _KEY_FINGERPRINTS,
    "toolkit_cdi_spec_path": (
        lambda value: _absolute(value, (".yaml", ".json")),
        "an absolute path ending in .yaml or .json",
    ),
    "runtime_config_apt_lock_timeout": _LOCK_TIMEOUT,
    "runtime_config_apt_update_timeout": _UPDATE_TIMEOUT,
    "runtime_config_runtime_name": (
        _match(_RUNTIME_NAME, 63),
        "letters, digits, - or _ (it becomes a TOML key and a RuntimeClass handler)",
    ),
    "runtime_config_runtime_path": _PATH,
    "runtime_config_config_paths": (
        lambda value: set(value) <= set(RUNTIMES) and _each(_absolute)(value.values()),
        f"keys among {', '.join(RUNTIMES)} and absolute paths as values",
    ),
    "runtime_config_services": (
        lambda value: set(value) <= set(RUNTIMES) and _each(_match(_UNIT))(value.values()),
        f"keys among {', '.join(RUNTIMES)} and systemd unit names as values",
    ),
    "runtime_config_containerd_drop_in_path": (
        _optional(lambda value: _absolute(value, (".toml",))),
        "an absolute path ending in .toml (or empty)",
    ),
    "runtime_config_containerd_template_base": _OPTIONAL_PATH,
    "validator_validations_dir": _PATH,
    "validator_runtime_path": _PATH,
    "validator_cuda_sample": (
        _optional(lambda value: _absolute(value) or IMAGE.match(value) is not None),
        "the absolute path of a CUDA sample on the node, an image reference, or empty",
    ),
    "device_plugin_kubelet_dir": _PATH,
    "device_plugin_validations_dir": _PATH,
    "device_plugin_host_config_dir": _PATH,
    "device_plugin_host_binary_url": (_optional(_url), _URL[1] + " (or empty)"),
    "device_plugin_host_binary_checksum": _OPTIONAL_CHECKSUM,
    "exporter_apt_lock_timeout": _LOCK_TIMEOUT,
    "exporter_apt_update_timeout": _UPDATE_TIMEOUT,
    "exporter_repo_base_url": _URL,
    "exporter_repo_key_fingerprints": _KEY_FINGERPRINTS,
    "exporter_repo_apt_selector": _SELECTOR,
    "exporter_dcgm_package": (_match(_PACKAGE), "a Debian package name"),
    "exporter_package": (_match(_PACKAGE), "a Debian package name"),
    "exporter_version": _OPTIONAL_PACKAGE_VERSION,
    "exporter_listen_address": (
        _optional(_match(re.compile(r"^[0-9A-Za-z.:\[\]-]+$"))),
        "an IP address or host name to listen on (or empty: every address)",
    ),
    "exporter_port": _PORT,
    "exporter_hostengine_address": (_match(_HOST_PORT), "host:port of DCGM's host engine"),
    "exporter_collectors": _COLLECTORS,
    "slurm_gres_conf_path": _PATH,
    "slurm_gres_node_line_path": _PATH,
    "slurm_gres_types": (
        lambda value: all(
            isinstance(k, str) and k.strip() and isinstance(v, str) and _SLURM_TYPE.match(v)
            for k, v in value.items()
        ),
        "GPU model names (as NVML reports them) mapped to GRES types of letters, digits, "
        "_, - and . (no spaces, colons or commas)",
    ),
    "slurm_gres_service": (_match(_UNIT), "a systemd unit name"),
    "slurm_gres_verify_timeout": _TIMEOUT,
    "k8s_manifests_render_dir": _OPTIONAL_PATH,
    "k8s_manifests_kubeconfig": (
        _optional(lambda value: _absolute(value) or (_absolute(value[1:]) and value[0] == "~")),
        "the absolute path of a kubeconfig file, or empty",
    ),
    "k8s_manifests_namespace": (
        _match(DNS_LABEL, 63),
        "a Kubernetes namespace name (a DNS label: a-z, 0-9 and -, at most 63)",
    ),
    "k8s_manifests_field_manager": (
        lambda value: bool(value) and _match(LABEL_VALUE)(value),
        "a name that is also a label value (it marks our objects as managed by it): at most 63 "
        "letters, digits, -, _ or .",
    ),
    "k8s_manifests_wait_timeout": _TIMEOUT,
    "k8s_manifests_node_names": (
        lambda value: _each(_match(DNS_SUBDOMAIN, 253))(value.values()),
        "inventory host names mapped to Kubernetes node names",
    ),
    "k8s_manifests_device_plugin_configmap": _DNS_NAME,
    "k8s_manifests_exporter_port": _PORT,
    "k8s_manifests_exporter_scrape_interval": (
        _match(DURATION),
        'a Prometheus duration such as "30s" or "1m30s"',
    ),
    "k8s_manifests_runtime_class_name": _DNS_NAME,
    "k8s_manifests_runtime_class_handler": (
        _match(DNS_LABEL, 63),
        "a RuntimeClass handler (a DNS label: a-z, 0-9 and -, at most 63)",
    ),
    "k8s_manifests_daemonset_runtime_class": (
        _optional(_DNS_NAME[0]),
        _DNS_NAME[1] + " (or empty)",
    ),
    "k8s_manifests_priority_class_name": (
        _optional(_match(DNS_SUBDOMAIN, 253)),
        _SUBDOMAIN[1] + " (or empty)",
    ),
    "k8s_manifests_registry": (_match(_REGISTRY), "a registry and path such as nvcr.io/nvidia"),
    "k8s_manifests_device_plugin_image": (
        _match(IMAGE),
        "an image reference such as registry/path:tag",
    ),
    "k8s_manifests_dcgm_exporter_image": (
        _match(IMAGE),
        "an image reference such as registry/path:tag",
    ),
    "k8s_manifests_image_pull_secrets": (_each(_DNS_NAME[0]), "Secret names (DNS labels)"),
    "k8s_manifests_exporter_collectors": _COLLECTORS,
    "k8s_manifests_alert_rules_labels": _LABELS,
    "k8s_manifests_dashboard_labels": _LABELS,
    "k8s_manifests_runbook_url": (
        _optional(lambda value: _url(value, ("http", "https")) and "#" not in value),
        "an http(s):// URL where docs/monitoring.md is served, without a #fragment (or empty)",
    ),
    "k8s_manifests_monitoring_namespace": (
        _optional(_match(DNS_LABEL, 63)),
        "a Kubernetes namespace name (a DNS label: a-z, 0-9 and -, at most 63), or empty",
    ),
    "k8s_manifests_exporter_job": (
        lambda value: _passes(monitoring.check_exporter_job, value),
        "a regular expression of the exporters' scrape job name, without quotes or "
        "backslashes, such as 'gpu-metrics'",
    ),
}

# Settings with a check of their own below, beyond their kind: with other settings, or
# against the inventory.
OWN_CHECKS = {
    "device_plugin_replicas": "with device_plugin_sharing and device_plugin_mig_strategy",
    "k8s_manifests_tolerations": "field by field, as a Pod spec takes a toleration",
    "k8s_manifests_hosts": "each one a host gpufleet manages (of gpufleet_hosts)",
}

# Settings with no form to check beyond their kind: any string is taken as is. Keep this
# short; every entry says why nothing before the run can judge it.
FREE_FORM = {
    "k8s_manifests_context": (
        "a context the kubeconfig names: which kubeconfig (k8s_manifests_kubeconfig, "
        "$KUBECONFIG's merged files, ~/.kube/config, in-cluster) is the Kubernetes "
        "client's to resolve when the cluster side connects; judging it here would "
        "mean resolving it differently"
    ),
}


def _toleration_problem(toleration):
    """What is wrong with one toleration of a Pod spec, or ''."""
    unknown = sorted(set(toleration) - set(TOLERATION_KEYS))
    if unknown:
        return f"unknown field {', '.join(unknown)} (fields: {', '.join(TOLERATION_KEYS)})"
    operator = toleration.get("operator", "Equal")
    if operator not in ("Exists", "Equal"):
        return f"operator must be Exists or Equal, got {operator!r}"
    key, value = toleration.get("key", ""), toleration.get("value", "")
    if not key and operator != "Exists":
        return "an empty key goes with operator Exists only"
    if operator == "Exists" and value:
        return "operator Exists takes no value"
    if key:
        try:
            check_label(str(key), str(value), "key and value")
        except K8sInputError as exc:
            return str(exc)
    effect = toleration.get("effect", "")
    if effect and effect not in TAINT_EFFECTS:
        return f"effect must be one of {', '.join(TAINT_EFFECTS)} or empty, got {effect!r}"
    seconds = toleration.get("tolerationSeconds")
    if seconds is not None and (effect != "NoExecute" or not isinstance(seconds, int)):
        return "tolerationSeconds is a whole number, and goes with effect NoExecute only"
    return ""


def _driver_problems(values):
    """A driver_version of another branch than driver_branch (each well-formed); a
    module-signing key without its certificate, or the other way round; a kernel named
    while kernel updates are not held."""
    return _branch_problems(values) + _signing_problems(values) + _release_problems(values)


def _release_problems(values):
    release = values.get("driver_kernel_release")
    updates = values.get("driver_kernel_updates", "guarded")
    if not (isinstance(release, str) and release) or updates == "held":
        return []
    return [
        f"driver_kernel_release: {release!r} needs driver_kernel_updates: held (a kernel"
        " named while updates come from the distribution would be left behind by the next"
        f" one); got driver_kernel_updates {updates!r}."
    ]


def _branch_problems(values):
    branch, version = values.get("driver_branch"), values.get("driver_version")
    if not (isinstance(branch, str) and BRANCH_RE.match(branch)):
        return []
    if not (isinstance(version, str) and VERSION_RE.match(version)):
        return []
    if version.split(".")[0] == branch:
        return []
    return [
        f"driver_version: {version!r} is not of driver_branch {branch}; expected a "
        f"{branch}.x.y version (or empty: the newest of the branch), or set driver_branch "
        f"{version.split('.')[0]!r} with it."
    ]


def _signing_problems(values):
    names = ("driver_secure_boot_signing_key", "driver_secure_boot_signing_certificate")
    given = [name for name in names if isinstance(values.get(name), str) and values[name]]
    if len(given) != 1 or any(not isinstance(values.get(name), str) for name in names):
        return []
    [missing] = [name for name in names if name not in given]
    return [f"{missing}: expected it with {given[0]} (DKMS signs with both), got nothing."]


def _mig_layout(values, role_dir):
    """The layout mig_config names, from the file the MIG stage reads it from, and the
    problems found reading it: (entries or None, problems).

    The file is read where the stage reads it, on the controller: mig_config_file, else
    the role's own files/mig-parted-config.yaml. Whether the layout fits a node's GPUs
    is for after discovery (playbooks/facts.yml)."""
    name = values.get("mig_config")
    path = values.get("mig_config_file")
    if not name or not _match(_MIG_CONFIG)(name) or not _OPTIONAL_PATH[0](path):
        return None, []
    if not path:
        if role_dir is None:
            return None, []
        path = os.path.join(role_dir, "files", "mig-parted-config.yaml")
    try:
        with open(path, encoding="utf-8") as handle:
            layouts = parse_config(yaml.safe_load(handle))
    except OSError as exc:
        return None, [f"mig_config_file: expected a readable file, got {path!r} ({exc.strerror})."]
    except (yaml.YAMLError, MigConfigError) as exc:
        detail = " ".join(str(exc).split())
        problem = f"mig_config_file: expected a mig-parted config file, got {path!r}: {detail}."
        return None, [problem]
    if name in layouts:
        return layouts[name], []
    return None, [
        f"mig_config: expected the name of a layout in {path} (or empty: MIG left alone), "
        f"got {name!r}: no layout named {name!r}; the file has: {', '.join(sorted(layouts))}."
    ]


def _mig_problems(values, role_dir):
    return _mig_layout(values, role_dir)[1]


def together(values, mig_role_dir=None):
    """Settings of different stages that are only wrong together: the MIG layout the mig
    stage makes and the strategy the device plugin advertises MIG devices with. `auto`
    (the default) follows the layout; a strategy set by hand must fit it (mixed fits
    any)."""
    entries, _ = _mig_layout(values, mig_role_dir)
    strategy = values.get("device_plugin_mig_strategy", "auto")
    if entries is None or values.get("device_plugin_mode") == "none":
        return []
    name, wanted = values["mig_config"], layout_strategy(entries)
    if strategy == "auto":
        if wanted != "none" and values.get("device_plugin_sharing") == "mps":
            return [
                f"device_plugin_sharing: mps cannot share MIG devices, and mig_config {name!r} "
                "enables MIG; expected none or time-slicing there."
            ]
        return []
    if strategy in (wanted, "mixed"):  # mixed advertises MIG devices and whole GPUs alike
        return []
    if wanted == "none":
        why = "which disables MIG"
    elif strategy == "none":
        why = "which enables MIG: with none the device plugin would advertise no usable GPU"
    else:
        profiles = sorted({p for entry in entries for p in entry.mig_devices})
        why = f"whose GPUs are not all of one profile ({', '.join(profiles) or 'MIG off on some'})"
    expected = "mixed" if wanted == "mixed" else f"{wanted} or mixed"
    return [
        f"device_plugin_mig_strategy: expected {expected} (or auto, which follows the layout) "
        f"with mig_config {name!r}, {why}; got {strategy!r}."
    ]


def _dependent_problems(values, role_dir=None, managed_hosts=None):
    """Settings that are only wrong together, or with what they name."""
    found = []
    if values.get("device_plugin_mode") == "host":
        if not values.get("device_plugin_host_binary_url"):
            found.append(
                "device_plugin_host_binary_url: device_plugin_mode is host, so it must be the "
                "http(s) or file URL of the nvidia-device-plugin binary; it is empty."
            )
        if not values.get("device_plugin_host_binary_checksum"):
            found.append(
                "device_plugin_host_binary_checksum: device_plugin_mode is host, so the binary "
                "must be pinned by its checksum (sha256:<64 hex digits>); it is empty."
            )
    if "device_plugin_sharing" in values:
        try:
            plugin_config(
                values["device_plugin_sharing"],
                values.get("device_plugin_replicas", 1),
                # auto follows the node's MIG layout: checked with it (together()).
                _concrete(values.get("device_plugin_mig_strategy", "auto")),
                where="device plugin",
            )
        except K8sInputError as exc:
            found.append(str(exc).replace("device plugin: ", "", 1) + ".")
    if values.get("slurm_gres_autodetect") and values.get("slurm_gres_types"):
        found.append(
            "slurm_gres_types: expected empty with slurm_gres_autodetect "
            f"{values['slurm_gres_autodetect']!r}: Slurm's AutoDetect names the types itself "
            "(lower case, spaces as underscores); got "
            f"{sorted(values['slurm_gres_types'])!r}."
        )
    for index, toleration in enumerate(values.get("k8s_manifests_tolerations") or []):
        problem = (
            _toleration_problem(toleration) if isinstance(toleration, dict) else "not a mapping"
        )
        if problem:
            found.append(f"k8s_manifests_tolerations[{index}]: {problem}.")
    if managed_hosts is not None:
        unknown = [h for h in values.get("k8s_manifests_hosts") or [] if h not in managed_hosts]
        if unknown:
            found.append(
                "k8s_manifests_hosts: expected hosts gpufleet manages (of gpufleet_hosts, "
                "default the group gpu_nodes; or empty: all of them), got "
                f"{', '.join(map(repr, unknown))}, which are not among them."
            )
    return found + _driver_problems(values) + _mig_problems(values, role_dir)


def _concrete(strategy):
    return "none" if strategy == "auto" else strategy


def problems(values, role_dir=None, managed_hosts=None):
    """One sentence per setting in `values` that has the wrong form.

    `role_dir` is the role's directory (for files it ships, such as the MIG layouts),
    `managed_hosts` the names of the hosts gpufleet manages; without them what they would judge is
    not looked at."""
    found = []
    for name, value in values.items():
        rule = RULES.get(name)
        if rule is None:
            continue
        check, expected = rule
        try:
            verdict = check(value)
        except (AttributeError, TypeError, ValueError):
            verdict = False
        if isinstance(verdict, str):
            # A check that says what is wrong, where the whole value is too long to repeat.
            if verdict:
                found.append(f"{name}: expected {expected}; {verdict}.")
        elif not verdict:
            found.append(f"{name}: expected {expected}, got {value!r}.")
    return found + _dependent_problems(values, role_dir, managed_hosts)


# --- kinds: the value as written, which is what a role is given -------------------------

# Argument spec type -> (the values a role can take for it as they are, the form).
_KINDS = {
    "str": (lambda value: isinstance(value, str), "a string"),
    "path": (lambda value: isinstance(value, str), "a path"),
    "int": (lambda value: isinstance(value, int) and not isinstance(value, bool), "a whole number"),
    "bool": (lambda value: isinstance(value, bool), "true or false"),
    "list": (lambda value: isinstance(value, (list, tuple)), "a list"),
    "dict": (lambda value: isinstance(value, Mapping), "a mapping"),
}
_PLURAL = {"str": "strings", "path": "paths", "int": "whole numbers", "dict": "mappings"}


def _kind_of(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _plain(value):
    """The value without the types ansible-core tags templated data with, for messages."""
    if isinstance(value, bool) or value is None:
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _form(option):
    wanted = option.get("type", "str")
    form = _KINDS[wanted][1] if wanted in _KINDS else f"a {wanted}"
    elements = option.get("elements")
    if wanted == "list" and elements in _PLURAL:
        form = f"a list of {_PLURAL[elements]}"
    if option.get("choices"):
        choices = ", ".join(str(choice) for choice in option["choices"])
        form += f", each one of: {choices}" if wanted == "list" else f", one of: {choices}"
    return form


def _hint(name, wanted, value):
    """How to write `value` as the kind wanted, where the mistake is a common one."""
    if wanted in ("str", "path") and value is None:
        return '; write "" for empty'
    if wanted in ("str", "path") and isinstance(value, (bool, int, float)):
        return f'; quote it: "{value}"'
    if isinstance(value, str) and wanted in ("int", "bool", "list", "dict"):
        typed = "..."
        if wanted == "int" and value.strip().isdigit():
            typed = str(int(value))
        elif wanted == "bool" and value.strip().lower() in _BOOL_WORDS:
            typed = _BOOL_WORDS[value.strip().lower()]
        return (
            f"; -e {name}=... gives a string: give it as JSON, -e '{{\"{name}\": {typed}}}', "
            "or in the inventory"
        )
    return ""


_BOOL_WORDS = {
    **dict.fromkeys(("true", "yes", "on", "1"), "true"),
    **dict.fromkeys(("false", "no", "off", "0"), "false"),
}


def kind_problem(name, option, value):
    """'' when `value` is of the kind `option` (an argument spec option) takes as written,
    else a sentence naming the variable, the form expected and the kind found."""
    wanted = option.get("type", "str")
    if wanted not in _KINDS:
        return ""
    accepts, kind = _KINDS[wanted]
    if not accepts(value):
        expected = RULES[name][1] if name in RULES else _form(option)
        return (
            f"{name}: expected {expected}, got {_plain(value)!r} "
            f"({_kind_of(value)}, not {kind}{_hint(name, wanted, value)})."
        )
    elements = option.get("elements")
    if wanted == "list" and elements in _KINDS:
        item_accepts, item_kind = _KINDS[elements]
        for index, item in enumerate(value):
            if not item_accepts(item):
                return (
                    f"{name}[{index}]: expected {item_kind}, got {_plain(item)!r} "
                    f"({_kind_of(item)}{_hint(name, elements, item)})."
                )
    return ""


def check(options, values, role_dir=None, managed_hosts=None):
    """Every problem with one host's settings of one role: `options` its argument spec's,
    `values` the host's (defaults filled in; a variable missing is not looked at).

    One sentence per bad setting: the kind first (a value of the wrong kind is named
    once and not judged further), then the spec's choices and elements as Ansible
    checks them when the role starts, then RULES and the settings that go together."""
    found, well_typed = [], {}
    for name, value in values.items():
        option = options.get(name)
        if option is None:
            continue
        problem = kind_problem(name, option, value)
        if problem:
            found.append(problem)
            continue
        validated = ArgumentSpecValidator({name: option}).validate(
            {name: value}, validate_role_argument_spec=True
        )
        found.extend(validated.error_messages)
        if not validated.error_messages:
            well_typed[name] = validated.validated_parameters[name]
    return found + problems(well_typed, role_dir, managed_hosts)


def coverage(name, option):
    """What judges `name` (an option of a role's argument spec) before any change beyond
    its kind, or '' where nothing does (then a role would be left to refuse it late)."""
    if name in RULES:
        return f"its form: {RULES[name][1]}"
    if name in OWN_CHECKS:
        return f"a check of its own: {OWN_CHECKS[name]}"
    if option.get("choices"):
        return f"its choices: {', '.join(str(choice) for choice in option['choices'])}"
    if option.get("type") == "bool":
        return "its kind: true or false"
    if name in FREE_FORM:
        return f"nothing, any {_form(option)}: {FREE_FORM[name]}"
    return ""

# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Add (or remove) the NVIDIA runtime in a container runtime's own config file.

The semantics are those of `nvidia-ctk runtime configure` (NVIDIA Container Toolkit):
containerd gets a runtime entry of type io.containerd.runc.v2 whose options are
copied from the default runtime, with BinaryName pointing at
nvidia-container-runtime; Docker's daemon.json gets runtimes.<name>; CRI-O gets a
drop-in. Everything else in the file is kept: tomlkit keeps comments, order and
formatting of TOML; JSON keeps its key order. Functions here take and return text,
so they are tested without a node.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re

try:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    HAS_TOMLKIT = True
except ImportError:  # reported by the module with missing_required_lib
    tomlkit = None
    TOMLKitError = ValueError
    HAS_TOMLKIT = False

# containerd's CRI plugin per config version: no `version` key means 1. Version 3
# (containerd 2.0) split the CRI plugin; version 4 (containerd 2.3) moved only the
# server settings (containerd's RELEASES.md, "Daemon Configuration").
CRI_PLUGIN = {
    1: "cri",
    2: "io.containerd.grpc.v1.cri",
    3: "io.containerd.cri.v1.runtime",
    4: "io.containerd.cri.v1.runtime",
}
# From config version 3 (containerd 2.x), CDI is on unless the file turns it off:
# enable_cdi defaults to true there, was deprecated in 2.2 and is ignored from 2.4.
CDI_BY_DEFAULT_FROM = 3
RUNC_V2 = "io.containerd.runc.v2"
# containerd's own default runtime when the config names none.
CONTAINERD_DEFAULT_RUNTIME = "runc"


class ConfigError(ValueError):
    """The existing config cannot be edited safely; the message says why."""


def _parse_toml(text, path):
    try:
        return tomlkit.parse(text or "")
    except TOMLKitError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}); left unchanged") from exc


def _plain(value):
    """A tomlkit item as plain Python data."""
    return value.unwrap() if hasattr(value, "unwrap") else copy.deepcopy(value)


def same_toml(old_text, new_text):
    """Whether two TOML texts hold the same data (layout aside).

    tomlkit can re-indent tables it did not change when a document is edited and
    dumped again; a file whose data did not change is not rewritten for that.
    """
    return _plain(tomlkit.parse(old_text)) == _plain(tomlkit.parse(new_text))


def _table(parent, key):
    """parent[key] as a table, created (as a header-less super table) when missing."""
    if key not in parent:
        parent[key] = tomlkit.table(True)
    table = parent[key]
    if not hasattr(table, "keys"):
        raise ConfigError(f"{key} is {type(table).__name__}, a table was expected")
    return table


def containerd_version(doc, default):
    """The config's schema version: 1 without a `version` key (`default` for new files)."""
    if not doc.keys():
        return default
    version = doc.get("version", 1)
    if version not in CRI_PLUGIN:
        raise ConfigError(f"containerd config version {version} is not supported (1, 2, 3 or 4)")
    return int(version)


def _edit_cri(cri, version, runtime_name, runtime_path, set_as_default, enable_cdi, present):
    """Apply the wanted state to one CRI plugin table of a config of `version`."""
    if not present and runtime_name not in cri.get("containerd", {}).get("runtimes", {}):
        if cri.get("containerd", {}).get("default_runtime_name") == runtime_name:
            cri["containerd"]["default_runtime_name"] = CONTAINERD_DEFAULT_RUNTIME
        return
    containerd = _table(cri, "containerd")
    runtimes = _table(containerd, "runtimes")
    default_name = str(containerd.get("default_runtime_name", CONTAINERD_DEFAULT_RUNTIME))
    if not present:
        if runtime_name in runtimes:
            del runtimes[runtime_name]
        if default_name == runtime_name:
            containerd["default_runtime_name"] = CONTAINERD_DEFAULT_RUNTIME
        return
    # The runtime the NVIDIA one wraps: the default, unless the default is itself an
    # NVIDIA runtime (as nvidia-ctk decides), then runc.
    template_name = (
        default_name
        if not default_name.startswith("nvidia") and default_name != runtime_name
        else CONTAINERD_DEFAULT_RUNTIME
    )
    template = runtimes.get(template_name)
    if runtime_name not in runtimes:
        # A new entry starts as a copy of the wrapped runtime (runc or crun), so
        # options such as SystemdCgroup carry over.
        entry = tomlkit.table()
        entry["runtime_type"] = RUNC_V2
        for key, value in (_plain(template) if template is not None else {}).items():
            entry[key] = value
        runtimes[runtime_name] = entry
    entry = runtimes[runtime_name]
    if entry.get("runtime_type") != RUNC_V2:
        entry["runtime_type"] = RUNC_V2
    options = _table(entry, "options")
    if options.get("BinaryName") != runtime_path:
        options["BinaryName"] = runtime_path
    # The cgroup driver must be the wrapped runtime's (the kubelet's): an entry kept
    # from before follows it too. Its other options stay as the site set them.
    template_options = (template or {}).get("options", {})
    if "SystemdCgroup" in template_options and options.get("SystemdCgroup") != _plain(
        template_options["SystemdCgroup"]
    ):
        options["SystemdCgroup"] = _plain(template_options["SystemdCgroup"])
    if set_as_default and default_name != runtime_name:
        containerd["default_runtime_name"] = runtime_name
    elif not set_as_default and default_name == runtime_name:
        containerd["default_runtime_name"] = CONTAINERD_DEFAULT_RUNTIME
    # Where CDI is on by default, only a file that turns it off is told otherwise:
    # containerd 2.4 ignores the key, with a warning at every start.
    if enable_cdi and (
        cri.get("enable_cdi") is False
        or (version < CDI_BY_DEFAULT_FROM and cri.get("enable_cdi") is not True)
    ):
        cri["enable_cdi"] = True


def containerd_in_place(text, path, *, new_version=2, **wanted):
    """The containerd config `text` with the NVIDIA runtime applied in place."""
    doc = _parse_toml(text, path)
    version = containerd_version(doc, new_version)
    if not doc.keys():
        doc["version"] = version
    if not wanted["present"] and CRI_PLUGIN[version] not in doc.get("plugins", {}):
        return tomlkit.dumps(doc), version
    cri = _table(_table(doc, "plugins"), CRI_PLUGIN[version])
    _edit_cri(cri, version, **wanted)
    return tomlkit.dumps(doc), version


def _imports_cover(imports, drop_in_path):
    return any(fnmatch.fnmatch(drop_in_path, pattern) for pattern in imports)


def containerd_drop_in(main_text, main_path, drop_in_path, *, new_version=2, **wanted):
    """(main config, drop-in) texts for the drop-in layout; drop-in None when absent.

    The main config only gains an `imports` entry. containerd before 2.1 replaces
    (does not merge) a plugin's table imported from another file, so the drop-in
    carries the main config's whole CRI plugin table with the NVIDIA runtime added.
    """
    main = _parse_toml(main_text, main_path)
    version = containerd_version(main, new_version)
    if not main.keys():
        main["version"] = version
    if wanted["present"]:
        imports = main.get("imports")
        if imports is None:
            main["imports"] = [os.path.join(os.path.dirname(drop_in_path), "*.toml")]
        elif not _imports_cover([str(i) for i in imports], drop_in_path):
            imports.append(os.path.join(os.path.dirname(drop_in_path), "*.toml"))
    plugin = CRI_PLUGIN[version]
    cri_source = main.get("plugins", {}).get(plugin)
    drop_in = tomlkit.document()
    drop_in.add(
        tomlkit.comment(
            "Written by gpufleet (runtime_config). The CRI plugin table is copied from "
            f"{main_path}: containerd replaces, not merges, imported plugin tables."
        )
    )
    drop_in["version"] = version
    cri = _table(_table(drop_in, "plugins"), plugin)
    for key, value in (_plain(cri_source) if cri_source is not None else {}).items():
        cri[key] = value
    _edit_cri(cri, version, **wanted)
    return tomlkit.dumps(main), (tomlkit.dumps(drop_in) if wanted["present"] else None), version


def docker_daemon_json(
    text, path, *, runtime_name, runtime_path, set_as_default, enable_cdi, present
):
    """daemon.json with runtimes.<name> merged in (or removed); other keys untouched."""
    try:
        config = json.loads(text) if (text or "").strip() else {}
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); left unchanged") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{path} holds a JSON {type(config).__name__}, an object was expected")
    original = copy.deepcopy(config)
    runtimes = config.get("runtimes", {})
    if present:
        entry = dict(runtimes.get(runtime_name) or {})
        entry["path"] = runtime_path
        entry.setdefault("args", [])
        runtimes[runtime_name] = entry
        config["runtimes"] = runtimes
        if set_as_default:
            config["default-runtime"] = runtime_name
        elif config.get("default-runtime") == runtime_name:
            del config["default-runtime"]
        if enable_cdi:
            config.setdefault("features", {})["cdi"] = True
    else:
        runtimes.pop(runtime_name, None)
        if "runtimes" in config and not runtimes:
            del config["runtimes"]
        if config.get("default-runtime") == runtime_name:
            del config["default-runtime"]
    if config == original and (text or "").strip():
        return text  # same settings: the file's own formatting stays
    match = re.search(r"^([ \t]+)\"", text or "", re.MULTILINE)
    indent = match.group(1) if match else "    "
    return json.dumps(config, indent=indent) + "\n"


def crio_default_handler(configs, runtime_name):
    """The settings of CRI-O's default handler in `configs` [(path, text)]: crio.conf and
    its drop-ins in the order CRI-O reads them, later ones overriding earlier keys.
    Empty when no config names a default handler with a table of its own, or when the
    default is `runtime_name` itself."""
    default = None
    handlers = {}
    for path, text in configs:
        runtime = _plain(_parse_toml(text, path)).get("crio", {}).get("runtime", {})
        default = runtime.get("default_runtime", default)
        for name, settings in runtime.get("runtimes", {}).items():
            handlers.setdefault(name, {}).update(settings)
    return handlers.get(default, {}) if default and default != runtime_name else {}


def crio_drop_in(
    text, path, *, runtime_name, runtime_path, set_as_default, enable_cdi, present, base=None
):
    """CRI-O drop-in text with crio.runtime.runtimes.<name>; None when nothing is left.

    A new handler starts as a copy of `base`, the default handler's settings (see
    crio_default_handler), so that conmon, its cgroup and the annotations it allows
    stay those of the site. enable_cdi is not a CRI-O setting: CRI-O reads CDI specs
    by default.
    """
    doc = _parse_toml(text, path)
    runtime = _table(_table(doc, "crio"), "runtime")
    runtimes = _table(runtime, "runtimes")
    if present:
        entry = runtimes.get(runtime_name)
        if entry is None:
            entry = tomlkit.table()
            for key, value in (base or {}).items():
                entry[key] = value
            runtimes[runtime_name] = entry
        if entry.get("runtime_path") != runtime_path:
            entry["runtime_path"] = runtime_path
        if entry.get("runtime_type") != "oci":
            entry["runtime_type"] = "oci"
        if set_as_default and runtime.get("default_runtime") != runtime_name:
            runtime["default_runtime"] = runtime_name
        elif not set_as_default and runtime.get("default_runtime") == runtime_name:
            del runtime["default_runtime"]
    else:
        if runtime_name in runtimes:
            del runtimes[runtime_name]
        if runtime.get("default_runtime") == runtime_name:
            del runtime["default_runtime"]
    if _only_empty_tables(_plain(doc)):
        return None
    return tomlkit.dumps(doc)


def _only_empty_tables(value):
    return isinstance(value, dict) and all(_only_empty_tables(v) for v in value.values())

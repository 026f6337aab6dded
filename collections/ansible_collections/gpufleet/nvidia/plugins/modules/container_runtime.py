#!/usr/bin/python
# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible module: the NVIDIA runtime in containerd's, Docker's or CRI-O's config."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: container_runtime
short_description: Add the NVIDIA runtime to a container runtime's config, keeping the rest
version_added: 0.1.0
description:
  - Edits the config of containerd (versions 1, 2 and 3 of its schema), Docker
    (C(daemon.json)) or CRI-O (a drop-in) the way C(nvidia-ctk runtime configure)
    does, and leaves every other setting, comment and table as it was.
  - containerd gets C(plugins.<cri>.containerd.runtimes.<runtime_name>) of type
    C(io.containerd.runc.v2) with C(options.BinaryName) = O(runtime_path); a new entry
    copies the options of the runtime it wraps first (the default one, or runc when the
    default is itself an NVIDIA runtime), and an existing entry follows that runtime's
    C(SystemdCgroup), so its containers use the kubelet's cgroup driver.
    With O(drop_in_path) the entry goes into a drop-in instead and the main config
    gains an C(imports) entry; the drop-in carries the main config's whole CRI plugin
    table, because containerd before 2.1 replaces imported plugin tables.
  - A new CRI-O handler starts as a copy of the default handler as C(crio.conf) and
    its drop-ins define it (C(monitor_path), C(runtime_root), allowed annotations), then
    gets O(runtime_path).
  - For k3s and RKE2 point O(config_path) at C(config.toml.tmpl) and O(template_base)
    at the generated C(config.toml); for MicroK8s at C(args/containerd-template.toml).
  - Writes atomically, keeps a backup of a file it changes (O(backup)), supports check
    mode and diff. Does not restart anything; the runtime_config role does, on change.
  - In check mode, on a change it would make, it asks the runtime whether
    restarting it would stop running containers (RV(restart_disrupts)), asking
    containerd and CRI-O for their tasks and containers (C(ctr), C(crictl)) and Docker
    through C(docker info), whose C(live-restore) keeps containers through a restart.
    What it cannot ask counts as disruptive.
requirements:
  - tomlkit (python3-tomlkit) on the node, for containerd and CRI-O (in check mode
    without it, a change is predicted)
options:
  runtime:
    description: The container runtime whose config is edited.
    type: str
    required: true
    choices: [containerd, docker, crio]
  config_path:
    description:
      - The config file. Defaults to C(/etc/containerd/config.toml),
        C(/etc/docker/daemon.json) or C(/etc/crio/crio.conf.d/99-nvidia.toml).
    type: path
  drop_in_path:
    description:
      - containerd only. Write the NVIDIA settings to this file (for example
        C(/etc/containerd/conf.d/99-nvidia.toml)) and import it from O(config_path).
    type: path
  template_base:
    description:
      - When O(config_path) does not exist yet, start from this file (the config k3s or
        RKE2 generated, when creating their C(config.toml.tmpl)).
    type: path
  containerd_config_version:
    description:
      - Schema version for a containerd config that is empty or missing (2 for
        containerd 1.x, 3 for 2.0 to 2.2, 4 from 2.3; each containerd 2.x reads the
        older ones). An existing config keeps its own version.
    type: int
    default: 2
    choices: [1, 2, 3, 4]
  state:
    description: Whether the NVIDIA runtime is configured.
    type: str
    default: present
    choices: [present, absent]
  runtime_name:
    description: Name of the runtime entry (and of a Kubernetes RuntimeClass handler).
    type: str
    default: nvidia
  runtime_path:
    description: The NVIDIA runtime binary.
    type: path
    default: /usr/bin/nvidia-container-runtime
  set_as_default:
    description:
      - Make it the default runtime. C(false) also returns a default that names it
        to the runtime's own default (C(runc) for containerd).
    type: bool
    default: false
  enable_cdi:
    description:
      - Turn on CDI device injection (containerd C(enable_cdi), Docker C(features.cdi)).
        C(false) leaves the setting as it is. CRI-O reads CDI specs by default.
    type: bool
    default: false
  backup:
    description: Keep a timestamped copy of a file before changing it.
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - gpufleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: NVIDIA runtime in containerd, as the default, with CDI
  gpufleet.nvidia.container_runtime:
    runtime: containerd
    set_as_default: true
    enable_cdi: true

- name: As a drop-in, leaving config.toml's own tables alone
  gpufleet.nvidia.container_runtime:
    runtime: containerd
    drop_in_path: /etc/containerd/conf.d/99-nvidia.toml

- name: RKE2 agent
  gpufleet.nvidia.container_runtime:
    runtime: containerd
    config_path: /var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl
    template_base: /var/lib/rancher/rke2/agent/etc/containerd/config.toml

- name: Docker
  gpufleet.nvidia.container_runtime:
    runtime: docker
"""

RETURN = r"""
changed_files:
  description: Files written (or that would be, in check mode).
  returned: always
  type: list
  elements: str
removed_files:
  description: Files removed (a drop-in with nothing left in it).
  returned: always
  type: list
  elements: str
backup_files:
  description: Backups made of changed files.
  returned: always
  type: list
  elements: str
rollback:
  description:
    - How to undo this change, one entry per file written or removed, for a caller
      whose runtime then refuses the new config. C(backup) is the copy to put back;
      null means the file did not exist before (remove it) or O(backup) was off.
  returned: always
  type: list
  elements: dict
  sample:
    - path: /etc/containerd/config.toml
      backup: /etc/containerd/config.toml.1234.2026-11-21@10:00:00~
      existed: true
config_version:
  description: containerd config schema version of the edited file.
  returned: when runtime is containerd
  type: int
running_containers:
  description: Containers running on the runtime (all containerd namespaces); null when
    it could not be asked.
  returned: in check mode, when the config would change
  type: int
restart_disrupts:
  description: Whether restarting the runtime now would stop running containers (true
    when they could not be counted; false with Docker's live-restore on).
  returned: in check mode, when the config would change
  type: bool
restart_impact:
  description: Why restart_disrupts is what it is, in words.
  returned: in check mode, when the config would change
  type: str
predicted:
  description:
    - In check mode on a node without tomlkit (before the role installs it), the edit
      cannot be worked out; a change is predicted (with the restart's impact), and this
      is true.
  returned: in check mode, for containerd and CRI-O without tomlkit
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.nvidia.plugins.module_utils import runtime_config as rc

DEFAULT_PATHS = {
    "containerd": "/etc/containerd/config.toml",
    "docker": "/etc/docker/daemon.json",
    "crio": "/etc/crio/crio.conf.d/99-nvidia.toml",
}


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _crio_configs(config_path):
    """CRI-O's configs as (path, text) in the order it reads them: crio.conf, then the
    drop-in directory's files by name (`config_path`, the file edited, among them)."""
    if os.path.basename(config_path) == "crio.conf":
        main, directory = config_path, config_path + ".d"
    else:
        directory = os.path.dirname(config_path)
        main = os.path.join(os.path.dirname(directory), "crio.conf")
    paths = [main]
    if os.path.isdir(directory):
        paths += [os.path.join(directory, name) for name in sorted(os.listdir(directory))]
    if config_path not in paths:
        paths.append(config_path)
    configs = []
    for path in paths:
        text = _read(path) if os.path.isfile(path) else None
        if text is not None:
            configs.append((path, text))
    return configs


def _ask(module, argv):
    """The output of a read-only runtime command, or None when it cannot be asked (no
    client installed, no daemon answering)."""
    try:
        # Bounded: a runtime that hangs must not hang the plan (it counts as busy).
        rc_, out, _err = module.run_command(["timeout", "20", *argv], handle_exceptions=False)
    except OSError:
        return None
    return out if rc_ == 0 else None


def _count(module, argv, running_only=False):
    """Lines a read-only runtime command lists (tasks or containers; with
    `running_only`, those RUNNING), or None when it cannot be asked."""
    out = _ask(module, argv)
    if out is None:
        return None
    lines = [line for line in out.splitlines()[1 if running_only else 0 :] if line.strip()]
    if running_only:
        return sum(1 for line in lines if "RUNNING" in line.split())
    return len(lines)


# The client the restart's impact is asked of, per runtime, and the sockets the
# runtime listens on while it runs (its own, k3s's and RKE2's for containerd).
CLIENTS = {"docker": "docker", "containerd": "ctr", "crio": "crictl"}
SOCKETS = {
    "docker": ("/run/docker.sock", "/var/run/docker.sock"),
    "containerd": ("/run/containerd/containerd.sock", "/run/k3s/containerd/containerd.sock"),
    "crio": ("/run/crio/crio.sock", "/var/run/crio/crio.sock"),
}


# Docker's daemon: a site may lay down daemon.json before Docker is installed (a k3s or
# RKE2 containerd has its config and no binary of its own on PATH, so only Docker's
# daemon says whether it is installed where its config is there).
DAEMONS = {"docker": "dockerd"}


def _restart_impact(module, runtime, config_path):
    """(running containers or None, restart disrupts them, in words)."""
    if (
        module.get_bin_path(CLIENTS[runtime]) is None
        and not any(os.path.exists(socket) for socket in SOCKETS[runtime])
        and (
            not os.path.exists(config_path)
            or (runtime in DAEMONS and module.get_bin_path(DAEMONS[runtime]) is None)
        )
    ):
        # No client, no socket, and no configuration (or no daemon): the runtime is not
        # installed yet (the role installs it in the apply), so nothing runs on it.
        return 0, False, f"{runtime} is not installed yet: nothing runs on it"
    if runtime == "docker":
        out = _ask(
            module, ["docker", "info", "--format", "{{.ContainersRunning}} {{.LiveRestoreEnabled}}"]
        )
        if out is None:
            return None, True, "docker could not be asked what runs on it"
        running_text, _, live_restore = out.strip().partition(" ")
        running = int(running_text) if running_text.isdigit() else None
        if live_restore == "true":
            return running, False, "live-restore keeps Docker's containers through a restart"
    elif runtime == "containerd":
        namespaces = _ask(module, ["ctr", "namespaces", "list", "-q"])
        running = None
        if namespaces is not None:
            counts = [
                _count(module, ["ctr", "-n", ns, "tasks", "list"], running_only=True)
                for ns in namespaces.split()
            ]
            running = None if None in counts else sum(c or 0 for c in counts)
    else:
        running = _count(module, ["crictl", "ps", "-q"])
    if running is None:
        return None, True, f"{runtime} could not be asked what runs on it"
    if running:
        # Docker without live-restore stops them; containerd's shims and CRI-O's conmon
        # keep them, but the kubelet and the CRI lose their runtime for the restart.
        return running, True, f"{running} container(s) run on {runtime}: a restart disrupts them"
    return 0, False, f"no container runs on {runtime}"


def _write(module, path, text):
    """Atomically replace `path` with `text`, keeping the file's mode; its backup."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o755)
    backup = None
    if os.path.exists(path) and module.params["backup"]:
        backup = module.backup_local(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.gpufleet.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    if not os.path.exists(path):
        os.chmod(tmp, 0o644)
    module.atomic_move(tmp, path)
    return backup


def main():
    module = AnsibleModule(
        argument_spec={
            "runtime": {
                "type": "str",
                "required": True,
                "choices": ["containerd", "docker", "crio"],
            },
            "config_path": {"type": "path"},
            "drop_in_path": {"type": "path"},
            "template_base": {"type": "path"},
            "containerd_config_version": {"type": "int", "default": 2, "choices": [1, 2, 3, 4]},
            "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
            "runtime_name": {"type": "str", "default": "nvidia"},
            "runtime_path": {"type": "path", "default": "/usr/bin/nvidia-container-runtime"},
            "set_as_default": {"type": "bool", "default": False},
            "enable_cdi": {"type": "bool", "default": False},
            "backup": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    runtime = p["runtime"]
    if p["drop_in_path"] and runtime != "containerd":
        module.fail_json(msg=f"drop_in_path: only containerd takes a drop-in here, not {runtime}")
    if runtime in ("containerd", "crio") and not rc.HAS_TOMLKIT:
        if not module.check_mode:
            module.fail_json(msg=missing_required_lib("tomlkit (Debian/Ubuntu: python3-tomlkit)"))
        # A plan before the role has installed python3-tomlkit (a node's first
        # contact): the edit cannot be worked out, so a change is predicted, with what
        # the restart it brings would do to the containers running now.
        running, disrupts, why = _restart_impact(
            module, runtime, p["config_path"] or DEFAULT_PATHS[runtime]
        )
        module.exit_json(
            changed=True,
            predicted=True,
            changed_files=[p["config_path"] or DEFAULT_PATHS[runtime]],
            removed_files=[],
            backup_files=[],
            rollback=[],
            running_containers=running,
            restart_disrupts=disrupts,
            restart_impact=why,
        )
    if not p["runtime_name"] or not p["runtime_name"].replace("-", "").replace("_", "").isalnum():
        module.fail_json(
            msg=f"runtime_name: expected letters, digits, - or _, got {p['runtime_name']!r}"
        )
    config_path = p["config_path"] or DEFAULT_PATHS[runtime]
    wanted = {
        "runtime_name": p["runtime_name"],
        "runtime_path": p["runtime_path"],
        "set_as_default": p["set_as_default"],
        "enable_cdi": p["enable_cdi"],
        "present": p["state"] == "present",
    }
    # `before` is what the file holds (None: no file); `current` what is edited,
    # which for a new k3s/RKE2 template is the generated config it starts from.
    before = current = _read(config_path)
    if current is None and p["template_base"]:
        current = _read(p["template_base"])
    result = {"changed_files": [], "removed_files": [], "backup_files": [], "rollback": []}
    # (path, text before, text after or None to remove)
    edits = []
    try:
        if runtime == "containerd" and p["drop_in_path"]:
            main_after, drop_after, result["config_version"] = rc.containerd_drop_in(
                current,
                config_path,
                p["drop_in_path"],
                new_version=p["containerd_config_version"],
                **wanted,
            )
            edits.append((config_path, before, main_after))
            edits.append((p["drop_in_path"], _read(p["drop_in_path"]), drop_after))
        elif runtime == "containerd":
            after, result["config_version"] = rc.containerd_in_place(
                current, config_path, new_version=p["containerd_config_version"], **wanted
            )
            edits.append((config_path, before, after))
        elif runtime == "docker":
            after = rc.docker_daemon_json(current, config_path, **wanted)
            edits.append((config_path, current, after))
        else:
            base = rc.crio_default_handler(_crio_configs(config_path), p["runtime_name"])
            edits.append(
                (config_path, current, rc.crio_drop_in(current, config_path, base=base, **wanted))
            )
    except rc.ConfigError as exc:
        module.fail_json(msg=str(exc), **result)

    diffs = []
    for path, old, new in edits:
        if new is None:
            if old is None:
                continue
            result["removed_files"].append(path)
        elif old is not None and (old == new or (runtime != "docker" and rc.same_toml(old, new))):
            continue
        elif old is None and not wanted["present"]:
            # Nothing configured and nothing wanted: do not create a file.
            continue
        else:
            result["changed_files"].append(path)
        diffs.append(
            {"before_header": path, "after_header": path, "before": old or "", "after": new or ""}
        )

    if not module.check_mode:
        for path, old, new in edits:
            if path in result["removed_files"]:
                backup = module.backup_local(path) if p["backup"] else None
                os.remove(path)
            elif path in result["changed_files"]:
                backup = _write(module, path, new)
            else:
                continue
            if backup:
                result["backup_files"].append(backup)
            result["rollback"].append({"path": path, "backup": backup, "existed": old is not None})

    changed = bool(result["changed_files"] or result["removed_files"])
    if changed and module.check_mode:
        running, disrupts, why = _restart_impact(module, runtime, config_path)
        result.update(running_containers=running, restart_disrupts=disrupts, restart_impact=why)
    module.exit_json(changed=changed, diff=diffs, **result)


if __name__ == "__main__":
    main()

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The container_runtime module through Ansible: check mode, diff, backup, idempotence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import PROJECT, run_local_module

ORIGINAL = """# kept
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""


def run_module(args: dict, *flags: str) -> dict:
    return run_local_module("gpufleet.nvidia.container_runtime", args, *flags)


def test_check_mode_predicts_then_apply_writes_with_a_backup_then_nothing(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(ORIGINAL)
    args = {"runtime": "containerd", "config_path": str(config), "set_as_default": True}

    predicted = run_module(args, "--check", "--diff")
    assert predicted["changed"] is True
    assert config.read_text() == ORIGINAL
    assert 'default_runtime_name = "nvidia"' in predicted["diff"][0]["after"]

    applied = run_module(args)
    assert applied["changed"] is True
    assert applied["changed_files"] == [str(config)]
    (backup,) = applied["backup_files"]
    assert Path(backup).read_text() == ORIGINAL
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in config.read_text()
    assert config.read_text().startswith("# kept\n")
    assert applied["rollback"] == [{"path": str(config), "backup": backup, "existed": True}]

    again = run_module(args)
    assert again["changed"] is False
    assert again["backup_files"] == []


def test_a_new_file_is_rolled_back_by_removing_it(tmp_path):
    config = tmp_path / "docker" / "daemon.json"
    result = run_module({"runtime": "docker", "config_path": str(config)})
    assert result["changed"] is True
    assert json.loads(config.read_text())["runtimes"]["nvidia"]["path"] == (
        "/usr/bin/nvidia-container-runtime"
    )
    assert result["rollback"] == [{"path": str(config), "backup": None, "existed": False}]


def test_absent_on_a_missing_file_creates_nothing(tmp_path):
    config = tmp_path / "daemon.json"
    result = run_module({"runtime": "docker", "config_path": str(config), "state": "absent"})
    assert result["changed"] is False
    assert not config.exists()


def test_broken_config_fails_naming_it_and_is_left_alone(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[plugins\n")
    result = run_module({"runtime": "containerd", "config_path": str(config)})
    assert result["failed"] is True
    assert f"{config} is not valid TOML" in result["msg"]
    assert config.read_text() == "[plugins\n"
    assert list(tmp_path.iterdir()) == [config]


def test_k3s_template_starts_from_the_generated_config(tmp_path):
    generated = tmp_path / "config.toml"
    generated.write_text(ORIGINAL)
    template = tmp_path / "config.toml.tmpl"
    result = run_module(
        {"runtime": "containerd", "config_path": str(template), "template_base": str(generated)}
    )
    assert result["changed_files"] == [str(template)]
    assert generated.read_text() == ORIGINAL
    assert template.read_text().startswith(ORIGINAL)
    assert "runtimes.nvidia" in template.read_text()


def test_a_drop_in_is_containerd_only(tmp_path):
    result = run_module(
        {"runtime": "docker", "config_path": str(tmp_path / "d.json"), "drop_in_path": "/x.json"}
    )
    assert result["failed"] is True
    assert result["msg"].startswith("drop_in_path: only containerd")


def test_absent_drop_in_layout_on_a_node_without_config_writes_nothing(tmp_path):
    result = run_module(
        {
            "runtime": "containerd",
            "config_path": str(tmp_path / "config.toml"),
            "drop_in_path": str(tmp_path / "conf.d" / "99-nvidia.toml"),
            "state": "absent",
        }
    )
    assert result["changed"] is False
    assert list(tmp_path.iterdir()) == []


def test_reapplying_to_an_indented_kubespray_config_changes_nothing(tmp_path):
    # tomlkit re-indents nested tables of such files on every dump; the data is what
    # counts, so the second run neither writes nor restarts anything.
    kubespray = PROJECT / "molecule" / "runtime" / "tests" / "files" / "containerd-kubespray.toml"
    config = tmp_path / "config.toml"
    config.write_text(kubespray.read_text())
    args = {"runtime": "containerd", "config_path": str(config), "enable_cdi": True}
    assert run_module(args)["changed"] is True
    written = config.read_text()
    again = run_module(args)
    assert again["changed"] is False
    assert config.read_text() == written


def _clients(directory: Path, **scripts: str) -> Path:
    """Stand-in runtime clients (ctr, docker, crictl) answering as the real ones do."""
    directory.mkdir()
    for name, body in scripts.items():
        path = directory / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    return directory


CTR = """case "$*" in
  "namespaces list -q") printf 'default\\nk8s.io\\n' ;;
  "-n k8s.io tasks list") printf 'TASK PID STATUS\\nweb 4242 RUNNING\\nold 17 STOPPED\\n' ;;
  "-n default tasks list") printf 'TASK PID STATUS\\n' ;;
  *) exit 1 ;;
esac
"""


def test_a_plan_asks_whether_restarting_the_runtime_would_stop_containers(tmp_path, monkeypatch):
    """In check mode, a change to the config comes with what the restart it needs would
    do: containers running on containerd would stop (the role then calls the change
    disruptive); with none running, or Docker's live-restore on, it would not; a runtime
    that cannot be asked counts as disruptive."""
    idle_ctr = CTR.replace("web 4242 RUNNING\\n", "")
    cases = [
        (
            "containerd",
            {"ctr": CTR},
            1,
            True,
            "1 container(s) run on containerd: a restart disrupts them",
        ),
        ("containerd", {"ctr": idle_ctr}, 0, False, "no container runs on containerd"),
        ("docker", {"docker": "echo '3 true'\n"}, 3, False, "live-restore keeps Docker's"),
        ("docker", {"docker": "echo '3 false'\n"}, 3, True, "3 container(s) run on docker"),
        ("crio", {"crictl": "exit 1\n"}, None, True, "crio could not be asked what runs on it"),
    ]
    for index, (runtime, scripts, running, disrupts, words) in enumerate(cases):
        bin_dir = _clients(tmp_path / f"bin{index}", **scripts)
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        config = tmp_path / f"config{index}"
        result = run_module({"runtime": runtime, "config_path": str(config)}, "--check")
        assert result["changed"] is True, result
        assert result["running_containers"] == running, (runtime, result)
        assert result["restart_disrupts"] is disrupts, (runtime, result)
        assert words in result["restart_impact"], (runtime, result)
    # A config already as wanted needs no restart: the runtime is not asked.
    daemon = {"runtime": "docker", "config_path": str(tmp_path / "daemon.json")}
    assert run_module(daemon)["changed"] is True
    settled = run_module(daemon, "--check")
    assert settled["changed"] is False and "restart_disrupts" not in settled


def test_a_plan_before_tomlkit_is_installed_predicts_the_change_and_asks_the_runtime(
    tmp_path, monkeypatch
):
    """A node's first plan: python3-tomlkit is not there yet (the role installs it in
    the apply), so the edit is predicted, never failed, and the restart's impact is
    asked all the same: a busy containerd makes the change disruptive. The apply
    still needs tomlkit."""
    hidden = tmp_path / "no-tomlkit" / "tomlkit"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('tomlkit is not installed')\n")
    monkeypatch.setenv("PYTHONPATH", str(hidden.parent))
    monkeypatch.setenv("PATH", f"{_clients(tmp_path / 'bin', ctr=CTR)}:/usr/bin:/bin")
    config = tmp_path / "config.toml"
    config.write_text(ORIGINAL)
    args = {"runtime": "containerd", "config_path": str(config)}
    planned = run_module(args, "--check")
    assert planned["changed"] is True and planned["predicted"] is True, planned
    assert planned["changed_files"] == [str(config)]
    assert (planned["running_containers"], planned["restart_disrupts"]) == (1, True)
    assert config.read_text() == ORIGINAL
    applied = run_module(args)
    assert applied.get("failed") and "tomlkit" in applied["msg"], applied
    # On a node where the role is yet to install containerd: no config, no client.
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    system = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/sbin"
    assert shutil.which("ctr", path=system) is None, "a machine without containerd's ctr"
    assert not Path("/run/containerd/containerd.sock").exists(), "nor containerd running"
    fresh = {"runtime": "containerd", "config_path": str(tmp_path / "absent" / "config.toml")}
    planned = run_module(fresh, "--check")
    assert (planned["running_containers"], planned["restart_disrupts"]) == (0, False), planned
    assert planned["restart_impact"] == "containerd is not installed yet: nothing runs on it"


def test_a_daemon_json_laid_down_before_docker_is_installed_disrupts_nothing(tmp_path, monkeypatch):
    """A site may write daemon.json before Docker is installed (the role installs it in
    the apply): with no client, socket or daemon, nothing runs on Docker, so the change
    is not disruptive. With Docker's daemon there but its client missing, Docker cannot
    be asked, which counts as disruptive as before."""
    system = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/sbin"
    assert shutil.which("docker", path=system) is None, "a machine without Docker's client"
    assert shutil.which("dockerd", path=system) is None, "nor its daemon"
    assert not Path("/run/docker.sock").exists(), "nor Docker running"
    daemon_json = tmp_path / "daemon.json"
    daemon_json.write_text('{"bridge": "none"}\n')
    args = {"runtime": "docker", "config_path": str(daemon_json)}
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    planned = run_module(args, "--check")
    assert planned["changed"] is True, planned
    assert (planned["running_containers"], planned["restart_disrupts"]) == (0, False), planned
    assert planned["restart_impact"] == "docker is not installed yet: nothing runs on it"
    bin_dir = _clients(tmp_path / "bin", dockerd="exit 0\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    planned = run_module(args, "--check")
    assert (planned["running_containers"], planned["restart_disrupts"]) == (None, True), planned
    assert planned["restart_impact"] == "docker could not be asked what runs on it"

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The NVIDIA runtime added to containerd, Docker and CRI-O configs, the rest kept.

containerd configs are checked by the real consumer: Debian's containerd binary
(unpacked by tests/tools/consumers.sh) must load what we write (`config dump`).
"""

from __future__ import annotations

import difflib
import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import runtime_config as rc
from conftest import PROJECT

CONTAINERD = PROJECT / ".cache" / "consumers" / "usr" / "bin" / "containerd"
NVIDIA = "/usr/bin/nvidia-container-runtime"
WANT = {
    "runtime_name": "nvidia",
    "runtime_path": NVIDIA,
    "set_as_default": False,
    "enable_cdi": False,
    "present": True,
}


def containerd(*args: str) -> subprocess.CompletedProcess:
    assert CONTAINERD.exists(), "run tests/tools/consumers.sh (make unit does) first"
    return subprocess.run([str(CONTAINERD), *args], capture_output=True, text=True, check=False)


def dump(path: Path) -> dict:
    """What containerd makes of the config at path (with its imports)."""
    result = containerd("-c", str(path), "config", "dump")
    assert result.returncode == 0, result.stderr
    return tomllib.loads(result.stdout)


@pytest.fixture(scope="module")
def stock_v2() -> str:
    """containerd's own default config, as a site would have it: SystemdCgroup on."""
    text = containerd("config", "default").stdout
    assert "SystemdCgroup = false" in text
    text = text.replace("SystemdCgroup = false", "SystemdCgroup = true")
    return "# site config, do not lose this comment\n" + text


def cri(config: dict, version: int = 2) -> dict:
    return config["plugins"][rc.CRI_PLUGIN[version]]


def test_containerd_v2_in_place_copies_runc_options_and_keeps_the_rest(tmp_path, stock_v2):
    after, version = rc.containerd_in_place(stock_v2, "config.toml", **WANT)
    assert version == 2
    # Only added lines: every line of the original is still there, in order.
    ops = difflib.SequenceMatcher(None, stock_v2.splitlines(), after.splitlines()).get_opcodes()
    assert {op[0] for op in ops} == {"equal", "insert"}
    path = tmp_path / "config.toml"
    path.write_text(after)
    loaded = cri(dump(path))["containerd"]
    nvidia = loaded["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == NVIDIA
    assert nvidia["options"]["SystemdCgroup"] is True
    assert loaded["default_runtime_name"] == "runc"
    # A second pass changes nothing.
    assert rc.containerd_in_place(after, "config.toml", **WANT)[0] == after


def test_containerd_default_runtime_and_cdi_and_back(tmp_path, stock_v2):
    wanted = dict(WANT, set_as_default=True, enable_cdi=True)
    after, _ = rc.containerd_in_place(stock_v2, "config.toml", **wanted)
    path = tmp_path / "config.toml"
    path.write_text(after)
    loaded = cri(dump(path))
    assert loaded["containerd"]["default_runtime_name"] == "nvidia"
    # enable_cdi arrived in containerd 1.7; Debian 12's 1.6 loads the file and
    # ignores the key, so it is checked in the text.
    assert cri(tomllib.loads(after))["enable_cdi"] is True
    # Not the default any more: containerd's own default comes back.
    reverted, _ = rc.containerd_in_place(after, "config.toml", **WANT)
    path.write_text(reverted)
    assert cri(dump(path))["containerd"]["default_runtime_name"] == "runc"


def test_containerd_absent_removes_only_ours(tmp_path, stock_v2):
    added, _ = rc.containerd_in_place(stock_v2, "c", **dict(WANT, set_as_default=True))
    removed, _ = rc.containerd_in_place(added, "c", **dict(WANT, present=False))
    path = tmp_path / "config.toml"
    path.write_text(removed)
    loaded = cri(dump(path))["containerd"]
    assert "nvidia" not in loaded["runtimes"]
    assert loaded["default_runtime_name"] == "runc"
    assert loaded["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    # Nothing to remove: the text is returned as it was.
    assert rc.containerd_in_place(stock_v2, "c", **dict(WANT, present=False))[0] == stock_v2


def test_containerd_v1_config_uses_the_cri_plugin(tmp_path):
    v1 = '[plugins.cri.containerd]\n  snapshotter = "overlayfs"\n'
    after, version = rc.containerd_in_place(v1, "c", **WANT)
    assert version == 1
    path = tmp_path / "config.toml"
    path.write_text(after)
    loaded = dump(path)
    assert (
        loaded["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"][
            "options"
        ]["BinaryName"]
        == NVIDIA
    )


def test_containerd_v3_config_uses_the_runtime_plugin():
    # containerd 2.x; Debian 12's containerd (1.6) cannot load v3, so this is
    # checked against the schema's table names only.
    v3 = (
        "version = 3\n"
        '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\n'
        "  SystemdCgroup = true\n"
    )
    after, version = rc.containerd_in_place(v3, "c", **dict(WANT, enable_cdi=True))
    assert version == 3
    loaded = cri(tomllib.loads(after), 3)
    assert loaded["enable_cdi"] is True
    assert loaded["containerd"]["runtimes"]["nvidia"]["options"] == {
        "SystemdCgroup": True,
        "BinaryName": NVIDIA,
    }


def test_empty_containerd_config_gets_the_requested_version(tmp_path):
    after, version = rc.containerd_in_place("", "c", new_version=2, **WANT)
    assert version == 2 and after.startswith("version = 2\n")
    path = tmp_path / "config.toml"
    path.write_text(after)
    assert cri(dump(path))["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == NVIDIA


def test_containerd_drop_in_carries_the_whole_cri_table(tmp_path, stock_v2):
    site = stock_v2.replace('sandbox_image = "', 'sandbox_image = "mirror.example/')
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    main_after, drop_after, version = rc.containerd_drop_in(
        site, "config.toml", str(drop_in), **WANT
    )
    assert version == 2
    assert tomllib.loads(main_after)["imports"] == [str(tmp_path / "conf.d" / "*.toml")]
    main = tmp_path / "config.toml"
    main.write_text(main_after)
    drop_in.parent.mkdir()
    drop_in.write_text(drop_after)
    loaded = cri(dump(main))
    assert loaded["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == NVIDIA
    # The main config's own CRI settings survive containerd's table replacement.
    assert loaded["sandbox_image"].startswith("mirror.example/")
    assert loaded["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    again = rc.containerd_drop_in(main_after, "config.toml", str(drop_in), **WANT)
    assert again[:2] == (main_after, drop_after)


def test_broken_toml_is_refused_with_the_path():
    with pytest.raises(rc.ConfigError, match=r"/etc/containerd/config\.toml is not valid TOML"):
        rc.containerd_in_place("[plugins\n", "/etc/containerd/config.toml", **WANT)


DAEMON_JSON = """{
  "log-driver": "json-file",
  "runtimes": {
    "kata": {"path": "/usr/bin/kata-runtime"}
  },
  "data-root": "/srv/docker"
}
"""


def test_docker_merges_and_keeps_other_keys():
    after = rc.docker_daemon_json(
        DAEMON_JSON, "daemon.json", **dict(WANT, set_as_default=True, enable_cdi=True)
    )
    config = json.loads(after)
    assert list(config)[:3] == ["log-driver", "runtimes", "data-root"]
    assert config["runtimes"] == {
        "kata": {"path": "/usr/bin/kata-runtime"},
        "nvidia": {"path": NVIDIA, "args": []},
    }
    assert config["default-runtime"] == "nvidia"
    assert config["features"] == {"cdi": True}
    assert after.startswith('{\n  "log-driver"')  # the file's two-space indent
    assert (
        rc.docker_daemon_json(
            after, "daemon.json", **dict(WANT, set_as_default=True, enable_cdi=True)
        )
        == after
    )
    removed = json.loads(rc.docker_daemon_json(after, "daemon.json", **dict(WANT, present=False)))
    assert removed["runtimes"] == {"kata": {"path": "/usr/bin/kata-runtime"}}
    assert "default-runtime" not in removed
    assert removed["data-root"] == "/srv/docker"


def test_docker_refuses_a_file_that_is_not_an_object():
    with pytest.raises(rc.ConfigError, match="an object was expected"):
        rc.docker_daemon_json("[]", "/etc/docker/daemon.json", **WANT)


def test_crio_drop_in():
    text = rc.crio_drop_in(None, "99-nvidia.toml", **dict(WANT, set_as_default=True))
    assert tomllib.loads(text) == {
        "crio": {
            "runtime": {
                "runtimes": {"nvidia": {"runtime_path": NVIDIA, "runtime_type": "oci"}},
                "default_runtime": "nvidia",
            }
        }
    }
    assert rc.crio_drop_in(text, "99-nvidia.toml", **dict(WANT, set_as_default=True)) == text
    assert rc.crio_drop_in(text, "99-nvidia.toml", **dict(WANT, present=False)) is None

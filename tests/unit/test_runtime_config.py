# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The NVIDIA runtime added to containerd, Docker and CRI-O configs, the rest kept.

containerd configs are checked by the real consumers: Debian 12's containerd 1.6 and
Debian 13's 1.7 (unpacked by tests/tools/consumers.sh) load versions 1 and 2,
containerd 2.4 (built by tests/tools/containerd/build.sh from its Go module) versions 3
and 4 as containerd 2.x sites have them; each must load what we write (`config dump`).
Docker's daemon.json is checked by Debian 13's dockerd 26 (`dockerd --validate`).
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import runtime_config as rc
from conftest import PROJECT

CONTAINERD = PROJECT / ".cache" / "consumers" / "usr" / "bin" / "containerd"
# Debian 13's runtimes, unpacked by the same script: containerd 1.7, Docker 26.
DEBIAN_13 = PROJECT / ".cache" / "consumers" / "trixie"
CONTAINERD_1_7 = DEBIAN_13 / "usr" / "bin" / "containerd"
DOCKERD_26 = DEBIAN_13 / "usr" / "sbin" / "dockerd"
NVIDIA = "/usr/bin/nvidia-container-runtime"
WANT = {
    "runtime_name": "nvidia",
    "runtime_path": NVIDIA,
    "set_as_default": False,
    "enable_cdi": False,
    "present": True,
}


def containerd(*args: str, binary: Path = CONTAINERD) -> subprocess.CompletedProcess:
    assert binary.exists(), "run tests/tools/consumers.sh (make unit does) first"
    return subprocess.run([str(binary), *args], capture_output=True, text=True, check=False)


def dump(path: Path, binary: Path = CONTAINERD) -> dict:
    """What containerd makes of the config at path (with its imports). A key it does
    not know is only a warning to containerd: here it fails the test."""
    result = containerd("-c", str(path), "config", "dump", binary=binary)
    assert result.returncode == 0, result.stderr
    assert "unknown key" not in result.stderr, result.stderr
    return tomllib.loads(result.stdout)


@pytest.fixture(scope="module")
def stock_v4(containerd2: Path) -> str:
    """containerd 2.4's own default config (version 4), as a site would have it:
    SystemdCgroup on, and a setting of its own in the CRI runtime plugin's table."""
    text = containerd("config", "default", binary=containerd2).stdout
    assert text.startswith("version = 4\n") and "SystemdCgroup = false" in text
    text = text.replace("SystemdCgroup = false", "SystemdCgroup = true")
    text = text.replace("max_container_log_line_size = 16384", "max_container_log_line_size = 8192")
    return "# site config, do not lose this comment\n" + text


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


def test_containerd_v3_config_uses_the_runtime_plugin(tmp_path, containerd2):
    # containerd 2.0 to 2.2 write version 3; 2.4 reads it (migrating it, as it says).
    v3 = (
        "version = 3\n"
        '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\n'
        "  SystemdCgroup = true\n"
    )
    after, version = rc.containerd_in_place(v3, "c", **dict(WANT, enable_cdi=True))
    assert version == 3
    # CDI is on by default from version 3: nothing to write for it.
    assert "enable_cdi" not in after
    path = tmp_path / "config.toml"
    path.write_text(after)
    loaded = cri(dump(path, containerd2), 3)
    assert loaded["containerd"]["runtimes"]["nvidia"]["runtime_type"] == rc.RUNC_V2
    options = loaded["containerd"]["runtimes"]["nvidia"]["options"]
    assert (options["BinaryName"], options["SystemdCgroup"]) == (NVIDIA, True)
    # A file that turns CDI off (containerd 2.0 to 2.3 honour it) has it turned on.
    off = v3.replace(
        "version = 3\n",
        'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = false\n',
    )
    turned, _ = rc.containerd_in_place(off, "c", **dict(WANT, enable_cdi=True))
    assert cri(tomllib.loads(turned), 3)["enable_cdi"] is True


def test_containerd_2_4_stock_config_version_4_in_place_and_back(tmp_path, stock_v4, containerd2):
    wanted = dict(WANT, set_as_default=True, enable_cdi=True)
    after, version = rc.containerd_in_place(stock_v4, "config.toml", **wanted)
    assert version == 4
    assert after.startswith("# site config, do not lose this comment\nversion = 4\n")
    path = tmp_path / "config.toml"
    path.write_text(after)
    loaded = cri(dump(path, containerd2), 4)
    assert loaded["containerd"]["default_runtime_name"] == "nvidia"
    nvidia = loaded["containerd"]["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == rc.RUNC_V2
    assert (nvidia["options"]["BinaryName"], nvidia["options"]["SystemdCgroup"]) == (NVIDIA, True)
    assert loaded["max_container_log_line_size"] == 8192
    assert rc.containerd_in_place(after, "config.toml", **wanted)[0] == after
    removed, _ = rc.containerd_in_place(after, "config.toml", **dict(wanted, present=False))
    path.write_text(removed)
    loaded = cri(dump(path, containerd2), 4)
    assert "nvidia" not in loaded["containerd"]["runtimes"]
    assert loaded["containerd"]["default_runtime_name"] == "runc"
    assert rc.same_toml(removed, stock_v4)


def test_containerd_2_4_drop_in_keeps_the_sites_settings(tmp_path, stock_v4, containerd2):
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    main_after, drop_after, version = rc.containerd_drop_in(
        stock_v4, "config.toml", str(drop_in), **WANT
    )
    assert version == 4 and drop_after.count("version = 4\n") == 1
    # containerd 2.4's own imports stay, ours is added.
    assert tomllib.loads(main_after)["imports"] == [
        "/etc/containerd/conf.d/*.toml",
        str(tmp_path / "conf.d" / "*.toml"),
    ]
    main = tmp_path / "config.toml"
    main.write_text(main_after)
    drop_in.parent.mkdir()
    drop_in.write_text(drop_after)
    loaded = cri(dump(main, containerd2), 4)
    options = loaded["containerd"]["runtimes"]["nvidia"]["options"]
    assert (options["BinaryName"], options["SystemdCgroup"]) == (NVIDIA, True)
    assert loaded["max_container_log_line_size"] == 8192
    assert loaded["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True


def daemon_log(binary: Path, config: Path, until: str, seconds: float = 60) -> list[str]:
    """containerd's log lines from its start until one containing `until` (then it is
    stopped); fails the test when it exits or does not get there in time."""
    log = config.with_name("containerd.log")
    with log.open("w") as sink:
        daemon = subprocess.Popen([str(binary), "-c", str(config)], stderr=sink)
    try:
        deadline = time.monotonic() + seconds
        while until not in log.read_text():
            lines = log.read_text().splitlines()
            assert daemon.poll() is None, "containerd exited:\n" + "\n".join(lines[-20:])
            assert time.monotonic() < deadline, "\n".join(lines[-20:])
            time.sleep(0.1)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    return log.read_text().splitlines()


@pytest.mark.parametrize("drop_in", [False, True], ids=["in-place", "drop-in"])
def test_containerd_2_4_starts_with_our_version_4_config_and_serves_the_runtime(
    stock_v4, containerd2, drop_in
):
    """The daemon itself, not only `config dump`: every path of the site's config moved
    under a scratch directory (sockets included), so nothing of this machine's is used.
    The drop-in goes where the stock config's own `imports` reads it."""
    scratch = Path(tempfile.mkdtemp(prefix="ctd", dir="/tmp"))
    try:
        site = re.sub(r"'(/[^']*)'", lambda m: f"'{scratch}{m.group(1)}'", stock_v4)
        wanted = dict(WANT, set_as_default=True, enable_cdi=True)
        config = scratch / "config.toml"
        if drop_in:
            path = scratch / "etc" / "containerd" / "conf.d" / "99-nvidia.toml"
            after, drop_text, _ = rc.containerd_drop_in(site, str(config), str(path), **wanted)
            assert rc.same_toml(after, site), "the stock imports already read conf.d"
            path.parent.mkdir(parents=True)
            path.write_text(drop_text)
        else:
            after, _ = rc.containerd_in_place(site, str(config), **wanted)
        config.write_text(after)
        lines = daemon_log(containerd2, config, "containerd successfully booted")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert not [line for line in lines if "unknown key" in line], lines
    [started] = [line for line in lines if 'msg="starting cri plugin"' in line]
    quoted = re.search(r'config="((?:[^"\\]|\\.)*)"', started)
    assert quoted, started
    cri_config = json.loads(json.loads(f'"{quoted.group(1)}"'))
    assert cri_config["containerd"]["defaultRuntimeName"] == "nvidia"
    nvidia = cri_config["containerd"]["runtimes"]["nvidia"]
    assert nvidia["runtimeType"] == rc.RUNC_V2
    assert (nvidia["options"]["BinaryName"], nvidia["options"]["SystemdCgroup"]) == (NVIDIA, True)
    assert cri_config["maxContainerLogLineSize"] == 8192


def test_an_empty_config_can_start_at_version_4(tmp_path, containerd2):
    after, version = rc.containerd_in_place("", "c", new_version=4, **WANT)
    assert version == 4 and after.startswith("version = 4\n")
    path = tmp_path / "config.toml"
    path.write_text(after)
    nvidia = cri(dump(path, containerd2), 4)["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"]["BinaryName"] == NVIDIA


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


def test_containerd_1_7_stock_config_gets_cdi_and_the_default_runtime_and_back(tmp_path):
    """Debian 13's containerd: version 2, where CDI is off unless the file turns it on."""
    stock = containerd("config", "default", binary=CONTAINERD_1_7).stdout
    assert "version = 2" in stock and "enable_cdi = false" in stock
    site = stock.replace("SystemdCgroup = false", "SystemdCgroup = true")
    wanted = dict(WANT, set_as_default=True, enable_cdi=True)
    after, version = rc.containerd_in_place(site, "config.toml", **wanted)
    assert version == 2
    path = tmp_path / "config.toml"
    path.write_text(after)
    loaded = cri(dump(path, CONTAINERD_1_7))
    assert loaded["enable_cdi"] is True
    assert loaded["containerd"]["default_runtime_name"] == "nvidia"
    options = loaded["containerd"]["runtimes"]["nvidia"]["options"]
    assert (options["BinaryName"], options["SystemdCgroup"]) == (NVIDIA, True)
    removed, _ = rc.containerd_in_place(after, "config.toml", **dict(wanted, present=False))
    path.write_text(removed)
    loaded = cri(dump(path, CONTAINERD_1_7))
    assert "nvidia" not in loaded["containerd"]["runtimes"]
    assert loaded["containerd"]["default_runtime_name"] == "runc"


def dockerd_validate(path: Path) -> subprocess.CompletedProcess:
    """Docker 26's own check of a daemon.json; docker-proxy (which it looks for on PATH,
    as on a host where docker.io put it in /usr/sbin) beside it."""
    assert DOCKERD_26.exists(), "run tests/tools/consumers.sh (make unit does) first"
    return subprocess.run(
        [str(DOCKERD_26), "--validate", "--config-file", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": f"{DOCKERD_26.parent}:/usr/sbin:/usr/bin:/sbin:/bin"},
    )


def test_docker_26_validates_what_we_write_and_refuses_what_it_does_not_know(tmp_path):
    wanted = dict(WANT, set_as_default=True, enable_cdi=True)
    after = rc.docker_daemon_json(DAEMON_JSON, "daemon.json", **wanted)
    removed = rc.docker_daemon_json(after, "daemon.json", **dict(wanted, present=False))
    path = tmp_path / "daemon.json"
    for text in (after, removed):
        path.write_text(text)
        checked = dockerd_validate(path)
        assert checked.returncode == 0 and "configuration OK" in checked.stdout + checked.stderr, (
            checked.stderr
        )
    # The check is Docker's: a key it does not know fails it.
    path.write_text(after.replace('"log-driver"', '"log-drivers"'))
    refused = dockerd_validate(path)
    assert refused.returncode != 0 and "log-drivers" in refused.stderr, refused.stderr


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

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""containerd_runtimes: what a containerd of a given version makes of its config.

The dumps come from the real consumers (Debian's containerd 1.6 binary, and containerd
2.4 built from its Go module), so the test proves the filter reads what containerd
really reports, including a v3 config that containerd 1.6 loads without a word and then
ignores, and the v2 config of a site that moved to containerd 2.x.
"""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from test_runtime_config import containerd

from ansible_collections.gpufleet.nvidia.plugins.filter.runtime import containerd_runtimes
from ansible_collections.gpufleet.nvidia.plugins.module_utils import runtime_config as rc


def dump_of(tmp_path, text: str, **binary) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    result = containerd("-c", str(path), "config", "dump", **binary)
    assert result.returncode == 0, result.stderr
    return result.stdout


def new_config(version: int, set_as_default: bool) -> str:
    """A config created from nothing with the nvidia runtime, as the module writes it."""
    text, _ = rc.containerd_in_place(
        None, "config.toml", new_version=version, runtime_name="nvidia",
        runtime_path="/usr/bin/nvidia-container-runtime", set_as_default=set_as_default,
        enable_cdi=False, present=True,
    )  # fmt: skip
    return text


@pytest.fixture(scope="module")
def version_output() -> str:
    return containerd("--version").stdout


def test_nvidia_runtime_written_as_v2_is_what_containerd_1_6_uses(tmp_path, version_output):
    text = new_config(version=2, set_as_default=True)
    seen = containerd_runtimes(dump_of(tmp_path, text), version_output)
    assert seen["version"].startswith("1.6.")
    assert seen["plugin"] == "io.containerd.grpc.v1.cri"
    assert seen["default"] == "nvidia"
    assert seen["runtimes"]["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "binary": "/usr/bin/nvidia-container-runtime",
    }


def test_a_v3_config_is_loaded_but_ignored_by_containerd_1_6(tmp_path, version_output):
    text = new_config(version=3, set_as_default=False)
    seen = containerd_runtimes(dump_of(tmp_path, text), version_output)
    assert "nvidia" not in seen["runtimes"]
    assert seen["default"] == "runc"


@pytest.mark.parametrize("version", [2, 3, 4])
def test_containerd_2_4_uses_the_nvidia_runtime_written_at_each_version(
    tmp_path, containerd2, version
):
    # Version 2 as a containerd 1.x site wrote it, migrated by containerd 2.4 as it starts.
    text = new_config(version=version, set_as_default=True)
    binary = {"binary": containerd2}
    seen = containerd_runtimes(
        dump_of(tmp_path, text, **binary), containerd("--version", **binary).stdout
    )
    assert seen["version"].startswith("2.4.")
    assert seen["plugin"] == "io.containerd.cri.v1.runtime"
    assert seen["default"] == "nvidia"
    assert seen["runtimes"]["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "binary": "/usr/bin/nvidia-container-runtime",
    }
    # CDI is always on in containerd 2.4, which no longer shows enable_cdi.
    assert seen["cdi"] is True


def test_containerd_2_reads_the_runtime_plugin():
    dump = (
        "version = 3\n"
        '[plugins."io.containerd.cri.v1.runtime".containerd]\n'
        '  default_runtime_name = "runc"\n'
        '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
    )
    seen = containerd_runtimes(dump, "containerd containerd.io v2.1.4 75cb2b7")
    assert seen["plugin"] == "io.containerd.cri.v1.runtime"
    assert seen["runtimes"]["nvidia"]["binary"] == ""


def test_unreadable_input_is_an_error_in_words():
    with pytest.raises(AnsibleFilterError, match="no containerd version"):
        containerd_runtimes("", "command not found")
    with pytest.raises(AnsibleFilterError, match="not TOML"):
        containerd_runtimes("[plugins", "containerd 1.6.20")

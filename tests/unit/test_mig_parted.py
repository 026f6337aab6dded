# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""NVIDIA's mig-parted on the mock NVML: the tool the MIG stage will run on nodes.

`nvidia-mig-parted` is built from its published Go module (tests/sim/migparted/build.sh).
Besides NVML it reads two kernel interfaces directly: /proc/modules (is `nvidia`
loaded?) and the PCI devices under /sys/bus/pci/devices (which GPUs are there). This
machine's kernel has no module support (no /proc/modules at all) and its sysfs has no
GPUs, so the tool runs in the simulation kit's view of the node's kernel, as on the
simulated nodes (gpusim's node.kernel_view_argv), with /proc/driver the test node's."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from test_mig_config import FIT_CASES

from ansible_collections.gpufleet.nvidia.plugins.filter import mig as mig_filters
from ansible_collections.gpufleet.nvidia.plugins.module_utils import mig_config, smi
from conftest import FIXTURES, NVIDIA_SMI, mock_nvml_library, nvml_env
from gpusim import node

DRIVER = node.InstalledDriver("535.261.03", "proprietary", "package:nvidia-kernel-dkms")

# A config in mig-parted's own format (`version: v1`, `mig-configs:`), as a site has it.
CONFIG = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-1g.5gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}],
        "all-balanced": [
            {
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
            }
        ],
        "too-many": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 8}}],
        "gpu0-1g.5gb": [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}],
    },
}


@pytest.fixture
def mig_node(sim_node, tmp_path, mig_parted, monkeypatch):
    """A booted node with a driver loaded; `.run(*args)` runs mig-parted on it."""
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: True)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    library = mock_nvml_library()

    def boot(profile: str) -> None:
        sim_node(profile, DRIVER)
        (node.RUN / "nvml" / "library-version").write_text(DRIVER.version + "\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = node.kernel_view_argv([str(mig_parted), *args], proc_driver=node.PROC_DRIVER)
        # mig-parted resets GPUs with nvidia-smi (`-r`), found on PATH as on a node.
        env = nvml_env(library)
        env["PATH"] = f"{NVIDIA_SMI.parent}:{env['PATH']}"
        with node.held_gpus_service() as held:
            return subprocess.run(
                command, capture_output=True, text=True, env={**env, **held}, check=False
            )

    def smi(*args: str) -> str:
        result = subprocess.run(
            [str(NVIDIA_SMI), *args],
            capture_output=True,
            text=True,
            env=nvml_env(library),
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    boot.run = run  # type: ignore[attr-defined]
    boot.smi = smi  # type: ignore[attr-defined]
    boot.config = config  # type: ignore[attr-defined]
    return boot


def current(mig_node) -> list[dict]:
    exported = mig_node.run("export")
    assert exported.returncode == 0, exported.stderr
    return yaml.safe_load(exported.stdout)["mig-configs"]["current"]


def test_mig_parted_applies_a_layout_and_asserts_it(mig_node):
    mig_node("a100-pcie-2")
    config = str(mig_node.config)
    # Byte for byte what mig-parted v0.10.0 exported on a real H200 with MIG disabled:
    # the layout a failed apply would put back.
    real = (FIXTURES / "mig-parted" / "h200-580.159.04.export.yaml").read_text()
    assert mig_node.run("export").stdout == real
    assert mig_node.run("assert", "-f", config, "-c", "all-balanced").returncode != 0

    applied = mig_node.run("apply", "-f", config, "-c", "all-balanced")
    assert applied.returncode == 0, applied.stderr
    assert mig_node.run("assert", "-f", config, "-c", "all-balanced").returncode == 0
    assert current(mig_node) == [
        {
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        }
    ]
    # What Debian's nvidia-smi lists is what mig-parted made.
    listed = [line.split()[1] for line in mig_node.smi("-L").splitlines() if "MIG" in line]
    assert sorted(listed) == sorted(["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"] * 2)

    # Another layout: the instances of the first are destroyed first.
    assert mig_node.run("apply", "-f", config, "-c", "all-1g.5gb").returncode == 0
    listed = [line.split()[1] for line in mig_node.smi("-L").splitlines() if "MIG" in line]
    assert listed == ["1g.5gb"] * 14

    assert mig_node.run("apply", "-f", config, "-c", "all-disabled").returncode == 0
    assert current(mig_node) == [{"devices": "all", "mig-enabled": False, "mig-devices": {}}]


def test_a_layout_change_that_fails_half_way_can_be_undone_from_its_export(mig_node, tmp_path):
    """What the MIG stage does when an apply fails: the layout exported before it
    (config `current`) applied again puts every GPU back, the one changed already too."""
    from gpusim import faults

    mig_node("a100-pcie-2")
    config = str(mig_node.config)
    assert mig_node.run("apply", "-f", config, "-c", "all-balanced").returncode == 0
    before = mig_node.run("export")
    (tmp_path / "before.yaml").write_text(before.stdout)

    faults.inject(node.profile(), "gi-create-error", 1)
    failed = mig_node.run("apply", "-f", config, "-c", "all-1g.5gb")
    assert failed.returncode != 0
    assert "Error creating GPU instance for '1g.5gb': ERROR_UNKNOWN" in failed.stderr
    assert current(mig_node) != yaml.safe_load(before.stdout)["mig-configs"]["current"]

    restored = mig_node.run("apply", "-f", str(tmp_path / "before.yaml"), "-c", "current")
    assert restored.returncode == 0, restored.stderr
    assert mig_node.run("assert", "-f", config, "-c", "all-balanced").returncode == 0


def test_a_held_gpu_keeps_its_mig_mode_change_pending(mig_node):
    """NVML makes a MIG mode change current only when nothing else holds the GPU; then
    mig-parted resets the GPUs, which fails while one is held. The mode stays pending
    until a reset or a reboot (what the MIG stage reports as reboot-required)."""
    mig_node("a100-pcie-2")
    with (node.DEV / "nvidia0").open("rb"):  # this test's process holds GPU 0
        applied = mig_node.run("apply", "-f", str(mig_node.config), "-c", "all-1g.5gb")
    assert applied.returncode != 0
    assert "error resetting all GPUs" in applied.stderr
    modes = mig_node.smi(
        "--query-gpu=index,mig.mode.current,mig.mode.pending", "--format=csv,noheader"
    )
    assert modes.splitlines() == ["0, Disabled, Enabled", "1, Enabled, Enabled"]
    # What gpu_facts reads (`-q -x`) and the MIG stage decides from it.
    gpus = smi.parse_query_xml(mig_node.smi("-q", "-x"))["gpus"]
    assert [(g["mig_mode"], g["mig_mode_pending"]) for g in gpus] == [(False, True), (True, True)]
    assert mig_filters.mig_reset_pending(gpus) == [0]


def test_a_layout_that_does_not_fit_the_gpu_fails(mig_node):
    mig_node("a100-pcie-2")
    config = str(mig_node.config)
    refused = mig_node.run("apply", "-f", config, "-c", "too-many")
    assert refused.returncode != 0
    assert mig_node.run("assert", "-f", config, "-c", "too-many").returncode != 0


def test_a_gpu_without_mig_is_skipped_under_all_and_refused_by_index(mig_node):
    """mig-parted's own rule: `devices: all` passes over GPUs without MIG (so a mixed
    node takes one layout); naming such a GPU is an error. The MIG stage's input check
    must therefore catch MIG asked of a non-MIG node itself."""
    mig_node("t4-1")
    config = str(mig_node.config)
    assert current(mig_node) == [{"devices": "all", "mig-enabled": False, "mig-devices": {}}]
    skipped = mig_node.run("apply", "-f", config, "-c", "all-1g.5gb")
    assert skipped.returncode == 0, skipped.stderr
    assert "MIG" not in mig_node.smi("-L")
    refused = mig_node.run("apply", "-f", config, "-c", "gpu0-1g.5gb")
    assert refused.returncode != 0
    assert "cannot set MIG mode on non MIG-capable GPU" in refused.stderr


@pytest.mark.parametrize(("counts", "fits"), FIT_CASES)
def test_mig_parted_agrees_with_our_fit_check(mig_node, tmp_path, counts, fits):
    """What mig_config.check predicts before any change is what mig-parted then does."""
    mig_node("a100-pcie-2")
    config = tmp_path / "layout.yaml"
    layout = {"devices": "all", "mig-enabled": True, "mig-devices": counts}
    config.write_text(yaml.safe_dump({"version": "v1", "mig-configs": {"it": [layout]}}))
    entries = mig_config.select(mig_config.parse_config(yaml.safe_load(config.read_text())), "it")
    gpus = [mig_config.Gpu(i, 0x20F1, True) for i in range(2)]
    assert (mig_config.check(entries, gpus).errors == ()) == fits
    applied = mig_node.run("apply", "-f", str(config), "-c", "it")
    assert (applied.returncode == 0) == fits, applied.stderr[-500:]

"""The simulation kit: profiles, the simulated nvidia-smi, and module state."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import discovery, pci
from ansible_collections.gpufleet.nvidia.plugins.module_utils import smi as smi_parse
from conftest import PROJECT
from gpusim import node, profiles, smi

PROFILE_DIR = PROJECT / "tests" / "sim" / "kit" / "profiles"
REQUIRED_PROFILES = {"h100-sxm-8", "a100-pcie-2", "t4-1", "a100-mig", "none"}


def _driver(version: str = "535.261.03") -> smi.DriverView:
    return smi.DriverView(version=version, cuda_version="12.2", persistence=True)


def test_every_required_profile_exists_and_loads():
    assert set(profiles.available(PROFILE_DIR)) >= REQUIRED_PROFILES
    for name in profiles.available(PROFILE_DIR):
        profiles.load(PROFILE_DIR, name, "node-a")


def test_h100_profile_is_an_hgx_board():
    prof = profiles.load(PROFILE_DIR, "h100-sxm-8", "node-a")
    assert len(prof.gpus) == 8 and len(prof.nvswitches) == 4
    assert {g.device_id for g in prof.gpus} == {0x2330}
    assert {s.device_id for s in prof.nvswitches} == {0x22A3}
    assert {g.numa_node for g in prof.gpus} == {0, 1}


def test_identities_are_stable_per_node_and_distinct_across_nodes():
    a1 = profiles.load(PROFILE_DIR, "t4-1", "node-a").gpus[0]
    a2 = profiles.load(PROFILE_DIR, "t4-1", "node-a").gpus[0]
    b = profiles.load(PROFILE_DIR, "t4-1", "node-b").gpus[0]
    assert a1.uuid == a2.uuid and a1.serial == a2.serial
    assert a1.uuid != b.uuid


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(profiles.ProfileError, match=r"unknown GPU profile 'h200'.*t4-1"):
        profiles.load(PROFILE_DIR, "h200", "node-a")


def test_without_a_loaded_driver_nvidia_smi_fails_like_the_real_one():
    prof = profiles.load(PROFILE_DIR, "t4-1", "n")
    out, _, rc = smi.run(["-L"], prof, None)
    assert rc == 9
    assert out.startswith(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    )


def test_list_gpus_shows_mig_devices():
    prof = profiles.load(PROFILE_DIR, "a100-mig", "n")
    out, _, rc = smi.run(["-L"], prof, _driver())
    lines = out.splitlines()
    assert rc == 0
    assert lines[0].startswith("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-")
    assert lines[1].startswith("  MIG 3g.20gb     Device  0: (UUID: MIG-")
    assert sum(1 for line in lines if "MIG 1g.5gb" in line) == 7


def test_csv_header_and_units_follow_the_format_options():
    prof = profiles.load(PROFILE_DIR, "t4-1", "n")
    out, _, rc = smi.run(["--query-gpu=name,memory.total", "--format=csv"], prof, _driver())
    assert rc == 0
    assert out.splitlines() == ["name, memory.total [MiB]", "Tesla T4, 15360 MiB"]
    out, _, _ = smi.run(
        ["--query-gpu=name,memory.total", "--format=csv,noheader,nounits"], prof, _driver()
    )
    assert out.splitlines() == ["Tesla T4, 15360"]


def test_unknown_field_is_rejected():
    prof = profiles.load(PROFILE_DIR, "t4-1", "n")
    out, _, rc = smi.run(["--query-gpu=name,bogus", "--format=csv"], prof, _driver())
    assert rc == 2 and 'Field "bogus" is not a valid field to query.' in out


def test_gpu_facts_parsers_read_the_simulated_outputs():
    """The simulated tool and the production parsers agree on the formats."""
    prof = profiles.load(PROFILE_DIR, "a100-mig", "n")
    out, _, _ = smi.run(smi_parse.query_args(), prof, _driver())
    rows = smi_parse.parse_query_csv(out)
    assert [r["mig.mode.current"] for r in rows] == [True, True]
    xml, _, _ = smi.run(["-q", "-x"], prof, _driver())
    facts = smi_parse.parse_query_xml(xml)
    assert [len(g["mig_devices"]) for g in facts["gpus"]] == [2, 7]
    assert facts["driver_version"] == "535.261.03"


@pytest.fixture
def sim_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A simulated node's state directories in tmp_path; nothing on the host is touched."""
    marker = tmp_path / "gpusim-node"
    marker.write_text("test\n")
    monkeypatch.setattr(node, "MARKER", marker)
    monkeypatch.setattr(node, "HOME", PROJECT / "tests" / "sim" / "kit")
    monkeypatch.setattr(node, "PROFILE_DIR", PROFILE_DIR)
    monkeypatch.setattr(node, "RUN", tmp_path / "run")
    monkeypatch.setattr(node, "SYS", tmp_path / "run" / "sys")
    monkeypatch.setattr(node, "DIVERTED", {str(tmp_path / "lib/nvidia-smi"): "nvidia-smi"})
    monkeypatch.setattr(
        node, "PREINSTALLED_BINARIES", {str(tmp_path / "bin/nvidia-smi"): "nvidia-smi"}
    )
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: False)
    monkeypatch.setattr(node, "_service_active", lambda unit: False)
    monkeypatch.setattr(node, "_write_profile_from_environment", lambda: None)
    monkeypatch.setenv("GPUSIM_NODE_NAME", "unit-node")

    def boot(profile: str, installed: node.InstalledDriver | None = None):
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / "profile").write_text(profile)
        monkeypatch.setattr(
            node,
            "installed_driver",
            lambda prof: (
                installed
                or (
                    node.InstalledDriver(
                        prof.preinstalled_driver, prof.preinstalled_module_type, "preinstalled"
                    )
                    if prof.preinstalled_driver
                    else None
                )
            ),
        )
        return node.boot()

    boot.tmp = tmp_path  # type: ignore[attr-defined]
    return boot


def test_boot_lays_out_a_pci_tree_that_gpu_facts_reads(sim_node):
    sim_node("h100-sxm-8")
    devices = pci.scan(str(node.SYS))
    assert len(pci.nvidia_gpus(devices)) == 8
    assert len(pci.nvswitches(devices)) == 4
    # A fresh node with GPUs and no blacklist: nouveau has claimed them.
    assert node.loaded("nouveau")
    assert {d.driver for d in pci.nvidia_gpus(devices)} == {"nouveau"}


def test_no_driver_package_means_module_not_found(sim_node):
    sim_node("t4-1")
    with pytest.raises(node.ModuleError, match="Module nvidia not found"):
        node.load_module("nvidia")


def test_nouveau_keeps_the_nvidia_module_from_binding(sim_node):
    sim_node("t4-1", node.InstalledDriver("535.261.03", "proprietary", "package:x"))
    with pytest.raises(node.ModuleError, match="No such device"):
        node.load_module("nvidia")


def test_preinstalled_driver_loads_at_boot_and_is_held_by_persistence(sim_node):
    sim_node("l4-1-preinstalled")
    assert node.loaded_driver() == {"version": "550.127.05", "module_type": "open"}
    taint = (node.SYS / "module" / "nvidia" / "taint").read_text().strip()
    assert discovery.module_type_from_taint(taint) == "open"
    assert (sim_node.tmp / "bin" / "nvidia-smi").is_symlink()
    (node.RUN / "persistence-mode").touch()
    with pytest.raises(node.ModuleError, match="in use"):
        node.unload_module("nvidia")
    (node.RUN / "persistence-mode").unlink()
    node.unload_module("nvidia")
    assert node.loaded_driver() is None


def test_drift_helper_changes_the_loaded_version(sim_node):
    sim_node("l4-1-preinstalled")
    node.set_loaded_version("550.54.15")
    assert node.loaded_driver()["version"] == "550.54.15"
    assert (node.SYS / "module" / "nvidia" / "version").read_text().strip() == "550.54.15"


def test_secure_boot_rejects_an_unsigned_module(sim_node, monkeypatch):
    original = profiles.load

    def with_secure_boot(*args):
        prof = original(*args)
        return profiles.Profile(**{**prof.__dict__, "secure_boot": True})

    monkeypatch.setattr(profiles, "load", with_secure_boot)
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: True)
    sim_node("t4-1", node.InstalledDriver("535.261.03", "proprietary", "package:x"))
    assert not node.loaded("nvidia")
    with pytest.raises(node.ModuleError, match="Key was rejected by service"):
        node.load_module("nvidia")


def test_kit_refuses_to_run_on_a_host_without_the_marker(tmp_path, monkeypatch):
    monkeypatch.setattr(node, "MARKER", tmp_path / "absent")
    with pytest.raises(node.NotASimulatedNode, match="refusing to run"):
        node.require_simulated_node()

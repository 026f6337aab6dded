# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node_state module: record what an apply left, probe the node for drift from it.

Most tests run the module's logic against a fake node (programs answered by `FakeNode`,
sysfs and files in tmp dirs); the last ones run the module through Ansible on this
host, with its real dpkg-query.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_health as gh
from ansible_collections.gpufleet.nvidia.plugins.module_utils import node_state as ns
from conftest import run_local_module
from runner.words import drift_summary

T4 = "0000:3b:00.0"
A100 = "0000:af:00.0"
# A healthy GPU's health fields as a real H200 (driver 580.159.04) printed them with
# nounits (fixtures/nvidia-smi/h200-580.159.04.health.csv).
HEALTHY = {
    "ecc.errors.uncorrected.volatile.total": "0",
    "retired_pages.pending": "[N/A]",
    "clocks_throttle_reasons.active": "0x0000000000000001",
    "pcie.link.gen.current": "5",
    "pcie.link.gen.max": "5",
    "pcie.link.width.current": "16",
    "pcie.link.width.max": "16",
    "remapped_rows.pending": "No",
    "remapped_rows.failure": "No",
    "gpu_recovery_action": "None",
}


class FakeNode:
    """Answers dpkg-query, rpm, systemctl and nvidia-smi the way the real ones do."""

    def __init__(self, sysfs: Path, manager: str = "dpkg") -> None:
        self.sysfs = sysfs
        self.manager = manager
        # name -> (version, dpkg status abbreviation: "ii" installed, "hi" held)
        self.packages: dict[str, tuple[str, str]] = {}
        # unit -> (UnitFileState, ActiveState)
        self.services: dict[str, tuple[str, str]] = {}
        # unit -> the ActiveStates its next reads give, before its state above
        self.passing: dict[str, list[str]] = {}
        self.slept: list[float] = []
        # PCI bus id -> MIG mode as nvidia-smi prints it
        self.gpus: dict[str, str] = {}
        # PCI bus id -> profiles of its MIG devices as `nvidia-smi -L` lists them
        self.mig_devices: dict[str, list[str]] = {}
        self.smi_rc = 0
        # False: the driver's --query-gpu lacks gpu_health.NEWER_FIELDS (as 535's does).
        self.newer_fields = True
        # PCI bus id -> health fields that differ from HEALTHY
        self.health: dict[str, dict[str, str]] = {}
        # PCI bus id -> nvidia-smi's words for a GPU it cannot open
        self.lost: dict[str, str] = {}
        self.calls: list[list[str]] = []

    def load_driver(self, version: str, taint: str = "P") -> None:
        module = self.sysfs / "module" / "nvidia"
        module.mkdir(parents=True, exist_ok=True)
        (module / "version").write_text(version + "\n")
        (module / "taint").write_text(taint + "\n")

    def which(self, name: str) -> str | None:
        available = {"systemctl", "nvidia-smi", "dpkg-query" if self.manager == "dpkg" else "rpm"}
        return f"/usr/bin/{name}" if name in available else None

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        program = os.path.basename(argv[0])
        if program == "dpkg-query":
            assert argv[1:3] == ["-W", "-f=" + ns.DPKG_QUERY_FORMAT]
            out = [
                f"{name}|{self.packages[name][0]}|{self.packages[name][1]} "
                for name in argv[3:]
                if name in self.packages
            ]
            missing = [name for name in argv[3:] if name not in self.packages]
            err = "".join(f"dpkg-query: no packages found matching {n}\n" for n in missing)
            return (1 if missing else 0), "\n".join(out) + "\n", err
        if program == "rpm":
            lines = [
                f"{name}|{self.packages[name][0]}"
                if name in self.packages
                else f"package {name} is not installed"
                for name in argv[4:]
            ]
            return 0, "\n".join(lines) + "\n", ""
        if program == "systemctl":
            assert argv[1:3] == ["show", "-p"]
            blocks = []
            for unit in argv[4:]:
                file_state, active = self.services.get(unit, ("", "inactive"))
                if self.passing.get(unit):
                    active = self.passing[unit].pop(0)
                # systemd prints properties in its own order, not the order asked.
                blocks.append(f"ActiveState={active}\nUnitFileState={file_state}\nId={unit}\n")
            return 0, "\n".join(blocks), ""
        if program == "nvidia-smi":
            if self.smi_rc:
                return self.smi_rc, "", "NVIDIA-SMI has failed"
            if argv[1:] == ["-L"]:
                lines = []
                for number, bus in enumerate(self.gpus):
                    lines.append(f"GPU {number}: NVIDIA Tesla (UUID: GPU-{bus})")
                    lines += [
                        f"  MIG {profile:<13} Device {i:>2}: (UUID: MIG-{bus}-{i})"
                        for i, profile in enumerate(self.mig_devices.get(bus, []))
                    ]
                return 0, "\n".join(lines) + "\n", ""
            return self.query(argv[1])
        raise AssertionError(f"unexpected program {argv}")

    def query(self, argument: str) -> tuple[int, str, str]:
        """nvidia-smi --query-gpu or --query-remapped-rows, nounits, no header."""
        kind, _, names = argument.partition("=")
        fields = names.split(",")
        if kind == "--query-remapped-rows":
            fields = ["pci.bus_id" if f == "gpu_bus_id" else f for f in fields]
        else:
            assert kind == "--query-gpu" and fields[:4] == [
                "pci.bus_id",
                "uuid",
                "serial",
                "mig.mode.current",
            ]
        refused = [f for f in fields if f in gh.NEWER_FIELDS and not self.newer_fields]
        if kind == "--query-gpu" and refused:
            return 2, f'Field "{refused[0]}" is not a valid field to query.\n\n', ""
        lines = []
        for bus, mig in self.gpus.items():
            pci_bus_id = f"00000000:{bus[5:].upper()}"
            if bus in self.lost:
                lines.append(
                    f"Unable to determine the device handle for GPU {pci_bus_id}: {self.lost[bus]}"
                )
                continue
            values = {
                "pci.bus_id": pci_bus_id,
                "uuid": f"GPU-{bus}",
                "serial": f"1324{int(bus[5:7], 16):04d}",
                "mig.mode.current": mig,
            }
            values |= HEALTHY | self.health.get(bus, {})
            lines.append(", ".join(values[f] for f in fields))
        return (15 if self.lost else 0), "\n".join(lines) + "\n", ""

    def reader(self, **kwargs) -> ns.Reader:
        return ns.Reader(self.run, self.which, str(self.sysfs), sleep=self.slept.append, **kwargs)


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    fake = FakeNode(tmp_path / "sys")
    fake.load_driver("535.309.01")
    fake.gpus = {T4: "[N/A]", A100: "Disabled"}
    fake.packages = {
        "nvidia-container-toolkit": ("1.17.8-1", "hi"),
        "containerd": ("1.6.20~ds1-1+b1", "ii"),
    }
    fake.services = {
        "containerd": ("enabled", "active"),
        "nvidia-cdi-refresh.path": ("enabled", "active"),
    }
    return fake


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "etc" / "containerd" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n')
    path.chmod(0o644)
    return path


@pytest.fixture
def components(tmp_path: Path, config: Path) -> dict:
    spec = tmp_path / "etc" / "cdi" / "nvidia.yaml"
    spec.parent.mkdir(parents=True)
    spec.write_text("cdiVersion: 0.5.0\n")
    return ns.normalize_components(
        {
            "toolkit": {
                "files": [str(spec)],
                "packages": ["nvidia-container-toolkit"],
                "services": ["nvidia-cdi-refresh.path"],
            },
            "runtime_config": {
                "files": [str(config)],
                "packages": ["containerd"],
                "services": ["containerd"],
            },
        }
    )


def record_then_probe(node: FakeNode, components: dict, change=None) -> dict:
    """Record, apply `change` to the node, probe: the drift."""
    text = ns.render(ns.current_record(node.reader(), components))
    if change:
        change()
    recorded = ns.load(text.encode())
    return ns.compare(recorded, ns.current_record(node.reader(), ns.components_of(recorded)))


def test_record_then_probe_finds_no_drift_with_one_call_per_program(node, components):
    assert record_then_probe(node, components) == {}
    probe_calls = [os.path.basename(c[0]) for c in node.calls[len(node.calls) // 2 :]]
    assert sorted(probe_calls) == ["dpkg-query", "nvidia-smi", "systemctl"]


def test_the_record_holds_what_the_probe_compares(node, components, config):
    record = ns.current_record(node.reader(), components)
    runtime = record["components"]["runtime_config"]
    assert runtime["files"][str(config)]["mode"] == "0644"
    assert len(runtime["files"][str(config)]["sha256"]) == 64
    assert runtime["packages"] == {"containerd": {"version": "1.6.20~ds1-1+b1", "held": False}}
    assert runtime["services"] == {
        "containerd": {"unit_file_state": "enabled", "active_state": "active"}
    }
    assert record["components"]["toolkit"]["packages"]["nvidia-container-toolkit"]["held"]
    assert record["node"] == {
        "driver": {"version": "535.309.01", "module_type": "proprietary"},
        "mig": {T4: None, A100: False},
        "mig_devices": {},
    }


def test_an_unchanged_node_gives_the_same_bytes(node, components):
    first = ns.render(ns.current_record(node.reader(), components))
    # The same items listed in another order and twice.
    shuffled = {
        name: {kind: list(reversed(items[kind])) * 2 for kind in ns.KINDS}
        for name, items in reversed(list(components.items()))
    }
    second = ns.render(ns.current_record(node.reader(), ns.normalize_components(shuffled)))
    assert first == second
    assert ns.digest(first) == ns.digest(second.encode())


def test_changed_content_and_mode_of_a_file_are_drift(node, components, config):
    drift = record_then_probe(
        node, components, lambda: config.write_text(config.read_text() + "# x\n")
    )
    (entry,) = drift["runtime_config"]
    assert (entry["kind"], entry["name"]) == ("file", str(config))
    assert entry["recorded"]["sha256"] != entry["current"]["sha256"]
    assert list(drift) == ["runtime_config"]

    drift = record_then_probe(node, components, lambda: config.chmod(0o666))
    (entry,) = drift["runtime_config"]
    assert (entry["recorded"]["mode"], entry["current"]["mode"]) == ("0644", "0666")


def test_a_removed_file_is_drift(node, components, config):
    before = ns.file_state(str(config))
    drift = record_then_probe(node, components, config.unlink)
    assert drift == {
        "runtime_config": [
            {"kind": "file", "name": str(config), "recorded": before, "current": None}
        ]
    }


def test_package_version_change_and_unhold_are_drift(node, components):
    def upgrade_and_unhold():
        node.packages["containerd"] = ("1.6.20~ds1-1+b2", "ii")
        node.packages["nvidia-container-toolkit"] = ("1.17.8-1", "ii")

    drift = record_then_probe(node, components, upgrade_and_unhold)
    assert drift["runtime_config"] == [
        {
            "kind": "package",
            "name": "containerd",
            "recorded": {"version": "1.6.20~ds1-1+b1", "held": False},
            "current": {"version": "1.6.20~ds1-1+b2", "held": False},
        }
    ]
    assert drift["toolkit"] == [
        {
            "kind": "package",
            "name": "nvidia-container-toolkit",
            "recorded": {"version": "1.17.8-1", "held": True},
            "current": {"version": "1.17.8-1", "held": False},
        }
    ]


def test_a_package_a_failed_run_left_half_configured_is_drift_said_so(node, components):
    """A driver change killed mid-way: the new module package unpacked, not configured."""
    node.packages["nvidia-kernel-dkms"] = ("535.261.03-1", "hi")
    components = {
        **components,
        **ns.normalize_components({"driver": {"packages": ["nvidia-kernel-dkms"]}}),
    }

    def interrupted():
        node.packages["nvidia-kernel-dkms"] = ("535.309.01-0+deb12u1", "hF")

    drift = record_then_probe(node, components, interrupted)
    assert drift["driver"] == [
        {
            "kind": "package",
            "name": "nvidia-kernel-dkms",
            "recorded": {"version": "535.261.03-1", "held": True},
            "current": {
                "version": "535.309.01-0+deb12u1",
                "held": True,
                "state": "half-configured",
            },
        }
    ]
    assert drift_summary(drift["driver"][0]) == (
        "package nvidia-kernel-dkms: state None -> half-configured, "
        "version 535.261.03-1 -> 535.309.01-0+deb12u1"
    )


def test_a_removed_package_is_drift(node, components):
    drift = record_then_probe(node, components, lambda: node.packages.pop("containerd"))
    assert drift["runtime_config"][0]["current"] is None


def test_a_stopped_or_disabled_service_is_drift(node, components):
    def stop_and_disable():
        node.services["containerd"] = ("enabled", "inactive")
        node.services["nvidia-cdi-refresh.path"] = ("disabled", "active")

    drift = record_then_probe(node, components, stop_and_disable)
    assert drift["runtime_config"][0]["current"] == {
        "unit_file_state": "enabled",
        "active_state": "inactive",
    }
    assert drift["toolkit"][0]["current"] == {
        "unit_file_state": "disabled",
        "active_state": "active",
    }


def test_a_service_still_starting_is_read_again_until_it_settles(node, components):
    """A node probed just after it booted: containerd still starting, then up. Only the
    unit on its way is asked again, once a second, and no drift is found."""
    node.passing["containerd"] = ["activating", "activating"]
    assert record_then_probe(node, components) == {}
    assert node.slept == [1, 1]
    asked = [c[4:] for c in node.calls if os.path.basename(c[0]) == "systemctl"]
    assert asked[:3] == [["containerd", "nvidia-cdi-refresh.path"], ["containerd"], ["containerd"]]


def test_a_service_that_keeps_restarting_is_drift_once_the_wait_is_over(node, components):
    def crash_loop():
        node.passing["containerd"] = ["activating"] * 100  # auto-restart, again and again

    drift = record_then_probe(node, components, crash_loop)
    assert drift["runtime_config"][0]["current"] == {
        "unit_file_state": "enabled",
        "active_state": "activating",
    }
    assert node.slept == [1] * ns.SETTLE_SECONDS


def test_a_driver_version_change_is_drift_of_the_driver(node, components):
    drift = record_then_probe(node, components, lambda: node.load_driver("535.261.03"))
    assert drift == {
        "driver": [
            {
                "kind": "driver",
                "name": "nvidia",
                "recorded": {"version": "535.309.01", "module_type": "proprietary"},
                "current": {"version": "535.261.03", "module_type": "proprietary"},
            }
        ]
    }


def test_an_unloaded_driver_is_drift_and_nvidia_smi_is_not_asked(node, components):
    def unload():
        for name in ("version", "taint"):
            (node.sysfs / "module" / "nvidia" / name).unlink()
        (node.sysfs / "module" / "nvidia").rmdir()
        node.calls.clear()

    drift = record_then_probe(node, components, unload)
    assert "nvidia-smi" not in [os.path.basename(c[0]) for c in node.calls]
    assert drift["driver"] == [
        {
            "kind": "driver",
            "name": "nvidia",
            "recorded": {"version": "535.309.01", "module_type": "proprietary"},
            "current": {"version": None, "module_type": None},
        }
    ]
    kinds = [(e["kind"], e["name"], e["current"]) for e in drift["mig"]]
    assert kinds == [("mig", T4, None), ("mig", A100, None), ("mig-devices", "all", None)]


def test_a_mig_mode_change_is_drift_of_that_gpu(node, components):
    drift = record_then_probe(node, components, lambda: node.gpus.update({A100: "Enabled"}))
    assert drift == {
        "mig": [
            {"kind": "mig", "name": A100, "recorded": False, "current": True},
            {"kind": "mig-devices", "name": A100, "recorded": None, "current": []},
        ]
    }


def test_mig_devices_destroyed_by_hand_are_drift_of_that_gpu(node, components):
    node.gpus[A100] = "Enabled"
    node.mig_devices[A100] = ["3g.20gb", "1g.5gb", "1g.5gb", "2g.10gb"]
    drift = record_then_probe(node, components, lambda: node.mig_devices[A100].pop(1))
    assert drift == {
        "mig": [
            {
                "kind": "mig-devices",
                "name": A100,
                "recorded": ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"],
                "current": ["1g.5gb", "2g.10gb", "3g.20gb"],
            }
        ]
    }


def test_nvidia_smi_lists_devices_only_when_a_gpu_has_mig_on(node, components):
    ns.current_record(node.reader(), components)
    assert ["-L"] not in [c[1:] for c in node.calls]
    node.gpus[A100] = "Enabled"
    record = ns.current_record(node.reader(), components)
    assert record["node"]["mig_devices"] == {A100: []}
    assert node.calls[-1][1:] == ["-L"]


def test_a_record_without_mig_devices_is_not_drift_for_them(node, components):
    recorded = ns.current_record(node.reader(), components)
    del recorded["node"]["mig_devices"]
    node.gpus[A100] = "Enabled"
    node.mig_devices[A100] = ["7g.40gb"]
    drift = ns.compare(recorded, ns.current_record(node.reader(), components))
    assert [e["kind"] for e in drift["mig"]] == ["mig"]


def test_a_failing_nvidia_smi_is_drift_and_a_warning(node, components):
    reader = node.reader()
    recorded = ns.current_record(reader, components)
    node.smi_rc = 9
    reader = node.reader()
    drift = ns.compare(recorded, ns.current_record(reader, components))
    assert [e["current"] for e in drift["mig"]] == [None, None, None]
    assert reader.warnings == ["nvidia-smi exited 9: NVIDIA-SMI has failed"]


def test_a_node_without_gpus_records_its_node_part_only(tmp_path):
    bare = FakeNode(tmp_path / "sys")
    record = ns.current_record(bare.reader(), ns.normalize_components({}))
    assert record == {
        "schema": 1,
        "components": {},
        "node": {
            "driver": {"version": None, "module_type": None},
            "mig": None,
            "mig_devices": None,
        },
    }
    assert bare.calls == []


def test_rpm_nodes_read_versions_and_versionlocks(tmp_path):
    rpm_node = FakeNode(tmp_path / "sys", manager="rpm")
    rpm_node.packages = {"nvidia-driver": ("3:535.161.08-1.el9", ""), "kmod-x": ("1-1", "")}
    locks = tmp_path / "versionlock.list"
    locks.write_text("# added by dnf\nnvidia-driver-3:535.161.08-1.el9.*\n!kmod-x-0:1-1.*\n")
    reader = rpm_node.reader(versionlock_lists=(str(locks),))
    assert reader.packages(["kmod-x", "missing", "nvidia-driver"]) == {
        "kmod-x": {"version": "1-1", "held": False},
        "missing": None,
        "nvidia-driver": {"version": "3:535.161.08-1.el9", "held": True},
    }


def test_real_dpkg_query_of_this_host_reads_installed_and_missing_packages():
    def run(argv):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr

    def which(name):
        from shutil import which as find

        return find(name)

    if not which("dpkg-query"):
        pytest.skip("this test reads the Debian package database: no dpkg-query here")
    found = ns.Reader(run, which).packages(["dpkg", "gpufleet-no-such-package"])
    assert found["gpufleet-no-such-package"] is None
    assert found["dpkg"]["version"][0].isdigit()
    assert found["dpkg"]["held"] is False


@pytest.mark.parametrize(
    ("components", "message"),
    [
        ({"x": {"files": ["etc/relative"]}}, "components.x.files: 'etc/relative' is not"),
        ({"x": {"packages": ["nvidia-*"]}}, "no versions or globs"),
        ({"x": {"packages": ["containerd=1.6"]}}, "no versions or globs"),
        ({"x": {"services": "containerd"}}, "components.x.services: expected a list"),
        ({"x": {"units": []}}, "unknown key(s) units"),
        ({"": {}}, "is not a component name"),
    ],
)
def test_bad_components_are_refused_naming_the_item(components, message):
    with pytest.raises(ns.NodeStateError) as caught:
        ns.normalize_components(components)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{not json", "corrupt: not JSON"),
        (b"[]", "corrupt: not a JSON object"),
        (b'{"schema": 2, "components": {}, "node": {}}', "other schema: 2"),
        (b'{"schema": 1, "components": []}', "corrupt: no components or node section"),
        (b'{"schema": 1, "components": {"x": {"files": {"rel": null}}}, "node": {}}', "corrupt"),
    ],
)
def test_an_unusable_record_says_why(data, reason):
    with pytest.raises(ns.RecordError) as caught:
        ns.load(data)
    assert str(caught.value).startswith(reason)


# --- through Ansible, on this host ---------------------------------------------------


def run_module(args: dict, *flags: str) -> dict:
    return run_local_module("gpufleet.nvidia.node_state", args, *flags)


def test_check_mode_then_record_then_again_then_probe(tmp_path, config):
    path = tmp_path / "state" / "applied.json"
    args = {
        "state": "record",
        "path": str(path),
        "sysfs_root": str(tmp_path / "sys"),
        "components": {
            "runtime_config": {"files": [str(config)], "packages": ["dpkg"]},
        },
    }

    predicted = run_module(args, "--check", "--diff")
    assert predicted["changed"] is True
    assert not path.parent.exists()
    assert '"schema": 1' in predicted["diff"]["after"]

    written = run_module(args)
    assert written["changed"] is True
    assert written["digest"] == predicted["digest"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    content = path.read_bytes()
    assert json.loads(content)["components"]["runtime_config"]["packages"]["dpkg"]["version"]
    assert [p.name for p in path.parent.iterdir()] == ["applied.json"]  # no temp file left

    again = run_module(args)
    assert again["changed"] is False
    assert again["digest"] == written["digest"]
    assert path.read_bytes() == content
    assert run_module(args, "--check")["changed"] is False

    probed = run_module({"path": str(path), "sysfs_root": str(tmp_path / "sys")})
    assert probed["changed"] is False
    assert (probed["recorded"], probed["drifted"], probed["drift"]) == (True, False, {})
    assert probed["reason"] == ""
    assert probed["digest"] == written["digest"]

    config.write_text("version = 3\n")
    drifted = run_module({"path": str(path), "sysfs_root": str(tmp_path / "sys")})
    assert drifted["drifted"] is True
    assert [(e["kind"], e["name"]) for e in drifted["drift"]["runtime_config"]] == [
        ("file", str(config))
    ]

    rewritten = run_module(args)
    assert rewritten["changed"] is True
    assert rewritten["digest"] != written["digest"]


def test_probe_without_a_usable_record_says_why(tmp_path):
    path = tmp_path / "applied.json"
    missing = run_module({"path": str(path)})
    assert (missing["recorded"], missing["drifted"], missing["digest"]) == (False, True, None)
    assert missing["reason"] == f"no record at {path}"

    path.write_text('{"schema": 1, "components": {')
    corrupt = run_module({"path": str(path)})
    assert corrupt["recorded"] is False
    assert corrupt["reason"].startswith(f"record at {path} corrupt: not JSON")
    assert corrupt["digest"] == ns.digest(path.read_bytes())
    assert corrupt["changed"] is False


def test_record_needs_valid_components(tmp_path):
    path = tmp_path / "applied.json"
    missing = run_module({"state": "record", "path": str(path)})
    assert missing["failed"] is True
    assert "components" in missing["msg"]
    bad = run_module(
        {"state": "record", "path": str(path), "components": {"x": {"packages": ["a b"]}}}
    )
    assert bad["failed"] is True
    assert "components.x.packages: 'a b' is not a package name" in bad["msg"]
    assert not path.exists()


# --- health, read with the probe's own nvidia-smi call ------------------------------

XID_LOG = (
    "6,1201,5000000,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04\n"
    "4,1302,81000000,-;NVRM: Xid (PCI:0000:af:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.\n"
    " SUBSYSTEM=pci\n"
    " DEVICE=+pci:0000:af:00.0\n"
)


def test_health_comes_with_the_probes_one_nvidia_smi_call(node, components, tmp_path):
    reader = node.reader()
    ns.current_record(reader, components)
    log = tmp_path / "kmsg"
    log.write_text("6,1201,5000000,-;NVRM: loading NVIDIA UNIX Open Kernel Module\n")
    health = reader.health(kernel_log=str(log))
    assert [os.path.basename(c[0]) for c in node.calls].count("nvidia-smi") == 1
    assert health["action"] == "none"
    assert health["gpus"] == {
        T4: {"action": "none", "signals": [], "uuid": f"GPU-{T4}", "serial": "13240059"},
        A100: {"action": "none", "signals": [], "uuid": f"GPU-{A100}", "serial": "13240175"},
    }
    assert health["xid_events"] == []


def test_a_driver_without_the_newer_fields_reads_remapped_rows_on_their_own(node, components):
    node.newer_fields = False
    node.health = {A100: {"remapped_rows.failure": "Yes"}}
    health = node.reader().health(kernel_log="/nonexistent/kmsg")
    asked = [c[1].partition("=")[0] for c in node.calls]
    assert asked == ["--query-gpu", "--query-gpu", "--query-remapped-rows"]
    assert health["gpus"][A100]["action"] == "replace"
    assert [s["kind"] for s in health["gpus"][A100]["signals"]] == ["remap-failure"]
    assert health["xid_events"] is None
    assert health["kernel_log_error"].startswith("cannot read /nonexistent/kmsg")


def test_a_failing_gpu_is_named_with_what_it_asks_for_and_is_not_drift(node, components, tmp_path):
    recorded = ns.current_record(node.reader(), components)
    node.health = {
        T4: {
            "clocks_throttle_reasons.active": "0x0000000000000048",
            "pcie.link.width.current": "8",
        },
        A100: {"remapped_rows.pending": "Yes", "ecc.errors.uncorrected.volatile.total": "2"},
    }
    reader = node.reader()
    assert ns.compare(recorded, ns.current_record(reader, components)) == {}
    log = tmp_path / "kmsg"
    log.write_text(XID_LOG)
    health = reader.health({"pcie-width": "none"}, kernel_log=str(log))
    assert health["action"] == "reset"
    t4 = health["gpus"][T4]
    assert [(s["kind"], s["action"]) for s in t4["signals"]] == [
        ("hw-slowdown", "watch"),
        ("hw-thermal-slowdown", "watch"),
        ("pcie-width", "none"),  # the site's override
    ]
    assert t4["action"] == "watch"
    # Who the GPU is goes with its health: the evidence a vendor asks for.
    assert (t4["uuid"], t4["serial"]) == (f"GPU-{T4}", "13240059")
    a100 = health["gpus"][A100]["signals"]
    assert [(s["kind"], s["action"]) for s in a100] == [
        ("ecc-dbe", "watch"),
        ("remap-pending", "reset"),
    ]
    assert a100[0]["detail"].endswith(": 2 since the driver loaded")
    [event] = health["xid_events"]
    assert (event["seq"], event["pci_address"], event["xid"], event["action"]) == (
        1302,
        A100,
        79,
        "reboot",
    )
    assert event["message"] == "GPU has fallen off the bus."


def test_a_gpu_nvidia_smi_cannot_open_is_lost_and_the_others_still_read(node, components):
    recorded = ns.current_record(node.reader(), components)
    node.lost = {A100: "GPU is lost.  Reboot the system to recover this GPU"}
    reader = node.reader()
    drift = ns.compare(recorded, ns.current_record(reader, components))
    assert [(e["name"], e["current"]) for e in drift["mig"]] == [(A100, None)]
    health = reader.health(kernel_log="/nonexistent/kmsg")
    assert health["gpus"][T4] == {
        "action": "none",
        "signals": [],
        "uuid": f"GPU-{T4}",
        "serial": "13240059",
    }
    [lost] = health["gpus"][A100]["signals"]
    assert (lost["kind"], lost["action"]) == ("lost", "reboot")
    assert lost["detail"].endswith(
        "nvidia-smi: GPU is lost.  Reboot the system to recover this GPU"
    )
    assert health["action"] == "reboot"


def test_an_unloaded_driver_gives_no_gpu_health_and_asks_nothing(node, components):
    (node.sysfs / "module" / "nvidia" / "version").unlink()
    health = node.reader().health(kernel_log="/nonexistent/kmsg")
    assert (health["gpus"], health["action"]) == (None, "none")
    assert node.calls == []


def test_the_probe_module_reports_health_and_refuses_a_bad_override(tmp_path):
    probed = run_module({"path": str(tmp_path / "applied.json"), "sysfs_root": str(tmp_path)})
    assert probed["recorded"] is False
    assert probed["health"]["gpus"] is None  # no nvidia module in this sysfs
    bad = run_module(
        {"path": str(tmp_path / "applied.json"), "health_actions": {"xid:79": "panic"}}
    )
    assert bad["failed"] is True
    assert "health_actions (gpu_health_actions): 'xid:79': 'panic' is not one of" in bad["msg"]

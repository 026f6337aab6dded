# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Make the collection, the simulation kit and the fleet tool importable in unit tests."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
for path in (PROJECT / "collections", PROJECT / "tests" / "sim" / "kit", PROJECT / "tests" / "sim"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

FIXTURES = Path(__file__).parent / "fixtures"
PROFILE_DIR = PROJECT / "tests" / "sim" / "kit" / "profiles"


def _node_state(root: Path) -> dict[str, object]:
    """The kit's paths for a simulated node whose state lives under `root`."""
    return {
        "MARKER": root / "gpusim-node",
        "HOME": PROJECT / "tests" / "sim" / "kit",
        "PROFILE_DIR": PROFILE_DIR,
        "RUN": root / "run",
        "SYS": root / "run" / "sys",
        "STATE": root / "state",
        "PROC_DRIVER": root / "proc" / "driver",
        "DEV": root / "dev",
        "FIRMWARE": root / "lib" / "firmware" / "nvidia",
        "LIBNVML_LINK": str(root / "lib/libnvidia-ml.so.1"),
        "DIVERTED": {str(root / "lib/libnvidia-ml.so.1"): "lib/libnvidia-ml.so.1"},
        "PREINSTALLED_FILES": {str(root / "bin/nvidia-smi"): "preinstalled/nvidia-smi"},
        "_write_profile_from_environment": lambda: None,
    }


def _lay_gsp_firmware(version: str) -> None:
    """What Debian's firmware-nvidia-gsp of `version` installs (empty files here)."""
    from gpusim import node

    gsp = node.FIRMWARE / version
    gsp.mkdir(parents=True, exist_ok=True)
    (gsp / "gsp_ga10x.bin").write_bytes(b"")


def _installed(driver):
    """installed_driver() for a node with `driver` (else its profile's pre-installed one)."""
    from gpusim import node

    def installed_driver(prof):
        if driver:
            return driver
        if prof.preinstalled_driver:
            return node.InstalledDriver(
                prof.preinstalled_driver, prof.preinstalled_module_type, "preinstalled"
            )
        return None

    return installed_driver


@pytest.fixture
def sim_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A simulated node's state directories in tmp_path; nothing on the host is touched.

    Call it with a profile name (and the driver installed, if any) to boot the node.
    """
    from gpusim import node

    for name, value in _node_state(tmp_path).items():
        monkeypatch.setattr(node, name, value)
    (tmp_path / "gpusim-node").write_text("test\n")
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: False)
    monkeypatch.setenv("GPUSIM_NODE_NAME", "unit-node")

    def boot(profile: str, installed: node.InstalledDriver | None = None, firmware: bool = True):
        (tmp_path / "run").mkdir(exist_ok=True)
        if installed and firmware:
            _lay_gsp_firmware(installed.version)
        (tmp_path / "run" / "profile").write_text(profile)
        monkeypatch.setattr(node, "installed_driver", _installed(installed))
        return node.boot()

    boot.tmp = tmp_path  # type: ignore[attr-defined]
    return boot


NVIDIA_SMI = PROJECT / ".cache" / "consumers" / "usr" / "lib" / "nvidia" / "current" / "nvidia-smi"
# Debian 13's build (550), which asks NVML for more than 535's does.
NVIDIA_SMI_550 = PROJECT / ".cache" / "consumers" / "trixie" / "usr" / "lib" / "nvidia" / "current"
NVIDIA_SMI_550 /= "nvidia-smi"


def mock_nvml_library() -> Path:
    """The mock NVML, built (or found in its cache) by tests/sim/nvml/build.sh."""
    import subprocess

    built = subprocess.run(
        ["bash", str(PROJECT / "tests" / "sim" / "nvml" / "build.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return Path(built.stdout.strip())


def nvml_env(library: Path) -> dict[str, str]:
    """The environment of an NVML program on the booted test node: the mock library and
    the node's state directories (as the kit has them)."""
    import os

    from gpusim import node

    # The kit's own command, which the mock runs for what a GPU reset clears.
    kit = node.RUN.parent / "gpusim-kit"
    if not kit.exists():
        kit.parent.mkdir(parents=True, exist_ok=True)
        path = str(PROJECT / "tests" / "sim" / "kit")
        kit.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {path!r})\n"
            "from gpusim.cli import main\nsys.exit(main())\n"
        )
        kit.chmod(0o755)
    return dict(
        os.environ,
        LD_LIBRARY_PATH=str(library.parent),
        GPUSIM_KIT=str(kit),
        GPUSIM_MARKER=str(node.MARKER),
        GPUSIM_RUN=str(node.RUN),
        GPUSIM_STATE=str(node.STATE),
        GPUSIM_PROC_DRIVER=str(node.PROC_DRIVER),
        GPUSIM_DEV=str(node.DEV),
    )


def real_smi_outputs(profile: str, node_name: str, driver_version: str = "535.261.03"):
    """What Debian's nvidia-smi prints for gpu_facts on a booted node of `profile`.

    Returns (query CSV, `-q -x` XML, `-L` list), all from the real binary on the mock NVML.
    """
    import os
    import subprocess
    import tempfile
    from unittest import mock

    from gpusim import node

    assert NVIDIA_SMI.is_file(), "run tests/tools/consumers.sh (make unit does)"
    from ansible_collections.gpufleet.nvidia.plugins.module_utils import smi

    library = mock_nvml_library()
    driver = node.InstalledDriver(driver_version, "proprietary", "package:nvidia-kernel-dkms")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "gpusim-node").write_text("test\n")
        (root / "run").mkdir()
        (root / "run" / "profile").write_text(profile)
        patches = {
            **_node_state(root),
            "installed_driver": _installed(driver),
            "nouveau_blacklisted": lambda: True,
        }
        with (
            mock.patch.multiple(node, **patches),
            mock.patch.dict(os.environ, {"GPUSIM_NODE_NAME": node_name}),
        ):
            _lay_gsp_firmware(driver_version)
            node.boot()
            (root / "run" / "nvml" / "library-version").write_text(driver_version + "\n")
            env = nvml_env(library)
        outputs = []
        for args in (smi.query_args(), ["-q", "-x"], ["-L"]):
            result = subprocess.run(
                [str(NVIDIA_SMI), *args], capture_output=True, text=True, env=env, check=False
            )
            assert result.returncode == 0, result.stdout + result.stderr
            outputs.append(result.stdout)
    return outputs[0], outputs[1], outputs[2]


def run_ansible(command: str, *args: str) -> tuple[int, dict]:
    """Run `ansible` or `ansible-playbook` of this venv with the project's config.

    Returns the exit code and the JSON report (ansible.posix.json callback).
    """
    import json
    import os
    import subprocess

    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_NOCOLOR="1",
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / command), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT,
        check=False,
    )
    return result.returncode, json.loads(result.stdout)


def local_inventory(path: Path, *hosts: str) -> Path:
    """An inventory at `path` whose `hosts` are this machine (local connection, this
    Python), for a real ansible-playbook run of a small test playbook."""
    path.write_text(
        "all:\n  hosts:\n"
        + "".join(
            f"    {host}:\n      ansible_connection: local\n"
            f"      ansible_python_interpreter: {sys.executable}\n"
            for host in hosts
        )
    )
    return path


def run_site_playbook(site: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """ansible-playbook -i hosts.yml play.yml in `site`, as a site runs it: none of this
    process's ANSIBLE_ or GPUFLEET_ settings, gpufleet's ansible.cfg, and `env` on top.
    Asserts that it succeeded (its output's tail in the message if not)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "GPUFLEET_"))}
    clean.update(ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", **env)
    ran = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "hosts.yml", "play.yml"],
        capture_output=True,
        text=True,
        env=clean,
        cwd=site,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    return ran


def run_local_module(module: str, args: dict, *flags: str) -> dict:
    """Run one of our modules on this host through `ansible`; returns its result."""
    import json

    _rc, report = run_ansible(
        "ansible",
        "localhost",
        "-c",
        "local",
        "-e",
        json.dumps({"ansible_python_interpreter": sys.executable}),
        "-m",
        module,
        "-a",
        json.dumps(args),
        *flags,
    )
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.fixture(scope="session")
def mig_parted() -> Path:
    """NVIDIA's nvidia-mig-parted, built by tests/sim/migparted/build.sh (make migparted)."""
    import subprocess

    build = PROJECT / "tests" / "sim" / "migparted" / "build.sh"
    built = subprocess.run(["bash", str(build)], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    return Path(built.stdout.strip()) / "bin" / "nvidia-mig-parted"


@pytest.fixture(scope="session")
def containerd2() -> Path:
    """containerd 2.4's daemon, built by tests/tools/containerd/build.sh (make consumers)."""
    import subprocess

    build = PROJECT / "tests" / "tools" / "containerd" / "build.sh"
    built = subprocess.run(["bash", str(build)], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    binary = Path(built.stdout.strip()) / "bin" / "containerd"
    reported = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    assert "containerd github.com/containerd/containerd/v2 v2.4." in reported.stdout
    return binary


# EFI_CERT_X509_GUID as signature lists store it (the first three fields little-endian).
EFI_CERT_X509 = bytes.fromhex("a159c0a5e494a74a87b5ab155c2bf072")


def efi_signature_list(entries: list[bytes], kind: bytes = EFI_CERT_X509) -> bytes:
    """One EFI_SIGNATURE_LIST of same-sized `entries`, each under an owner GUID, as
    firmware and shim publish db and MokListRT (UEFI specification, 32.4.1)."""
    owner = bytes(range(16))
    [size] = {16 + len(entry) for entry in entries}  # certificates: one list each, as a rule
    body = b"".join(owner + entry for entry in entries)
    return kind + struct.pack("<III", 28 + len(body), 0, size) + body


def make_certificate(where: Path, name: str) -> Path:
    """A self-signed certificate (PEM) made by openssl, as a site's Machine Owner Key's."""
    key, certificate = where / f"{name}.key", where / f"{name}.pem"
    subprocess.run(
        [
            *("openssl", "req", "-new", "-x509", "-nodes", "-days", "30"),
            *("-subj", f"/CN={name}", "-newkey", "rsa:2048"),
            *("-keyout", str(key), "-out", str(certificate)),
        ],
        check=True,
        capture_output=True,
    )
    return certificate

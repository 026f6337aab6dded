# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Debian's nvidia-smi on the mock NVML, over a simulated node's state.

The binary is NVIDIA's own (Debian's nvidia-smi package, unpacked by
tests/tools/consumers.sh); the library is tests/sim/nvml's mock. What nvidia-smi
prints is read back with the parsers gpu_facts uses on real nodes, so a format the
mock gets wrong, or a parser that misreads the real tool, fails here.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_health, node_state, smi
from conftest import FIXTURES, NVIDIA_SMI, NVIDIA_SMI_550, PROJECT, mock_nvml_library, nvml_env
from gpusim import node, profiles

DRIVER = node.InstalledDriver("535.261.03", "proprietary", "package:nvidia-kernel-dkms")


@pytest.fixture(scope="session")
def mock_nvml() -> Path:
    return mock_nvml_library()


@pytest.fixture
def gpu_node(sim_node, mock_nvml, monkeypatch):
    """Boot a profile with a driver installed and loaded; `.run` runs an NVML program."""
    assert NVIDIA_SMI.is_file(), "run tests/tools/consumers.sh (make unit does)"
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: True)

    def boot(profile: str, library_version: str = DRIVER.version) -> profiles.Profile:
        prof = sim_node(profile, DRIVER)
        assert node.loaded("nvidia")
        (node.RUN / "nvml" / "library-version").write_text(library_version + "\n")
        return prof

    def run(
        *args: str, program: Path = NVIDIA_SMI, node_proc: bool = False, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """Run `program`; with node_proc, in a mount namespace whose /proc/driver is the
        node's (programs that read /proc/driver/nvidia-caps have the path built in);
        `env` adds to the environment."""
        command = [str(program), *args]
        if node_proc:
            mount = 'mount --bind "$0" /proc/driver && exec "$@"'
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount,
                       str(node.PROC_DRIVER), *command]  # fmt: skip
        full_env = nvml_env(mock_nvml) | env
        return subprocess.run(command, capture_output=True, text=True, env=full_env, check=False)

    boot.run = run  # type: ignore[attr-defined]
    return boot


def test_without_the_module_nvidia_smi_says_it_cannot_reach_the_driver(gpu_node):
    gpu_node("t4-1")
    node.unload_module("nvidia")
    result = gpu_node.run("-L")
    assert result.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in result.stdout


def test_list_shows_the_profiles_gpus_with_their_uuids(gpu_node):
    prof = gpu_node("h100-sxm-8")
    result = gpu_node.run("-L")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"GPU {g.index}: {g.product_name} (UUID: {g.uuid})" for g in prof.gpus
    ]


def test_gpu_facts_reads_the_profile_back_from_the_real_tool(gpu_node):
    prof = gpu_node("a100-mig")
    query = gpu_node.run(*smi.query_args())
    assert query.returncode == 0, query.stdout + query.stderr
    rows = smi.parse_query_csv(query.stdout)
    assert [(r["index"], r["name"], r["uuid"], r["pci.bus_id"]) for r in rows] == [
        (g.index, g.product_name, g.uuid, g.bus_id) for g in prof.gpus
    ]
    assert {r["memory.total"] for r in rows} == {40960}
    assert {r["driver_version"] for r in rows} == {"535.261.03"}
    assert {r["compute_cap"] for r in rows} == {"8.0"}
    assert [r["mig.mode.current"] for r in rows] == [True, True]
    xml = gpu_node.run("-q", "-x")
    assert xml.returncode == 0, xml.stderr
    facts = smi.parse_query_xml(xml.stdout)
    assert facts["driver_version"] == "535.261.03"
    assert facts["cuda_version"] == prof.cuda_version("535.261.03")
    assert facts["attached_gpus"] == 2
    assert [(g["serial"], g["product_architecture"]) for g in facts["gpus"]] == [
        (g.serial, "Ampere") for g in prof.gpus
    ]
    # The profiles -L names, given to the devices -q -x describes.
    smi.name_mig_devices(facts, smi.parse_list(gpu_node.run("-L").stdout))
    named = [[(d["profile"], d["memory_mib"]) for d in g["mig_devices"]] for g in facts["gpus"]]
    assert [[p for p, _ in gpu] for gpu in named] == [list(g.mig) for g in prof.gpus]
    assert {m for gpu in named for p, m in gpu if p == "1g.5gb"} == {4864}


def test_debian13s_nvidia_smi_550_reads_the_pci_addresses_and_cpu_affinity(
    sim_node, mock_nvml, monkeypatch
):
    # 550's nvidia-smi reads PCI addresses through nvmlDeviceGetPciInfoExt (535's did
    # not): without it every bus id was [N/A], which gpufleet's health query could
    # not read. Slurm's NVML plugin fails without a GPU's CPU affinity.
    assert NVIDIA_SMI_550.is_file(), "run tests/tools/consumers.sh (make unit does)"
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: True)
    prof = sim_node("a100-pcie-2", node.InstalledDriver("550.163.01", "open", "package:x"))
    (node.RUN / "nvml" / "library-version").write_text("550.163.01\n")
    env = nvml_env(mock_nvml)

    def smi_550(*args: str) -> str:
        run = subprocess.run([str(NVIDIA_SMI_550), *args], capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout

    rows = smi.parse_query_csv(smi_550(*smi.query_args()))
    assert [(r["pci.bus_id"], r["driver_version"]) for r in rows] == [
        (g.bus_id, "550.163.01") for g in prof.gpus
    ]
    remapped = smi_550(*gpu_health._REMAPPED_QUERY).splitlines()
    assert [line.split(",")[0] for line in remapped] == [g.bus_id for g in prof.gpus]
    # nvidia-smi's topology matrix also asks private NVML calls the mock does not
    # serve; the CPU set NVML gives each GPU is read here as Slurm's plugin reads it.
    script = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.nvmlInit_v2()\n"
        "for i in range(int(sys.argv[2])):\n"
        "    dev, cpus = ctypes.c_void_p(), (ctypes.c_ulong * 2)()\n"
        "    lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(dev))\n"
        "    rc = lib.nvmlDeviceGetCpuAffinity(dev, 2, cpus)\n"
        "    print(rc, ','.join(str(c) for c in range(128) if cpus[c // 64] >> (c % 64) & 1))\n"
    )
    read = subprocess.run(
        [sys.executable, "-c", script, str(mock_nvml), str(len(prof.gpus))],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    near = [
        (node.SYS / "bus" / "pci" / "devices" / g.sysfs_name / "local_cpulist").read_text()
        for g in prof.gpus
    ]
    assert read.stdout.splitlines() == [f"0 {_cpus(cpulist)}" for cpulist in near]


def _cpus(cpulist: str) -> str:
    """A cpulist ("0-2,5") spelled out ("0,1,2,5")."""
    cpus = []
    for part in cpulist.strip().split(","):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return ",".join(map(str, cpus))


def test_a_gpu_without_mig_reports_it_not_available(gpu_node):
    gpu_node("t4-1")
    rows = smi.parse_query_csv(gpu_node.run(*smi.query_args()).stdout)
    assert rows[0]["mig.mode.current"] is None
    assert rows[0]["memory.total"] == 15360


def test_a_library_of_another_version_than_the_module_refuses(gpu_node):
    gpu_node("t4-1", library_version="535.309.01")
    result = gpu_node.run("-L")
    assert result.returncode != 0
    assert "Driver/library version mismatch" in result.stdout + result.stderr


def test_persistence_mode_set_by_nvidia_smi_is_what_it_reads(gpu_node):
    gpu_node("t4-1")
    args = ("--query-gpu=persistence_mode", "--format=csv,noheader")
    assert gpu_node.run(*args).stdout.strip() == "Disabled"
    enabled = gpu_node.run("-pm", "1")
    assert enabled.returncode == 0, enabled.stdout
    assert "Enabled persistence mode for GPU 00000000:41:00.0." in enabled.stdout
    assert gpu_node.run(*args).stdout.strip() == "Enabled"
    assert node.persistence_enabled()


def test_a_program_with_nvml_open_holds_the_driver(gpu_node, mock_nvml):
    """NVML opens the device files; the module cannot be unloaded until they close."""
    gpu_node("t4-1")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "print(lib.nvmlInit_v2(), flush=True); sys.stdin.read()",
            str(mock_nvml),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=nvml_env(mock_nvml),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
        held = node.holders(node.device_files("nvidia", node.profile()))
        assert [pid for pid, _ in held] == [holder.pid]
        with pytest.raises(node.ModuleError, match="Module nvidia is in use"):
            node.unload_module("nvidia")
    finally:
        holder.communicate("")
    node.unload_module("nvidia")
    assert not (node.DEV / "nvidia0").exists()
    assert gpu_node.run("-L").returncode == 9


def test_profiles_all_list_through_the_real_tool(gpu_node):
    """Every GPU profile's GPUs come out of nvidia-smi as the profile defines them."""
    for name in profiles.available(node.PROFILE_DIR):
        prof = profiles.load(node.PROFILE_DIR, name, "unit-node")
        if not prof.gpus or prof.preinstalled_driver:
            continue
        gpu_node(name)
        names = gpu_node.run("--query-gpu=name", "--format=csv,noheader").stdout.splitlines()
        assert names == [g.product_name for g in prof.gpus], name


@pytest.mark.parametrize("version", ["1.17.8", "1.18.0", "1.19.1", "1.20.0"])
def test_nvidia_ctk_generates_a_cdi_spec_for_every_profile(gpu_node, mock_nvml, version):
    """NVIDIA's nvidia-ctk (built from its Go module) describes each profile's GPUs.

    The driver root is laid out like Debian's packages leave it: the NVML library
    (here the mock) and libcuda.so.<driver version>, which nvidia-ctk insists on.
    """
    built = subprocess.run(
        ["bash", str(PROJECT / "tests" / "sim" / "toolkit" / "build.sh"), version],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    nvidia_ctk = Path(built.stdout.strip()) / "nvidia-ctk"
    for name in profiles.available(node.PROFILE_DIR):
        prof = profiles.load(node.PROFILE_DIR, name, "unit-node")
        if not prof.gpus or prof.preinstalled_driver:
            continue
        gpu_node(name)
        node.load_module("nvidia_uvm")  # as the toolkit stage's unit does
        root = node.DEV.parent
        libdir = root / "usr" / "lib" / "x86_64-linux-gnu"
        libdir.mkdir(parents=True, exist_ok=True)
        (libdir / f"libcuda.so.{DRIVER.version}").touch()
        nvml = libdir / "libnvidia-ml.so.1"
        if not nvml.is_symlink():
            nvml.symlink_to(mock_nvml)
        result = gpu_node.run(
            "cdi", "generate", f"--driver-root={root}", program=nvidia_ctk, node_proc=True
        )
        assert result.returncode == 0, f"{name}: {result.stderr[-2000:]}"
        spec = yaml.safe_load(result.stdout)
        names = [device["name"] for device in spec["devices"]]
        listed = gpu_node.run("-L").stdout
        mig_uuids = re.findall(r"UUID: (MIG-[0-9a-f-]+)", listed)
        # 1.18 and later no longer offer a MIG-enabled GPU whole, only its MIG devices.
        whole = [g for g in prof.gpus if not (g.mig and version != "1.17.8")]
        expected = [str(g.index) for g in whole] + [g.uuid for g in whole] + ["all"]
        expected += [f"{g.index}:{i}" for g in prof.gpus for i in range(len(g.mig))] + mig_uuids
        assert sorted(names) == sorted(expected), name
        for device in spec["devices"]:
            if device["name"] in mig_uuids:  # the GPU, its GPU and compute instance caps
                paths = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
                caps = [p for p in paths if p.startswith("/dev/nvidia-caps/")]
                assert len(caps) == 2 and all((root / p[1:]).exists() for p in caps), paths
        nodes = {n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]}
        gpu_nodes = {p for p in nodes if not p.startswith("/dev/nvidia-caps/")}
        assert gpu_nodes == {f"/dev/nvidia{g.index}" for g in prof.gpus}, name
        if version in REAL_CDI and not any(g.mig for g in prof.gpus):
            assert _cdi_shape(spec) == _cdi_shape(REAL_CDI[version]), name


# What nvidia-ctk generated on a real H200 (driver 580.159.04, one GPU, MIG disabled).
REAL_CDI = {
    version: yaml.safe_load(
        (FIXTURES / "nvidia-ctk" / f"h200-580.159.04.cdi-{version}.yaml").read_text()
    )
    for version in ("1.17.8", "1.19.1")
}


def _whole(device: dict) -> bool:
    """A device naming a whole GPU (its index or UUID), not `all` nor a MIG device."""
    return device["name"].isdigit() or device["name"].startswith("GPU-")


def _cdi_shape(spec: dict) -> dict:
    """What a spec shares with the real one whatever the GPUs and the driver's files:
    its version and kind, the device nodes every container gets, the hooks it runs and
    the variables it sets (their names), each GPU's own device node kept apart."""
    edits = spec["containerEdits"]
    return {
        "cdiVersion": spec["cdiVersion"],
        "kind": spec["kind"],
        "nodes": sorted(n["path"] for n in edits["deviceNodes"]),
        "hooks": sorted({(h["hookName"], h["args"][1]) for h in edits.get("hooks", [])}),
        "env": sorted(e.split("=", 1)[0] for e in edits.get("env", [])),
        "whole_gpu": sorted(
            {len(d["containerEdits"]["deviceNodes"]) for d in spec["devices"] if _whole(d)}
        ),
    }


# --- MIG: mode, instances and MIG devices, driven by nvidia-smi's own commands ---------


def test_a_mig_layout_set_up_before_the_first_boot_is_what_nvidia_smi_lists(gpu_node):
    prof = gpu_node("a100-mig")
    listed_text = gpu_node.run("-L").stdout
    assert smi.parse_list(listed_text) == {gpu.uuid: list(gpu.mig) for gpu in prof.gpus}
    listed = listed_text.splitlines()
    mig_lines = [line.split("Device")[0].strip() for line in listed if line.startswith("  MIG")]
    assert mig_lines == [f"MIG {name}" for gpu in prof.gpus for name in gpu.mig]
    facts = smi.parse_query_xml(gpu_node.run("-q", "-x").stdout)
    gpu1 = facts["gpus"][1]["mig_devices"]
    assert [(m["gpu_instance_id"], m["memory_mib"], m["multiprocessor_count"]) for m in gpu1] == [
        (gi, 4864, 14) for gi in range(1, 8)
    ]


@pytest.fixture
def persistence_socket(tmp_path):
    """The simulated persistence daemon's socket, answering as the kit's daemon does."""
    path = tmp_path / "socket"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            with client:
                client.sendall(node.nvml_snapshot())

    threading.Thread(target=serve, daemon=True).start()
    yield path
    server.close()


def test_in_a_container_nvml_reads_the_node_through_the_persistence_daemon(
    gpu_node, persistence_socket, tmp_path
):
    """A container has the device files and the daemon's socket (the CDI spec mounts
    both), not the node's state: what nvidia-smi lists there is what the host lists,
    MIG devices included; changes are refused as in an unprivileged container."""
    gpu_node("a100-mig")
    on_host = gpu_node.run("-L")
    absent = str(tmp_path / "absent")
    inside = {"GPUSIM_RUN": absent, "GPUSIM_STATE": absent}
    listed = gpu_node.run("-L", GPUSIM_NVML_SOCKET=str(persistence_socket), **inside)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "MIG 3g.20gb" in listed.stdout
    assert listed.stdout == on_host.stdout
    refused = gpu_node.run("-pm", "1", GPUSIM_NVML_SOCKET=str(persistence_socket), **inside)
    assert refused.returncode != 0
    assert not node.persistence_enabled()
    no_daemon = gpu_node.run("-L", GPUSIM_NVML_SOCKET=absent, **inside)
    assert no_daemon.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in no_daemon.stdout


def test_gpu_instances_follow_the_boards_placement_rules(gpu_node):
    gpu_node("a100-mig")  # GPU 0: two 3g.20gb halves, nothing free
    full = gpu_node.run("mig", "-cgi", "4g.20gb", "-i", "0")
    assert full.returncode != 0
    assert "Insufficient Resources" in full.stdout + full.stderr
    busy = gpu_node.run("mig", "-dgi", "-gi", "1", "-i", "0")
    assert "In use by another client" in busy.stdout + busy.stderr  # its compute instance
    assert gpu_node.run("mig", "-dci", "-gi", "1", "-i", "0").returncode == 0
    assert gpu_node.run("mig", "-dgi", "-gi", "1", "-i", "0").returncode == 0
    made = gpu_node.run("mig", "-cgi", "2g.10gb,1g.5gb,1g.5gb", "-C", "-i", "0")
    assert made.returncode == 0, made.stdout + made.stderr
    table = gpu_node.run("mig", "-lgi", "-i", "0").stdout
    placed = sorted(
        (int(start), name)
        for name, start in re.findall(r"MIG (\S+)\s+\d+\s+\d+\s+(\d+):\d+", table)
    )
    assert placed == [(0, "2g.10gb"), (2, "1g.5gb"), (3, "1g.5gb"), (4, "3g.20gb")]
    free = gpu_node.run("mig", "-lgip", "-i", "0").stdout
    remaining = {name: int(n) for name, n in re.findall(r"MIG (\S+)\s+\d+\s+(\d+)/\d+", free)}
    # all seven compute slices are taken, though memory slice 6 is free
    assert remaining["1g.5gb"] == remaining["7g.40gb"] == 0
    gpu_node.run("mig", "-dci", "-gi", "2", "-i", "0")  # the 3g.20gb at slices 4-7
    gpu_node.run("mig", "-dgi", "-gi", "2", "-i", "0")
    free = gpu_node.run("mig", "-lgip", "-i", "0").stdout
    remaining = {name: int(n) for name, n in re.findall(r"MIG (\S+)\s+\d+\s+(\d+)/\d+", free)}
    assert (remaining["3g.20gb"], remaining["4g.20gb"], remaining["1g.5gb"]) == (1, 0, 3)


def test_the_persistence_daemon_does_not_keep_a_gpu_from_its_reset(gpu_node, tmp_path):
    """As NVIDIA's nvidia-mig-manager service assumes (it runs after nvidia-persistenced
    and the fabric manager and leaves them running), their handles do not hold a MIG
    mode change back; any other process's do."""
    gpu_node("a100-pcie-2")
    daemon = tmp_path / "nvidia-persistenced"  # /proc/PID/comm: nvidia-persiste
    shutil.copy("/bin/sleep", daemon)
    with open(node.DEV / "nvidia0", "rb") as gpu:
        holder = subprocess.Popen([str(daemon), "60"], stdin=gpu)
    try:
        time.sleep(0.2)
        assert gpu_node.run("-i", "0", "-mig", "1").returncode == 0
    finally:
        holder.kill()
        holder.wait()
    query = ("--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader")
    assert gpu_node.run(*query).stdout.splitlines()[0] == "Enabled, Enabled"


def test_mig_mode_waits_for_a_gpu_reset_while_the_gpu_is_held(gpu_node):
    gpu_node("a100-pcie-2")
    query = ("--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader")
    assert gpu_node.run(*query).stdout.splitlines() == ["Disabled, Disabled"] * 2
    with open(node.DEV / "nvidia0", "rb"):  # a process holds GPU 0
        held = gpu_node.run("-i", "0", "-mig", "1")
    assert "pending enable state" in held.stdout
    assert gpu_node.run("-i", "1", "-mig", "1").returncode == 0  # idle: reset at once
    assert gpu_node.run(*query).stdout.splitlines() == ["Disabled, Enabled", "Enabled, Enabled"]
    made = gpu_node.run("mig", "-cgi", "7g.40gb", "-C", "-i", "1")
    assert made.returncode == 0, made.stdout
    sim_boot = node.boot()  # a reboot: pending modes apply, instances are gone
    assert sim_boot.gpus and node.loaded("nvidia")
    (node.RUN / "nvml" / "library-version").write_text(DRIVER.version + "\n")
    assert gpu_node.run(*query).stdout.splitlines() == ["Enabled, Enabled"] * 2
    assert "MIG" not in gpu_node.run("-L").stdout.replace("MIG M.", "")


@pytest.mark.parametrize("program", [NVIDIA_SMI, NVIDIA_SMI_550], ids=["535", "550"])
def test_nvidia_smi_resets_an_idle_gpu_and_refuses_a_held_or_lost_one(
    sim_node, mock_nvml, monkeypatch, program
):
    """`nvidia-smi --gpu-reset` through the private calls it makes: an idle GPU is reset
    (a pending MIG mode applies, its instances go, a double-bit error's pending row
    remapping is done and its volatile count cleared; the aggregate count stays); a GPU
    another process holds is refused and keeps its fault; a lost one is not found."""
    from gpusim import faults

    version = "535.261.03" if program == NVIDIA_SMI else "550.163.01"
    monkeypatch.setattr(node, "nouveau_blacklisted", lambda: True)
    prof = sim_node("a100-pcie-2", node.InstalledDriver(version, "open", "package:x"))
    (node.RUN / "nvml" / "library-version").write_text(version + "\n")
    env = nvml_env(mock_nvml)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(program), *args], capture_output=True, text=True, env=env)

    second = prof.gpus[1]
    assert run("-i", "0", "-mig", "1").returncode == 0
    assert run("mig", "-cgi", "7g.40gb", "-C", "-i", "0").returncode == 0
    with open(node.DEV / "nvidia1", "rb"):  # a process holds GPU 1
        assert "pending enable state" in run("-i", "1", "-mig", "1").stdout
        faults.inject(prof, "ecc-dbe", 1)
        held = run("--gpu-reset", "-i", second.uuid)
    assert held.returncode != 0
    assert "In use by another client" in held.stdout + held.stderr, held.stdout + held.stderr
    query = ("--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader")
    assert run(*query).stdout.splitlines() == ["Enabled, Enabled", "Disabled, Enabled"]
    address = gpu_health.pci_address(second.bus_id)
    assert ("remap-pending", "reset") in _kinds(_health_of(run), address)

    done = run("--gpu-reset", "-i", second.uuid)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "was successfully reset" in done.stdout
    assert run(*query).stdout.splitlines() == ["Enabled, Enabled"] * 2
    assert _kinds(_health_of(run), address) == []
    assert faults._load()["1"] == {"ecc_dbe_aggregate": 1, "remapped_unc": 1}
    # GPU 0's instance was not touched by GPU 1's reset; its own reset takes it.
    assert "MIG 7g.40gb" in run("-L").stdout
    assert run("--gpu-reset", "-i", "0").returncode == 0
    assert "MIG 7g.40gb" not in run("-L").stdout

    faults.inject(prof, "lost", 0)
    lost = run("--gpu-reset", "-i", "0")
    assert (lost.returncode, "GPU is lost" in lost.stdout) == (15, True), lost.stdout


def test_utilization_of_a_gpu_in_mig_mode_is_not_available(gpu_node):
    """nvml.h: utilization rates cannot be queried on a MIG-enabled GPU; nvidia-smi
    (and DCGM, and so dcgm-exporter) report none for it, only for the others."""
    gpu_node("a100-mig")
    out = gpu_node.run(
        "--query-gpu=index,mig.mode.current,utilization.gpu,memory.total",
        "--format=csv,noheader,nounits",
    ).stdout
    rows = [[cell.strip() for cell in line.split(",")] for line in out.splitlines()]
    assert rows and all(row[1] == "Enabled" for row in rows), out
    assert {row[2] for row in rows} == {"[N/A]"}, out
    assert all(row[3].isdigit() for row in rows), out


def test_health_through_debians_nvidia_smi_falls_back_and_reads_no_fault(gpu_node):
    """Debian's 535 nvidia-smi refuses the remapped rows in --query-gpu; the health query
    asks again without them and reads them with --query-remapped-rows, which prints its
    flags as numbers (580's --query-gpu prints "No"/"Yes"). A healthy board: no signal."""
    prof = gpu_node("a100-mig")
    calls = []

    def run(argv):
        calls.append(argv[1].partition("=")[0])
        done = gpu_node.run(*argv[1:])
        return done.returncode, done.stdout, done.stderr

    rows, unreachable, error = gpu_health.query(run, "nvidia-smi", node_state.SMI_FIELDS)
    assert (unreachable, error) == ({}, None)
    assert calls == ["--query-gpu", "--query-gpu", "--query-remapped-rows"]
    assert [r["pci.bus_id"] for r in rows] == [g.bus_id for g in prof.gpus]
    assert {(r["remapped_rows.pending"], r["remapped_rows.failure"]) for r in rows} == {("0", "0")}
    assert {r["pcie.link.width.current"] for r in rows} == {"16"}
    # The probe's query: each GPU's UUID and serial come with its health.
    assert gpu_health.gpu_health(rows, unreachable) == {
        gpu_health.pci_address(g.bus_id): {
            "action": "none",
            "signals": [],
            "uuid": g.uuid,
            "serial": g.serial,
        }
        for g in prof.gpus
    }


def _health(gpu_node, addresses=()) -> dict:
    """gpu_health's reading of what Debian's nvidia-smi prints on the node now."""
    return _health_of(gpu_node.run, addresses)


def _health_of(run, addresses=()) -> dict:
    """gpu_health's reading of what `run` (an nvidia-smi of the node) prints."""

    def query(argv):
        done = run(*argv[1:])
        return done.returncode, done.stdout, done.stderr

    rows, unreachable, error = gpu_health.query(query, "nvidia-smi", smi.QUERY_FIELDS)
    assert error is None
    return gpu_health.gpu_health(rows, unreachable, None, addresses)


def _kinds(health: dict, address: str) -> list[tuple[str, str]]:
    return [(s["kind"], s["action"]) for s in health[address]["signals"]]


def test_injected_faults_reach_nvidia_smi_and_the_health_reader(gpu_node):
    """`gpusim fault` writes what the board would report; Debian's nvidia-smi reads it
    through the mock NVML and prints it its own way; gpu_health reads that."""
    from gpusim import faults

    prof = gpu_node("a100-mig")
    first, second = (gpu_health.pci_address(g.bus_id) for g in prof.gpus)
    faults.inject(prof, "ecc-dbe", 0)
    faults.inject(prof, "throttle", 1)
    faults.inject(prof, "pcie-degraded", 1)
    health = _health(gpu_node)
    assert _kinds(health, first) == [("ecc-dbe", "watch"), ("remap-pending", "reset")]
    assert _kinds(health, second) == [("hw-slowdown", "watch"), ("pcie-width", "watch")]
    assert "x8 of x16" in health[second]["signals"][1]["detail"]
    # The driver logged the double-bit error as Xid 48, in the node's kernel log.
    log, _ = gpu_health.read_kernel_log(str(node.DEV / "kmsg"))
    events = gpu_health.parse_kmsg(log)
    assert [(e["pci_address"], e["xid"], e["action"]) for e in events] == [(first, 48, "reset")]
    assert "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.261.03" in log

    # A reset of the first GPU completes the remapping; what the second keeps stays.
    faults.at_reset(0)
    health = _health(gpu_node)
    assert _kinds(health, first) == []
    assert [k for k, _ in _kinds(health, second)] == ["hw-slowdown", "pcie-width"]
    faults.clear()
    assert all(not h["signals"] for h in _health(gpu_node).values())


def test_a_turing_board_retires_pages_instead_of_remapping_rows(gpu_node):
    from gpusim import faults

    prof = gpu_node("t4-1")
    faults.inject(prof, "ecc-dbe", 0)
    [health] = _health(gpu_node).values()
    assert [s["kind"] for s in health["signals"]] == ["ecc-dbe", "retire-pending"]


def test_a_lost_gpu_is_named_by_nvidia_smi_and_read_as_lost_until_a_reboot(gpu_node):
    from gpusim import faults

    prof = gpu_node("a100-mig")
    faults.inject(prof, "lost", 1)
    query = gpu_node.run(*smi.query_args(("index", "pci.bus_id")))
    # Debian's 535 names the GPU by index here, and prints no row for the other one.
    assert (query.returncode, query.stdout.strip()) == (
        15,
        "Unable to determine the device handle for GPU1: GPU is lost.  "
        "Reboot the system to recover this GPU",
    )
    addresses = [gpu_health.pci_address(g.bus_id) for g in prof.gpus]
    health = _health(gpu_node, addresses)
    assert health == {
        addresses[1]: {"action": "reboot", "signals": [health[addresses[1]]["signals"][0]]}
    }
    assert _kinds(health, addresses[1]) == [("lost", "reboot")]
    faults.inject(prof, "remap-failure", 0)
    faults.at_boot(prof)  # what the node's reboot does
    health = _health(gpu_node)
    assert _kinds(health, addresses[1]) == []
    assert _kinds(health, addresses[0]) == [("remap-failure", "replace")]
    log, _ = gpu_health.read_kernel_log(str(node.DEV / "kmsg"))
    assert log == ""  # a new boot, a new log

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Verify the simulated-node harness: what an operator would see on these nodes."""

from __future__ import annotations

import json
import subprocess
import time

PROFILES = {"gpufleet-mol-h100": "h100-sxm-8", "gpufleet-mol-cpu": "none"}
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
REPO = "/srv/gpufleet-repo/libnvidia-container/stable/deb/amd64"


def _name(host) -> str:
    return host.backend.get_hostname()


def _is_gpu_node(host) -> bool:
    return PROFILES[_name(host)] != "none"


def _status(host) -> dict:
    return json.loads(host.check_output("/opt/gpusim/bin/gpusim status --json"))


def _apt_update_with_key(host, key: str) -> object:
    """apt-get update of the local repository alone, trusting only `key`."""
    work = "/tmp/apt-signature-check"
    host.run(f"rm -rf {work} && mkdir -p {work}/lists/partial {work}/parts")
    host.run(f"echo 'deb [signed-by={key}] file:{REPO} /' > {work}/sources.list")
    return host.run(
        f"apt-get update -o Dir::Etc::SourceList={work}/sources.list "
        f"-o Dir::Etc::SourceParts={work}/parts -o Dir::State::Lists={work}/lists"
    )


def test_node_is_marked_simulated_and_boots_its_profile(host):
    assert host.file("/etc/gpusim-node").contains("SIMULATED")
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"
    status = _status(host)
    assert status["profile"] == PROFILES[_name(host)]
    expected = {"h100-sxm-8": (8, 4), "none": (0, 0)}[status["profile"]]
    assert (status["gpus"], status["nvswitches"]) == expected


def test_systemd_is_up_and_only_driver_dependent_units_fail(host):
    state = host.run("systemctl is-system-running").stdout.strip()
    failed = host.run("systemctl --failed --plain --no-legend").stdout.split()
    failed_units = {word for word in failed if word.endswith(".service")}
    if _is_gpu_node(host):
        # The driver is installed but not loaded: only the persistence daemon, which
        # needs /dev/nvidia*, may have failed - as on a real host in that state.
        assert failed_units <= {"nvidia-persistenced.service"}
    else:
        assert state == "running" and not failed_units


def test_simulated_pci_tree_has_the_profile_devices(host):
    listing = host.check_output(
        "for d in /run/gpusim/sys/bus/pci/devices/*; do echo $(cat $d/vendor) $(cat $d/class); done"
    )
    lines = listing.splitlines()
    gpus = [line for line in lines if line == "0x10de 0x030200"]
    switches = [line for line in lines if line == "0x10de 0x068000"]
    # Other vendors' devices are there too (e.g. the BMC's VGA controller).
    assert any(line.startswith("0x1a03 0x0300") for line in lines)
    assert (len(gpus), len(switches)) == ((8, 4) if _is_gpu_node(host) else (0, 0))


def test_local_repository_is_reachable_and_offers_the_toolkit_versions(host):
    policy = host.check_output("apt-cache policy nvidia-container-toolkit")
    assert "Candidate: 1.20.0-1" in policy
    assert "1.17.8-1" in policy and "1.19.1-1" in policy
    assert f"file:{REPO}" in policy


def test_local_repository_signature_is_checked(host):
    good = _apt_update_with_key(host, "/etc/apt/keyrings/nvidia-container-toolkit.asc")
    assert good.rc == 0, good.stderr
    wrong = _apt_update_with_key(host, "/usr/share/keyrings/debian-archive-keyring.gpg")
    output = wrong.stdout + wrong.stderr
    assert wrong.rc != 0 and ("NO_PUBKEY" in output or "not signed" in output), output


def test_real_driver_packages_are_installed_only_on_gpu_nodes(host):
    for package in ("nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1", "nvidia-persistenced"):
        assert host.package(package).is_installed == _is_gpu_node(host)


def _wait_booted(host, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = host.run("systemctl is-system-running").stdout.strip()
        if state in ("running", "degraded"):
            return state
        time.sleep(1)
    raise AssertionError(f"{_name(host)} did not boot: {state}")


BLACKLIST = "/etc/modprobe.d/zz-harness-test.conf"


def _load_driver(host) -> None:
    """Blacklist nouveau and power-cycle the node, so the installed driver loads at boot."""
    host.run(f"echo 'blacklist nouveau' > {BLACKLIST}")
    subprocess.run(["podman", "restart", "-t", "5", _name(host)], check=True, capture_output=True)
    _wait_booted(host)


def test_nvidia_smi_fails_before_and_answers_after_the_driver_loads(host):
    if not _is_gpu_node(host):
        assert not host.exists("nvidia-smi")
        load = host.run("modprobe nvidia")
        assert load.rc == 1 and "Module nvidia not found" in load.stderr
        return

    before = host.run("nvidia-smi")
    assert before.rc == 9 and NO_DRIVER in before.stdout

    # nouveau holds the GPUs on a fresh node, so the module cannot bind them yet.
    load = host.run("modprobe nvidia")
    assert load.rc == 1 and "No such device" in load.stderr

    try:
        _load_driver(host)
        listing = host.run("nvidia-smi -L")
        assert listing.rc == 0, listing.stdout
        gpus = listing.stdout.splitlines()
        assert len(gpus) == 8
        assert all("NVIDIA H100 80GB HBM3 (UUID: GPU-" in line for line in gpus)
        version = host.check_output("dpkg-query -W -f='${Version}' nvidia-kernel-dkms")
        reported = host.check_output(
            "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
        ).splitlines()
        assert set(reported) == {version.split("-")[0]}
        # The persistence daemon now starts and holds the module.
        host.run("systemctl restart nvidia-persistenced")
        assert host.service("nvidia-persistenced").is_running
        unload = host.run("modprobe -r nvidia")
        assert unload.rc == 1 and "in use" in unload.stderr
        bad = host.run("nvidia-smi --query-gpu=name,not.a.field --format=csv")
        assert bad.rc == 2 and 'Field "not.a.field" is not a valid field' in bad.stdout
    finally:
        host.run(f"rm -f {BLACKLIST}")


def test_local_packages_behave_like_upstream_for_the_roles(host):
    """The toolkit (NVIDIA's nvidia-ctk on the mock NVML), DCGM exporter and fabric
    manager packages of the local repository on a node with a loaded driver."""
    if not _is_gpu_node(host):
        return  # they need a GPU and a driver; the GPU node covers them
    try:
        if host.run("nvidia-smi -L").rc != 0:
            _load_driver(host)
        install = host.run(
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
            "nvidia-container-toolkit=1.17.8-1 nvidia-container-toolkit-base=1.17.8-1 "
            "libnvidia-container-tools=1.17.8-1 libnvidia-container1=1.17.8-1"
        )
        assert install.rc == 0, install.stdout + install.stderr
        assert "version 1.17.8" in host.check_output("nvidia-ctk --version")
        host.check_output("nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
        devices = host.check_output("nvidia-ctk cdi list").splitlines()
        assert "nvidia.com/gpu=all" in devices
        assert sum(1 for d in devices if d.startswith("nvidia.com/gpu=GPU-")) == 8

        repo = "/srv/gpufleet-repo/cuda/repos/debian12/x86_64"
        host.run(
            f"cp {repo}/3bf863cc.pub /etc/apt/keyrings/cuda-test.asc && echo "
            f"'deb [signed-by=/etc/apt/keyrings/cuda-test.asc] file:{repo} /' "
            "> /etc/apt/sources.list.d/cuda-test.list && apt-get update -q"
        )
        version = host.check_output(
            "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
        ).splitlines()[0]
        install = host.run(
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -q datacenter-gpu-manager-exporter "
            f"nvidia-fabricmanager-535={version}-1"
        )
        assert install.rc == 0, install.stdout + install.stderr
        host.run("systemctl start nvidia-fabricmanager")
        assert host.service("nvidia-fabricmanager").is_running
        host.run("systemd-run --unit=harness-exporter dcgm-exporter -a 127.0.0.1:9400")
        metrics = ""
        for _ in range(20):
            metrics = host.run("curl -sf http://127.0.0.1:9400/metrics").stdout
            if metrics:
                break
            time.sleep(0.5)
        util = [m for m in metrics.splitlines() if m.startswith("DCGM_FI_DEV_GPU_UTIL{")]
        assert len(util) == 8, metrics
        assert all('modelName="NVIDIA H100 80GB HBM3"' in line for line in util)
    finally:
        host.run(
            "systemctl stop harness-exporter nvidia-fabricmanager; "
            "rm -f /etc/apt/sources.list.d/cuda-test.list " + BLACKLIST
        )

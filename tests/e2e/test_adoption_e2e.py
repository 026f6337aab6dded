# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Adopting a node someone else set up, with gpufleet installed from its wheel.

A simulated T4 provisioned by hand, as a site would have done it before gpufleet:
Debian's open kernel module 535.261.03 installed with apt and loaded (the defaults
would pick the proprietary one on a T4 with branch 535), and containerd 2.4 installed
as upstream's release is (its binaries under /usr/local/bin, its own systemd unit;
built from its Go module by tests/tools/containerd/build.sh), running containerd's own
default config (version 4) with settings of the site's, and a long-running container of
the site's on it. gpufleet runs from a directory holding only the site's inventory (with
a web server that has no node behind it) and ansible.cfg.
"""

from __future__ import annotations

import subprocess
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_runner_e2e import (
    FLEET,
    PROJECT,
    cli_data,
    site_directory,
    start_fleet,
)

pytestmark = pytest.mark.fleet

NODE = "e2e-adopt"
DRIVER = "535.261.03"
# What the site changed in containerd's default config (`containerd config default`,
# version 4): gpufleet adds its runtime and keeps these.
SITE_CONTAINERD = (
    ("SystemdCgroup = false", "SystemdCgroup = true"),
    ("sandbox = 'registry.k8s.io/pause:", "sandbox = 'registry.example.net/pause:"),
    ("oom_score = 0", "oom_score = -999"),
)
# What the site ran by hand: Debian's contrib/non-free sources, the driver held at
# one build with an apt pin of its own, the open module, runc for containerd, and
# busybox for its workload's container.
# (The pin names its packages with globs: a /regex/ pin would cost every apt run on
# the node about 5 s of CPU, see the driver role's own pin.)
PROVISION = f"""set -e
cat > /etc/apt/sources.list.d/site-nvidia.list <<'EOF'
deb http://deb.debian.org/debian bookworm contrib non-free non-free-firmware
deb http://deb.debian.org/debian-security bookworm-security contrib non-free non-free-firmware
EOF
printf 'Package: nvidia-* libnvidia-* libcuda1 firmware-nvidia-*\\nPin: version {DRIVER}-*\\n\
Pin-Priority: 1001\\n' > /etc/apt/preferences.d/site-nvidia.pref
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \\
  nvidia-open-kernel-dkms nvidia-smi libnvidia-ml1 libcuda1 firmware-nvidia-gsp \\
  nvidia-persistenced runc busybox-static
"""
# The site's workload: a container on its containerd (ctr's default namespace), from a
# root file system holding busybox alone.
WORKLOAD = "site-app"
WORKLOAD_ROOT = "/srv/site-app"


def on_node(*command: str) -> str:
    done = subprocess.run(["podman", "exec", NODE, *command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def write_site_containerd_config() -> str:
    """The site's config.toml: containerd's default with the site's changes."""
    config = on_node("/usr/local/bin/containerd", "config", "default") + "\n"
    for stock, site in SITE_CONTAINERD:
        assert stock in config, stock
        config = config.replace(stock, site)
    subprocess.run(
        ["podman", "exec", "-i", NODE, "sh", "-c", "cat > /etc/containerd/config.toml"],
        input=config,
        text=True,
        check=True,
    )
    return config


def install_containerd() -> None:
    """containerd 2.4 as a site installs upstream's release: the binaries in
    /usr/local/bin, the unit in /usr/local/lib/systemd/system, containerd's default
    config with the site's changes, started by systemd."""
    built = subprocess.run(
        ["bash", str(PROJECT / "tests" / "tools" / "containerd" / "build.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    release = Path(built.stdout.strip())
    on_node("mkdir", "-p", "/usr/local/lib/systemd/system", "/etc/containerd")
    files = {f"/usr/local/bin/{binary.name}": binary for binary in (release / "bin").iterdir()}
    files["/usr/local/lib/systemd/system/containerd.service"] = release / "containerd.service"
    for target, source in files.items():
        subprocess.run(["podman", "cp", str(source), f"{NODE}:{target}"], check=True)
    write_site_containerd_config()
    on_node("systemctl", "daemon-reload")
    on_node("systemctl", "enable", "--now", "containerd")


def start_workload() -> None:
    """The site's long-running container, started on containerd with its own client."""
    on_node("sh", "-c", f"mkdir -p {WORKLOAD_ROOT}/bin && cp /bin/busybox {WORKLOAD_ROOT}/bin/")
    on_node("ctr", "run", "-d", "--rootfs", WORKLOAD_ROOT, WORKLOAD, "/bin/busybox", "sleep", "1d")


def workload() -> tuple[str, str]:
    """The workload's task as containerd lists it: its PID and status."""
    listing = on_node("ctr", "task", "ls")
    for line in listing.splitlines()[1:]:
        task, pid, status = line.split()
        if task == WORKLOAD:
            return pid, status
    raise AssertionError(f"no task {WORKLOAD}: {listing}")


def snapshot() -> str:
    """Every file under the paths gpufleet writes, with size and mtime; the units."""
    return on_node(
        "sh",
        "-c",
        "find /etc /usr /opt /var/lib/dpkg /var/lib/gpufleet /run/nvidia -xdev "
        "-printf '%p %s %T@\\n' 2>/dev/null | sort | sha256sum; "
        "systemctl list-units --no-legend --plain --state=active | sha256sum",
    )


def assert_containerd_has_the_runtime() -> None:
    """containerd's own reading of its configuration, imports included (`config
    dump`): the nvidia runtime, with the site's SystemdCgroup."""
    seen = tomllib.loads(on_node("containerd", "config", "dump"))
    cri = seen["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    options = cri["runtimes"]["nvidia"]["options"]
    assert (options["BinaryName"], options["SystemdCgroup"]) == (
        "/usr/bin/nvidia-container-runtime",
        True,
    )


def driver_seen() -> tuple[str, str, str]:
    """The loaded driver (nvidia-smi), the open module package's version, the boot."""
    return (
        on_node("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"),
        on_node("dpkg-query", "-W", "-f=${Version}", "nvidia-open-kernel-dkms"),
        on_node("ps", "-o", "lstart=", "-p", "1"),  # the simulated node's boot
    )


@dataclass
class Site:
    directory: Path
    gpufleet: Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, installed_gpufleet: Path) -> Iterator[Site]:
    work = tmp_path_factory.mktemp("adopt")
    inventory = start_fleet(work, {NODE: "t4-1"}, privileged=True)  # (to run containers)
    try:
        on_node("sh", "-c", PROVISION)
        install_containerd()
        # nouveau holds the T4 until a boot loads the module the packages installed.
        subprocess.run([*FLEET, "reboot", NODE], check=True)
        assert driver_seen()[0] == DRIVER
        start_workload()
        assert workload()[1] == "RUNNING"
        gpufleet = site_directory(work / "site", installed_gpufleet, inventory)
        # The site installs its container runtime itself (the simulated fleet's
        # group_vars have gpufleet install Debian's containerd on bare nodes).
        host_vars = work / "site" / "inventory" / "host_vars"
        host_vars.mkdir()
        (host_vars / f"{NODE}.yml").write_text("runtime_config_install: []\n")
        yield Site(work / "site", gpufleet)
    finally:
        subprocess.run([*FLEET, "down", NODE], check=False)


WHERE = ("-i", "inventory", "--state-dir", "state")


def test_the_first_plan_changes_nothing_and_says_what_would_change(site: Site):
    before = snapshot()
    plan = site.gpufleet("plan", *WHERE)
    assert plan.returncode == 5, plan.stdout + plan.stderr  # changes pending
    line = next(x for x in plan.stdout.splitlines() if x.startswith(f"  {NODE}: "))
    assert "planned; because no record, first run; would change " in line, line
    assert (
        f"driver {DRIVER} (open) adopted as installed; "
        "the defaults would install branch 535 (proprietary)"
    ) in line
    # The adopted driver is not reloaded, but containerd, which runs the site's
    # container, is to be restarted with the runtime added: through a rollout.
    assert "disruptive: rolled out in batches" in line, line
    assert snapshot() == before
    assert workload()[1] == "RUNNING"


def test_reconcile_adopts_the_node_keeping_its_driver_and_the_sites_settings(site: Site):
    driver = driver_seen()
    task = workload()
    before = on_node("systemctl", "show", "-P", "MainPID", "containerd")
    result = site.gpufleet("reconcile", "--once", *WHERE)
    assert result.returncode == 0, result.stdout + result.stderr
    # containerd was restarted inside the pool's rollout, not at once; the site's
    # container, kept by its shim, ran on through the restart.
    assert f"  {NODE}: rolled-out; " in result.stdout, result.stdout
    assert workload() == task
    assert driver_seen() == driver, "the same driver, loaded since the same boot"
    # The site's containerd 2.4, restarted with gpufleet's runtime beside the site's
    # settings in its version 4 config, and no containerd of Debian's installed.
    config = on_node("cat", "/etc/containerd/config.toml")
    assert config.startswith("version = 4\n"), config[:200]
    assert all(site_value in config for _, site_value in SITE_CONTAINERD), config
    assert "enable_cdi" not in config, "CDI is always on in containerd 2.4"
    pid = on_node("systemctl", "show", "-P", "MainPID", "containerd")
    assert pid not in ("0", before), (before, pid)
    assert on_node("readlink", f"/proc/{pid}/exe") == "/usr/local/bin/containerd"
    assert_containerd_has_the_runtime()
    debian = subprocess.run(["podman", "exec", NODE, "dpkg-query", "-W", "containerd"])
    assert debian.returncode != 0, "Debian's containerd was installed"

    status = cli_data(site.gpufleet("status", "--json", *WHERE).stdout, "status")["hosts"]
    assert [h["name"] for h in status] == [NODE], "only the GPU group"
    (record,) = status
    assert record["status"] == "converged"
    assert record["stages"]["driver"] == "ready"
    assert record["driver_adopted"].startswith(f"driver {DRIVER} (open) adopted")
    assert (record["os"], record["driver_version"]) == ("debian 12", DRIVER)
    table = site.gpufleet("status", *WHERE).stdout
    assert "converged (driver adopted)" in table and f"driver=ready:{DRIVER}:adopted" in table

    again = site.gpufleet("reconcile", "--once", *WHERE)
    assert again.stdout.startswith("cycle: 1 probed, 0 planned, 0 applied"), again.stdout
    assert driver_seen() == driver


def test_the_site_moves_the_runtime_into_the_drop_in_directory_its_containerd_imports(
    site: Site,
):
    """The site's configuration management takes config.toml back (its own file, without
    gpufleet's runtime) and names a drop-in for gpufleet in the directory containerd
    2.4's own config imports: the runtime goes there, config.toml is left as the site
    wrote it, and the restarted containerd has the runtime, read from the drop-in."""
    drop_in = "/etc/containerd/conf.d/99-nvidia.toml"
    host_vars = site.directory / "inventory" / "host_vars" / f"{NODE}.yml"
    host_vars.write_text(
        host_vars.read_text() + f"runtime_config_containerd_drop_in_path: {drop_in}\n"
    )
    site_config = write_site_containerd_config()
    task = workload()
    before = on_node("systemctl", "show", "-P", "MainPID", "containerd")
    result = site.gpufleet("reconcile", "--once", *WHERE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "desired state changed" in result.stdout, result.stdout
    assert f"  {NODE}: rolled-out; " in result.stdout, result.stdout
    assert workload() == task
    written = tomllib.loads(on_node("cat", drop_in))
    assert written["version"] == 4
    runtimes = written["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    # Its stock import already covers the drop-in: the site's file is not touched.
    assert on_node("cat", "/etc/containerd/config.toml") + "\n" == site_config
    assert on_node("systemctl", "show", "-P", "MainPID", "containerd") not in ("0", before)
    assert_containerd_has_the_runtime()

    again = site.gpufleet("reconcile", "--once", *WHERE)
    assert again.stdout.startswith("cycle: 1 probed, 0 planned, 0 applied"), again.stdout


def test_the_web_server_in_the_sites_inventory_was_never_contacted(site: Site):
    log = (site.directory / "ansible.log").read_text()  # where the site's ansible.cfg says
    assert "Probe each node for drift from its last successful apply" in log
    assert NODE in log
    assert "web-1" not in log and "192.0.2.10" not in log

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Start, stop and inspect a fleet of simulated GPU nodes (a test fixture).

Each node is a podman container running systemd from the locally built image
(`image`), with one GPU profile chosen when it starts, and the local signed package
repository (`repo`) mounted read-only at /srv/gpufleet-repo.

    python tests/sim/fleet.py image            # build the node image if its recipe changed
    python tests/sim/fleet.py image --release trixie   # the Debian 13 node image
    python tests/sim/fleet.py repo             # build the local package repository
    python tests/sim/fleet.py up               # the fleet of inventories/sim
    python tests/sim/fleet.py up --node gpu1=t4-1 --node cpu1=none
    python tests/sim/fleet.py up --node gpu13=a100-pcie-2@trixie   # a Debian 13 node
    python tests/sim/fleet.py up --count 20 --profile t4-1 --write-inventory out/hosts.yml
    python tests/sim/fleet.py up --copy-of sim-node01 --node sim-node02=t4-1  # a benchmark's
                                               # shortcut: a copy of a converged node's disk
    python tests/sim/fleet.py snapshot sim-node01   # that copy as an image, its tag printed,
    python tests/sim/fleet.py up --from-snapshot TAG --node sim-node03=t4-1   # to start from
    python tests/sim/fleet.py up --privileged --node site1=t4-1   # a node that can run
                                               # containers (a writable cgroup tree)
    python tests/sim/fleet.py list | status | reboot NODE | down [NODE ...]
    python tests/sim/fleet.py drift NODE stop-service nvidia-persistenced
    python tests/sim/fleet.py fault NODE xid --gpu 0 --code 79   # or ecc-dbe, remap-pending,
                                               # remap-failure, lost, throttle, pcie-degraded
    python tests/sim/fleet.py fault NODE clear
    python tests/sim/fleet.py cluster          # a control plane with one Node per running node
    python tests/sim/fleet.py cluster-down     # stop it (see tests/sim/cluster.py)
    python tests/sim/fleet.py slurm sim-cpu sim-t4 sim-a100  # Slurm: controller, GPU nodes
    python tests/sim/fleet.py slurm-down       # stop it (see tests/sim/slurm.py)

Podman reads its settings from tests/sim/containers.conf through CONTAINERS_CONF;
the host's /etc/containers is never touched.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

import cluster
import slurm

SIM_DIR = Path(__file__).resolve().parent
PROJECT = SIM_DIR.parent.parent
KIT_DIR = SIM_DIR / "kit"
IMAGE_RECIPE = SIM_DIR / "image" / "build-rootfs.sh"
NVML_DIR = SIM_DIR / "nvml"
REPO_DIR = SIM_DIR / "repo"
CACHE = Path(os.environ.get("GPUFLEET_CACHE", PROJECT / ".cache"))
IMAGE_NAME = "localhost/gpufleet-node"
LABEL = "gpufleet.sim"
REPO_MOUNT = "/srv/gpufleet-repo"
# Where the local repository's key is pinned: each inventory of the simulated fleet.
REPO_KEY_VARS = tuple(
    PROJECT / "inventories" / name / "group_vars" / "all" / "repository-key.yml"
    for name in ("sim", "sim-k8s")
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_INVENTORY = PROJECT / "inventories" / "sim"
# The Debian releases a node can run (its inventory's `gpusim_release`, or
# NAME=PROFILE@RELEASE): 12 "bookworm" unless a node names another.
RELEASES = ("bookworm", "trixie")
DEFAULT_RELEASE = "bookworm"
BOOT_TIMEOUT = 90.0

os.environ.setdefault("CONTAINERS_CONF", str(SIM_DIR / "containers.conf"))


class FleetError(RuntimeError):
    pass


@dataclass(frozen=True)
class NodeSpec:
    name: str
    profile: str
    release: str = DEFAULT_RELEASE


def _run(
    cmd: Sequence[str], *, check: bool = True, capture: bool = True, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(cmd), text=True, capture_output=capture, check=False, timeout=timeout
    )
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip()
        raise FleetError(f"{' '.join(cmd[:3])} … failed ({result.returncode}): {detail}")
    return result


def podman(
    *args: str, check: bool = True, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    return _run(["podman", *args], check=check, timeout=timeout)


# --- content hashes -------------------------------------------------------------


def tree_hash(paths: Iterable[Path]) -> str:
    """Hash of file names and contents (and symlink targets), order-independent."""
    digest = hashlib.sha256()
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(p for p in path.rglob("*") if p.is_file() or p.is_symlink())
        else:
            files.append(path)
    for file in sorted(f for f in files if "__pycache__" not in f.parts):
        digest.update(str(file.relative_to(PROJECT)).encode())
        digest.update(b"\0")
        if file.is_symlink():
            digest.update(b"->" + os.readlink(file).encode())
        else:
            digest.update(file.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def image_tag(release: str = DEFAULT_RELEASE) -> str:
    """The image of a `release` node: the recipe's hash, with the release's name
    after it for any release but the default."""
    digest = tree_hash([IMAGE_RECIPE, KIT_DIR, NVML_DIR])
    return (
        f"{IMAGE_NAME}:{digest}"
        if release == DEFAULT_RELEASE
        else f"{IMAGE_NAME}:{digest}-{release}"
    )


def build_mock_nvml() -> Path:
    """The mock libnvidia-ml.so.1 (tests/sim/nvml/build.sh; cached outside the clone)."""
    built = _run(["bash", str(NVML_DIR / "build.sh")])
    return Path(built.stdout.strip().splitlines()[-1])


def build_image(mirror: str, release: str = DEFAULT_RELEASE) -> str:
    if release not in RELEASES:
        raise FleetError(f"unknown Debian release {release!r}; known: {', '.join(RELEASES)}")
    tag = image_tag(release)
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    print(f"building image {tag} (debootstrap from {mirror}; about a minute)", file=sys.stderr)
    mock_nvml = build_mock_nvml()
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as work:
        rootfs = Path(work) / "rootfs"
        log = CACHE / f"image-build-{release}.log"
        with log.open("w") as handle:
            built = subprocess.run(
                [
                    "bash",
                    *(str(p) for p in (IMAGE_RECIPE, rootfs, KIT_DIR)),
                    mirror,
                    str(mock_nvml),
                    release,
                ],
                stdout=handle,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if built.returncode != 0:
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
            raise FleetError(f"image recipe failed ({built.returncode}); end of {log}:\n{tail}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["podman", "import", "--change", "CMD=/sbin/init", "-", tag],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise FleetError(f"podman import failed: {imported.stderr.strip()}")
    latest = "latest" if release == DEFAULT_RELEASE else f"latest-{release}"
    podman("tag", tag, f"{IMAGE_NAME}:{latest}")
    print(f"built {tag}", file=sys.stderr)
    return tag


def repo_path() -> Path:
    return CACHE / "repo"


def build_repo() -> Path:
    """Build (or reuse) the local repository; pin its signing key in the sim inventories."""
    sys.path.insert(0, str(REPO_DIR))
    from build_repo import (  # type: ignore[import-not-found]
        FINGERPRINT_FILE,
        RELEASE_SUMS,
        build,
    )

    repo = build(REPO_DIR, repo_path())
    (mig_manager,) = (repo / RELEASE_SUMS).read_text().split()[:1]
    pin_repo_key((repo / FINGERPRINT_FILE).read_text().strip(), mig_manager)
    return repo


def pin_repo_key(
    fingerprint: str, mig_manager_sha256: str, paths: Sequence[Path] = REPO_KEY_VARS
) -> None:
    """Write the fingerprint of the repository's key, and the checksum of the release
    package of nvidia-mig-manager beside it, where every sim inventory reads them.

    Both are made with the repository, so they are known only once it is built: this
    file (not committed) is to the simulated fleet what a site's group_vars naming its
    mirror's key and its copies' checksums are to a real one.
    """
    text = (
        "---\n# Written by tests/sim/fleet.py (not committed): the fingerprint of the local\n"
        "# repository's signing key, generated with it, and the checksum of the release\n"
        "# package of nvidia-mig-manager it serves; simulation.yml pins the roles to them.\n"
        f"gpufleet_sim_repo_key_fingerprint: {fingerprint}\n"
        f"gpufleet_sim_mig_manager_checksum: sha256:{mig_manager_sha256}\n"
    )
    for path in paths:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


# --- nodes ----------------------------------------------------------------------


def inventory_nodes(inventory: Path) -> list[NodeSpec]:
    """Hosts of a simulated-fleet inventory, with their `gpusim_profile` (and
    `gpusim_release`) host variables."""
    ansible_inventory = shutil.which("ansible-inventory", path=str(Path(sys.executable).parent))
    if not ansible_inventory:
        ansible_inventory = "ansible-inventory"
    data = json.loads(_run([ansible_inventory, "-i", str(inventory), "--list"]).stdout)
    hostvars = data.get("_meta", {}).get("hostvars", {})
    specs = []
    for host, variables in sorted(hostvars.items()):
        profile = variables.get("gpusim_profile")
        if profile is None:
            raise FleetError(f"{inventory}: host {host} has no gpusim_profile variable")
        release = str(variables.get("gpusim_release") or DEFAULT_RELEASE)
        specs.append(NodeSpec(host, str(profile), release))
    if not specs:
        raise FleetError(f"{inventory}: no hosts")
    return specs


def running_nodes() -> list[dict[str, str]]:
    out = podman("ps", "-a", "--filter", f"label={LABEL}=1", "--format", "json").stdout
    nodes = []
    for item in json.loads(out or "[]"):
        labels = item.get("Labels") or {}
        nodes.append(
            {
                "name": item["Names"][0],
                "profile": labels.get(f"{LABEL}.profile", "?"),
                "release": labels.get(f"{LABEL}.release", DEFAULT_RELEASE),
                "state": item.get("State", "?"),
                "image": item.get("Image", "?"),
            }
        )
    return sorted(nodes, key=lambda n: n["name"])


def wait_booted(name: str, timeout: float = BOOT_TIMEOUT) -> str:
    deadline = time.monotonic() + timeout
    state = "unknown"
    while time.monotonic() < deadline:
        result = podman("exec", name, "systemctl", "is-system-running", check=False)
        state = result.stdout.strip()
        if state in ("running", "degraded"):
            return state
        time.sleep(0.5)
    raise FleetError(f"{name}: systemd did not finish booting in {timeout:.0f}s (state {state})")


def start_node(spec: NodeSpec, tag: str, repo: Path, privileged: bool = False) -> None:
    """Start a node; one whose profile, image, repository or privilege changed is
    recreated. A privileged node can start containers of its own (runc needs a writable
    cgroup tree and the capabilities to make namespaces), as molecule's runtime node does."""
    repo_hash = f"{(repo / '.source-hash').read_text().strip()}@{repo}"
    existing = podman("container", "exists", spec.name, check=False).returncode == 0
    if existing:
        inspect = json.loads(podman("inspect", spec.name).stdout)[0]
        labels = inspect["Config"].get("Labels") or {}
        if (
            labels.get(f"{LABEL}.profile") == spec.profile
            and labels.get(f"{LABEL}.repo") == repo_hash
            and labels.get(f"{LABEL}.privileged", "0") == str(int(privileged))
            and inspect.get("ImageName") == tag
        ):
            if not inspect["State"]["Running"]:
                podman("start", spec.name)
            return
        podman("rm", "-f", "-t", "0", spec.name)
    podman(
        "run",
        "-d",
        "--name",
        spec.name,
        "--hostname",
        spec.name,
        "--systemd=always",
        # A reboot inside the node (shutdown -r) ends the container; podman starts it
        # again, as a machine's firmware would.
        "--restart=always",
        *(["--privileged"] if privileged else []),
        # The simulated driver's /proc entries (/proc/driver/nvidia-caps/mig-minors,
        # which NVIDIA's tools read) need a writable /proc/driver.
        "--mount=type=tmpfs,destination=/proc/driver",
        "--label",
        f"{LABEL}=1",
        "--label",
        f"{LABEL}.profile={spec.profile}",
        "--label",
        f"{LABEL}.release={spec.release}",
        "--label",
        f"{LABEL}.repo={repo_hash}",
        "--label",
        f"{LABEL}.privileged={int(privileged)}",
        "--env",
        f"GPUSIM_PROFILE={spec.profile}",
        "--volume",
        f"{repo}:{REPO_MOUNT}:ro",
        tag,
        "/sbin/init",
    )


def snapshot(source: str) -> str:
    """An image of a node's disk as it is now (podman commit): nodes started from it
    boot as that node would after a restart. For benchmarks of a converged fleet, and
    tests whose subject comes after onboarding, which would otherwise onboard every node."""
    tag = f"localhost/gpufleet-node-copy:{source}"
    podman("commit", "--quiet", source, tag)
    return tag


# A converged GPU node holds nine inotify instances (systemd six, dbus, logind and
# gpg-agent the rest; a freshly booted node six), counted against one limit for all
# of root's processes. Counted for converged nodes: the benchmark's --copies start
# from one, and with six a 20-node fleet passed the check at the default 128 and its
# 14th node then booted degraded.
INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_PER_NODE = 9


def check_inotify(nodes: int, limit_file: Path = INOTIFY_LIMIT) -> None:
    """Refuse to start more nodes than the host's inotify limit lets boot (systemd in
    the later ones would fail, and the error would only be a boot timeout)."""
    limit = int(limit_file.read_text())
    if nodes * INOTIFY_PER_NODE > limit:
        raise FleetError(
            f"{nodes} nodes need about {nodes * INOTIFY_PER_NODE} inotify instances, and "
            f"fs.inotify.max_user_instances is {limit}: systemd would not boot in the later "
            f"nodes. Raise it first (sysctl -w fs.inotify.max_user_instances="
            f"{max(1024, nodes * INOTIFY_PER_NODE * 2)})"
        )


def profiles() -> list[str]:
    """The GPU profiles a node can boot with (kit/profiles; models.yaml is their
    catalogue of GPU models, not a profile)."""
    return sorted(p.stem for p in (KIT_DIR / "profiles").glob("*.yaml") if p.stem != "models")


def up(
    specs: Sequence[NodeSpec],
    mirror: str,
    copy_of: str | None = None,
    image: str | None = None,
    privileged: bool = False,
) -> None:
    """Start `specs`, each from its release's image (or all from a copy of `copy_of`, or
    from `image`, a snapshot taken before), privileged where asked (see start_node)."""
    if copy_of in {s.name for s in specs}:
        raise FleetError(f"--copy-of {copy_of}: the node copied cannot be one of those started")
    known = profiles()
    unknown = [f"{s.name}={s.profile}" for s in specs if s.profile not in known]
    if unknown:
        raise FleetError(f"unknown GPU profile: {', '.join(unknown)}; known: {', '.join(known)}")
    running = {n["name"] for n in running_nodes() if n["state"] == "running"}
    check_inotify(len(running | {s.name for s in specs}))
    releases = {spec.release for spec in specs}
    if image:
        tags = dict.fromkeys(releases, image)
    elif copy_of:
        tags = dict.fromkeys(releases, snapshot(copy_of))
    else:
        tags = {release: build_image(mirror, release) for release in sorted(releases)}
    repo = build_repo()
    for spec in specs:
        start_node(spec, tags[spec.release], repo, privileged)
    for spec in specs:
        state = wait_booted(spec.name)
        print(f"{spec.name}: {spec.profile} on {spec.release} ({state})")


def down(names: Sequence[str]) -> None:
    targets = list(names) or [n["name"] for n in running_nodes()]
    if targets:
        podman("rm", "-f", "-t", "0", *targets)
    for name in targets:
        print(f"{name}: removed")


def reboot(name: str) -> None:
    """Power-cycle a node: /run (and with it the simulated hardware state) starts afresh."""
    podman("restart", "-t", "5", name)
    print(f"{name}: {wait_booted(name)}")


def node_status(name: str) -> dict[str, object]:
    result = podman("exec", name, "/opt/gpusim/bin/gpusim", "status", "--json", check=False)
    if result.returncode != 0:
        return {"node": name, "error": result.stderr.strip() or "not reachable"}
    status: dict[str, object] = json.loads(result.stdout)
    return status


def write_inventory(specs: Sequence[NodeSpec], path: Path) -> None:
    hosts: dict[str, dict[str, str]] = {s.name: {"gpusim_profile": s.profile} for s in specs}
    for spec in specs:
        if spec.release != DEFAULT_RELEASE:
            hosts[spec.name]["gpusim_release"] = spec.release
    document = {
        "all": {
            "children": {"gpu_nodes": {"hosts": hosts}},
        }
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# Written by tests/sim/fleet.py; variables come from inventories/sim/group_vars.\n"
    path.write_text(text + yaml.safe_dump(document, sort_keys=True), encoding="utf-8")


def _parse_node(value: str) -> NodeSpec:
    name, sep, profile = value.partition("=")
    profile, at, release = profile.partition("@")
    if not sep or not name or not profile or (at and release not in RELEASES):
        raise argparse.ArgumentTypeError(
            f"expected NAME=PROFILE or NAME=PROFILE@RELEASE (release one of "
            f"{', '.join(RELEASES)}), got {value!r}"
        )
    return NodeSpec(name, profile, release or DEFAULT_RELEASE)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fleet.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mirror", default=os.environ.get("GPUFLEET_DEBIAN_MIRROR", DEFAULT_MIRROR)
    )
    sub = parser.add_subparsers(dest="command", required=True)
    image = sub.add_parser(
        "image", help="build the node image if its recipe changed; print its tag"
    )
    image.add_argument("--release", choices=RELEASES, default=DEFAULT_RELEASE)
    sub.add_parser("repo", help="build the local signed package repository")
    start = sub.add_parser("up", help="start nodes (default: the hosts of inventories/sim)")
    start.add_argument("-i", "--inventory", type=Path, default=DEFAULT_INVENTORY)
    start.add_argument(
        "--node", action="append", type=_parse_node, default=[], metavar="NAME=PROFILE[@RELEASE]"
    )
    start.add_argument("--count", type=int, help="start COUNT nodes of --profile")
    start.add_argument("--profile", default="t4-1")
    start.add_argument("--prefix", default="sim-node")
    start.add_argument("--write-inventory", type=Path, metavar="FILE")
    source = start.add_mutually_exclusive_group()
    source.add_argument(
        "--copy-of",
        metavar="NODE",
        help="start the nodes from a copy of NODE's disk (a benchmark's shortcut past onboarding)",
    )
    source.add_argument(
        "--from-snapshot",
        metavar="TAG",
        help="start the nodes from a snapshot taken before (see `snapshot`)",
    )
    start.add_argument(
        "--privileged",
        action="store_true",
        help="start the nodes privileged, so that they can run containers themselves",
    )
    shot = sub.add_parser("snapshot", help="copy a node's disk into an image; print its tag")
    shot.add_argument("name")
    stop = sub.add_parser("down", help="remove nodes (default: every simulated node)")
    stop.add_argument("names", nargs="*")
    sub.add_parser("list", help="list simulated nodes")
    sub.add_parser("status", help="simulated hardware and driver state of each node")
    restart = sub.add_parser("reboot", help="power-cycle a node")
    restart.add_argument("name")
    wait = sub.add_parser("wait", help="wait until a node's systemd has finished booting")
    wait.add_argument("name")
    drift = sub.add_parser("drift", help="inject drift on a node (see `gpusim drift -h`)")
    drift.add_argument("name")
    drift.add_argument("drift_args", nargs=argparse.REMAINDER)
    fault = sub.add_parser("fault", help="inject a GPU fault on a node (see `gpusim fault -h`)")
    fault.add_argument("name")
    fault.add_argument("fault_args", nargs=argparse.REMAINDER)
    cluster_parser = sub.add_parser(
        "cluster",
        help="start (or keep) the test control plane, register one Node per running "
        "simulated node (or per NODE named); print the kubeconfig's path",
    )
    cluster_parser.add_argument(
        "nodes", nargs="*", metavar="NODE", help="register only these simulated nodes"
    )
    sub.add_parser("cluster-down", help="stop the test control plane and forget it")
    slurm_parser = sub.add_parser(
        "slurm",
        help="start or refresh Slurm: slurmctld on CONTROLLER, slurmd on each NODE; print "
        "what Slurm reports for each node",
    )
    slurm_parser.add_argument("controller", metavar="CONTROLLER")
    slurm_parser.add_argument("nodes", nargs="+", metavar="NODE")
    sub.add_parser("slurm-down", help="stop Slurm's daemons and forget the cluster")
    args = parser.parse_args(argv)

    try:
        if args.command == "image":
            print(build_image(args.mirror, args.release))
        elif args.command == "repo":
            print(build_repo())
        elif args.command == "up":
            if args.count:
                specs = [
                    NodeSpec(f"{args.prefix}{i:02d}", args.profile)
                    for i in range(1, args.count + 1)
                ]
            elif args.node:
                specs = args.node
            else:
                specs = inventory_nodes(args.inventory)
            up(specs, args.mirror, args.copy_of, args.from_snapshot, args.privileged)
            if args.write_inventory:
                write_inventory(specs, args.write_inventory)
        elif args.command == "snapshot":
            print(snapshot(args.name))
        elif args.command == "down":
            down(args.names)
        elif args.command == "list":
            for node in running_nodes():
                print(
                    f"{node['name']:<20} {node['profile']:<20} {node['release']:<9} "
                    f"{node['state']:<10} {node['image']}"
                )
        elif args.command == "status":
            for node in running_nodes():
                print(json.dumps(node_status(node["name"]), sort_keys=True))
        elif args.command == "reboot":
            reboot(args.name)
        elif args.command == "wait":
            print(wait_booted(args.name))
        elif args.command == "cluster":
            running = [n["name"] for n in running_nodes() if n["state"] == "running"]
            missing = sorted(set(args.nodes) - set(running))
            if missing:
                raise FleetError(f"not running simulated nodes: {', '.join(missing)}")
            print(cluster.up(args.nodes or running))
        elif args.command == "cluster-down":
            for name in cluster.down():
                print(f"{name}: stopped")
        elif args.command == "slurm":
            running = {n["name"] for n in running_nodes() if n["state"] == "running"}
            missing = sorted({args.controller, *args.nodes} - running)
            if missing:
                raise FleetError(f"not running simulated nodes: {', '.join(missing)}")
            for name, node in slurm.up(args.controller, args.nodes).items():
                print(f"{name}: {node.get('State')} gres={node.get('Gres')}")
        elif args.command == "slurm-down":
            for name in slurm.down():
                print(f"{name}: stopped")
        elif args.command in ("drift", "fault"):
            verb_args = args.drift_args if args.command == "drift" else args.fault_args
            result = podman(
                "exec", args.name, "/opt/gpusim/bin/gpusim", args.command, *verb_args, check=False
            )
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
            return result.returncode
    except (FleetError, cluster.ClusterError, slurm.SlurmError) as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

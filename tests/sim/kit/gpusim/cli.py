"""Entry points of the simulation kit, chosen by the name a program is called by.

/opt/gpusim/bin holds one launcher per name: gpusim, modprobe, rmmod and
nvidia-persistenced. Each refuses to run on a host that is not a simulated node.
(nvidia-smi is Debian's own, running on the mock NVML: tests/sim/nvml.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import faults, node, profiles

REAL_MODPROBE = "/usr/sbin/modprobe"


def _is_nvidia_module(name: str) -> bool:
    return name in node.MODULE_ALIASES


def modprobe(argv: Sequence[str]) -> int:
    remove = any(a in ("-r", "--remove") for a in argv)
    quiet = any(a in ("-q", "--quiet") for a in argv)
    # Module parameters (NVreg_...=value) follow the module name; they change nothing here.
    names = [a for a in argv if not a.startswith("-") and "=" not in a]
    if not names or not all(_is_nvidia_module(n) for n in names):
        # Not ours: the real modprobe (it will find no modules for the host kernel).
        os.execv(REAL_MODPROBE, ["modprobe", *argv])
    try:
        for name in names:
            if remove:
                node.unload_module(name)
            else:
                node.load_module(name)
    except node.ModuleError as exc:
        if not quiet:
            print(exc, file=sys.stderr)
        return 1
    return 0


def rmmod(argv: Sequence[str]) -> int:
    names = [a for a in argv if not a.startswith("-")]
    if names and all(_is_nvidia_module(n) for n in names):
        try:
            for name in names:
                node.unload_module(name)
        except node.ModuleError as exc:
            print(
                str(exc).replace("modprobe: FATAL: Module", "rmmod: ERROR: Module"), file=sys.stderr
            )
            return 1
        return 0
    os.execv("/usr/sbin/rmmod", ["rmmod", *argv])


PERSISTENCED_PIDFILE = Path("/var/run/nvidia-persistenced/nvidia-persistenced.pid")
# The real daemon's RPC socket, which `nvidia-ctk cdi generate` mounts into containers;
# here it serves the mock NVML inside them (node.nvml_snapshot).
PERSISTENCED_SOCKET = Path("/var/run/nvidia-persistenced/socket")


def persistenced(argv: Sequence[str]) -> int:
    """Daemonise like nvidia-persistenced and hold persistence mode on while running."""
    if node.loaded_driver() is None:
        real = node.real_binary("/usr/bin/nvidia-persistenced")
        if real:
            os.execv(real, ["nvidia-persistenced", *argv])
        print(
            "nvidia-persistenced failed to initialize. Check syslog for more details.",
            file=sys.stderr,
        )
        return 1
    if os.fork() > 0:
        # Parent of a Type=forking service: return once the pid file is written.
        for _ in range(50):
            if PERSISTENCED_PIDFILE.exists():
                return 0
            time.sleep(0.1)
        return 1
    os.setsid()
    flag = node.RUN / "persistence-mode"
    # Like the real daemon, hold every GPU's device file open while running: the
    # module cannot be unloaded under it. (A GPU that failed to start has none here.)
    held = [
        path.open("rb") for path in node.device_files("nvidia", node.profile()) if path.exists()
    ]

    def stop(_signum: int, _frame: object) -> None:
        flag.unlink(missing_ok=True)
        PERSISTENCED_SOCKET.unlink(missing_ok=True)
        PERSISTENCED_PIDFILE.unlink(missing_ok=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    flag.touch()
    PERSISTENCED_PIDFILE.parent.mkdir(parents=True, exist_ok=True)
    PERSISTENCED_SOCKET.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(PERSISTENCED_SOCKET))
    PERSISTENCED_SOCKET.chmod(0o666)
    server.listen(16)
    PERSISTENCED_PIDFILE.write_text(f"{os.getpid()}\n")
    while held:
        client, _ = server.accept()
        with client, contextlib.suppress(OSError):
            client.sendall(node.nvml_snapshot())
    return 1


IN_KERNEL_VIEW = "GPUSIM_KERNEL_VIEW"


def kernel_view(command: Sequence[str]) -> int:
    """Run `command` with the node's view of /proc/modules and the PCI devices
    (node.kernel_view_argv).

    Inside its user namespace NVML cannot create the MIG instances' capability device
    files (nvidia-modprobe's job on a real node); they are made once it is done.
    """
    if os.environ.get(IN_KERNEL_VIEW):
        os.execvp(command[0], list(command))
    with node.held_gpus_service() as held:
        done = subprocess.run(
            node.kernel_view_argv(command),
            env=dict(os.environ, **held, **{IN_KERNEL_VIEW: "1"}),
            check=False,
        )
    node.create_instance_device_files()
    return done.returncode


def mig_parted(argv: Sequence[str]) -> int:
    """NVIDIA's nvidia-mig-parted (the package's, moved aside) in the node's kernel view."""
    real = node.real_binary("/usr/bin/nvidia-mig-parted")
    if real is None:
        print("nvidia-mig-parted: the nvidia-mig-manager package is not installed", file=sys.stderr)
        return 127
    return kernel_view([real, *argv])


def _status() -> dict[str, object]:
    prof = node.profile()
    installed = node.installed_driver(prof)
    return {
        "node": node.node_name(),
        "profile": prof.name,
        "description": prof.description,
        "gpus": len(prof.gpus),
        "nvswitches": len(prof.nvswitches),
        "sysfs_root": str(node.SYS),
        "driver_installed": installed.__dict__ if installed else None,
        "driver_loaded": node.loaded_driver(),
        "nouveau_loaded": node.loaded("nouveau"),
        "persistence_mode": node.persistence_enabled(),
    }


def _drift(args: argparse.Namespace) -> int:
    if args.kind == "edit-file":
        path = Path(args.target)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(args.text + "\n")
        return 0
    if args.kind == "stop-service":
        return subprocess.run(["systemctl", "stop", args.target], check=False).returncode
    if args.kind == "remove-package":
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        return subprocess.run(
            ["apt-get", "remove", "-y", "--allow-change-held-packages", args.target],
            check=False,
            env=env,
        ).returncode
    if args.kind == "driver-version":
        node.set_loaded_version(args.target)
        return 0
    raise AssertionError(args.kind)


def gpusim(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpusim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("boot", help="lay out the simulated hardware (run at boot)")
    sub.add_parser("sync", help="place simulated driver binaries (dpkg post-invoke hook)")
    view = sub.add_parser(
        "kernel-view", help="run a command with the node's /proc/modules and PCI devices"
    )
    view.add_argument("argv", nargs=argparse.REMAINDER, metavar="command")
    status = sub.add_parser("status", help="what is simulated on this node")
    status.add_argument("--json", action="store_true")
    load = sub.add_parser("load", help="load a simulated module")
    load.add_argument("module")
    unload = sub.add_parser("unload", help="unload a simulated module")
    unload.add_argument("module")
    drift = sub.add_parser("drift", help="inject drift for tests")
    drift.add_argument(
        "kind", choices=["edit-file", "stop-service", "remove-package", "driver-version"]
    )
    drift.add_argument("target", help="file, unit, package or driver version")
    drift.add_argument(
        "--text", default="# drift injected by gpusim", help="line appended by edit-file"
    )
    fault = sub.add_parser("fault", help="inject a GPU fault (or clear them all)")
    fault.add_argument("kind", choices=[*faults.KINDS, "clear"])
    fault.add_argument("--gpu", type=int, default=0, help="the GPU's index (default 0)")
    fault.add_argument("--code", type=int, help="the Xid of an xid fault")
    reset = sub.add_parser(
        "reset-gpu", help="clear what a reset of the GPU clears (the mock NVML's reset runs it)"
    )
    reset.add_argument("index", type=int)
    args = parser.parse_args(argv)

    if args.command == "boot":
        prof = node.boot()
        print(f"gpusim: {node.node_name()} boots as profile {prof.name} ({prof.description})")
        return 0
    if args.command == "sync":
        node.link_driver_binaries()
        return 0
    if args.command == "kernel-view":
        return kernel_view(args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
    if args.command == "status":
        data = _status()
        if args.json:
            print(json.dumps(data, indent=2, sort_keys=True))
        else:
            for key, value in data.items():
                print(f"{key}: {value}")
        return 0
    if args.command == "reset-gpu":
        faults.at_reset(args.index)
        return 0
    if args.command == "fault":
        if args.kind == "clear":
            faults.clear()
            print("gpusim: every fault cleared")
            return 0
        try:
            print(f"gpusim: {faults.inject(node.profile(), args.kind, args.gpu, args.code)}")
        except ValueError as exc:
            print(f"gpusim: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        if args.command == "load":
            node.load_module(args.module)
            return 0
        if args.command == "unload":
            node.unload_module(args.module)
            return 0
        return _drift(args)
    except node.ModuleError as exc:
        print(exc, file=sys.stderr)
        return 1


ENTRY_POINTS = {
    "gpusim": gpusim,
    "modprobe": modprobe,
    "rmmod": rmmod,
    "nvidia-persistenced": persistenced,
    "nvidia-mig-parted": mig_parted,
}


def main() -> int:
    name = Path(sys.argv[0]).name
    entry = ENTRY_POINTS.get(name, gpusim)
    try:
        node.require_simulated_node()
    except node.NotASimulatedNode as exc:
        print(exc, file=sys.stderr)
        return 127
    try:
        return entry(sys.argv[1:])
    except profiles.ProfileError as exc:
        print(f"gpusim: {exc}", file=sys.stderr)
        return 1

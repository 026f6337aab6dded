"""Build the local signed apt repositories of stand-in NVIDIA packages (a test fixture).

NVIDIA's package repositories cannot be reached from our build machines, so the
simulated nodes install from local copies laid out like the upstream ones:

    <out>/libnvidia-container/gpgkey                        ASCII-armoured signing key
    <out>/libnvidia-container/stable/deb/amd64/             flat repo, suite "/"
    <out>/cuda/repos/debian12/x86_64/                       flat repo, suite "/"
    <out>/cuda/repos/debian12/x86_64/3bf863cc.pub           its signing key
    <out>/cuda/repos/debian13 -> debian12                   the same, for Debian 13 nodes

Package names, versions and installed paths are the upstream ones. `nvidia-ctk`,
`nvidia-container-runtime`, `nvidia-container-runtime-hook` and `nvidia-cdi-hook` are
NVIDIA's own, built from the container toolkit's Go module at each version
(tests/sim/toolkit/build.sh), with the default config.toml that `nvidia-ctk config
default` writes, and from 1.18 on the toolkit's own CDI refresh units, their
environment file and its base package's postinst, taken from the same module (where
its .install file puts them, with what debhelper adds to the maintainer scripts); the
other contents (libnvidia-container, DCGM, DCGM Exporter, the fabric manager) are
small stand-ins (tests/sim/repo/standins) that behave enough like
upstream for the roles. Each
repository is signed with a throwaway key made when it is built, so apt's signature
checking is exercised for real. The output is rebuilt only when this file, the
stand-ins, the toolkit's build or mig-parted's build change.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

TOOLKIT_REPO = "libnvidia-container/stable/deb/amd64"
CUDA_REPO = "cuda/repos/debian12/x86_64"
CUDA_REPO_DEBIAN13 = "cuda/repos/debian13"
# The signing key's fingerprint, at the top of the built tree (not served to nodes
# as anything they trust: the inventory pins it, see tests/sim/fleet.py).
FINGERPRINT_FILE = "signing-key.fingerprint"
# The newest is the default a node installs; 1.17.8 is the older release the upgrade
# and rollback tests start from, and 1.19.1 the last to keep its refresh units in
# /etc/systemd/system (1.20 moved them).
TOOLKIT_VERSIONS = ("1.17.8-1", "1.19.1-1", "1.20.0-1")
# DCGM 4 (its core package, with the host engine and nvidia-dcgm.service) and
# NVIDIA's exporter package, in the CUDA repository under these names since DCGM 4
# (versions of package files NVIDIA has published; their pairing is not checked here).
DCGM_VERSION = "1:4.5.2-1"
EXPORTER_VERSION = "4.8.2-1"
# Fabric manager must match the driver version exactly: one build per driver the
# simulated nodes can run (Debian 12's 535 builds, and a 550 for upgrades).
FABRICMANAGER_VERSIONS = ("535.261.03-1", "535.309.01-1", "550.127.05-1")
LIBDIR = "/usr/lib/x86_64-linux-gnu"
TOOLKIT_BUILD = Path(__file__).resolve().parent.parent / "toolkit" / "build.sh"
# NVIDIA's mig-parted and the files its nvidia-mig-manager package installs (its
# deployments/systemd), built and taken from its Go module by this script.
MIGPARTED_BUILD = Path(__file__).resolve().parent.parent / "migparted" / "build.sh"
MIG_MANAGER_VERSION = "0.10.0-1"
# Upstream publishes nvidia-mig-manager as assets of mig-parted's releases, not in a
# package repository: served here under the same path as on GitHub, with the sha256
# of each asset in RELEASE_SUMS at the top of the built tree (what a site's mirror
# records beside its copies).
MIG_RELEASES = "mig-parted/releases/download"
RELEASE_SUMS = "release-assets.sha256"
# Sources of package files that are not stand-ins: NVIDIA's binaries of the toolkit
# version being packaged, and the config its nvidia-ctk writes by default.
REAL = "toolkit:"
DEFAULT_CONFIG = "toolkit-config:"
# Files of the toolkit's own source (its Go module) that its packages install: the CDI
# refresh units and their environment file (deployments/systemd) and the base package's
# maintainer script (packaging/debian), as NVIDIA's packages of that version carry them.
TOOLKIT_SOURCE = "toolkit-source:"
MIG = "mig-parted:"
# What debhelper puts at #DEBHELPER# in nvidia-mig-manager's postinst (its rules use
# dh --with systemd, which enables the unit on installation and does not start it).
DH_ENABLE = (
    'if [ "$1" = configure ]; then deb-systemd-helper enable nvidia-mig-manager.service '
    ">/dev/null || true; fi"
)
# The toolkit's base package: its Debian packaging directory in the Go module.
TOOLKIT_DEBIAN = "packaging/debian/"


@functools.cache
def _built(script: Path, *args: str) -> Path:
    """The directory a build script (tests/sim/*/build.sh) printed last; built once."""
    built = subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, check=False
    )
    if built.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args)}: {built.stderr}")
    return Path(built.stdout.strip().splitlines()[-1])


def toolkit_bin(upstream_version: str) -> Path:
    """Where tests/sim/toolkit/build.sh put the toolkit's binaries of this version."""
    return _built(TOOLKIT_BUILD, upstream_version)


@functools.cache
def toolkit_source(upstream_version: str) -> Path:
    """The toolkit's Go module source of this version (downloaded by its build)."""
    found = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/nvidia-container-toolkit"],
        cwd=TOOLKIT_BUILD.parent / f"v{upstream_version}",
        env={**os.environ, "GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": "local", "GOSUMDB": "off"},
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0 or not found.stdout.strip():
        raise RuntimeError(f"the toolkit {upstream_version}'s source: {found.stderr}")
    return Path(found.stdout.strip())


def migparted_dir() -> Path:
    """Where tests/sim/migparted/build.sh put mig-parted (bin/) and upstream's systemd/."""
    return _built(MIGPARTED_BUILD)


@dataclass
class Package:
    name: str
    version: str
    repo: str
    description: str
    depends: str = ""
    # installed path -> (stand-in source name, mode)
    files: dict[str, tuple[str, int]] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)
    conffiles: tuple[str, ...] = ()
    # maintainer script name (postinst, ...) -> source
    scripts: dict[str, str] = field(default_factory=dict)
    # maintainer script name -> what debhelper adds to it (at #DEBHELPER#, or as the
    # whole script where upstream has none)
    debhelper: dict[str, str] = field(default_factory=dict)


def _upstream(version: str) -> str:
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


def packages() -> list[Package]:
    result: list[Package] = []
    for version in TOOLKIT_VERSIONS:
        up = _upstream(version)
        tool_files = {
            "/usr/bin/nvidia-ctk": (REAL + "nvidia-ctk", 0o755),
            "/usr/bin/nvidia-container-runtime": (REAL + "nvidia-container-runtime", 0o755),
            "/usr/bin/nvidia-cdi-hook": (REAL + "nvidia-cdi-hook", 0o755),
            "/etc/nvidia-container-runtime/config.toml": (DEFAULT_CONFIG, 0o644),
        }
        base_scripts: dict[str, str] = {}
        base_debhelper: dict[str, str] = {}
        base_conffiles = ["/etc/nvidia-container-runtime/config.toml"]
        if tuple(int(part) for part in up.split(".")) >= (1, 18):
            # The CDI refresh units first ship with toolkit 1.18, where its Debian
            # packaging puts them (nvidia-container-toolkit-base.install): 1.18 and 1.19
            # in /etc/systemd/system, enabled and started by its postinst; 1.20 in
            # /lib/systemd/system, left to debhelper (below).
            refresh = _toolkit_refresh_files(up)
            for path, name in refresh.items():
                tool_files[path] = (TOOLKIT_SOURCE + "deployments/systemd/" + name, 0o644)
            # dh_installdeb makes every file under /etc a conffile.
            base_conffiles += [path for path in refresh if path.startswith("/etc/")]
            base_scripts["postinst"] = (
                TOOLKIT_SOURCE + TOOLKIT_DEBIAN + "nvidia-container-toolkit-base.postinst"
            )
            base_debhelper = _toolkit_debhelper(up, version, refresh)
        result += [
            Package(
                "libnvidia-container1",
                version,
                TOOLKIT_REPO,
                "NVIDIA container runtime library (gpufleet stand-in)",
                files={f"{LIBDIR}/libnvidia-container.so.{up}": ("libnvidia-container.so", 0o644)},
                symlinks={f"{LIBDIR}/libnvidia-container.so.1": f"libnvidia-container.so.{up}"},
            ),
            Package(
                "libnvidia-container-tools",
                version,
                TOOLKIT_REPO,
                "NVIDIA container runtime library, CLI (gpufleet stand-in)",
                depends=f"libnvidia-container1 (>= {version})",
                files={"/usr/bin/nvidia-container-cli": ("nvidia-container-cli", 0o755)},
            ),
            Package(
                "nvidia-container-toolkit-base",
                version,
                TOOLKIT_REPO,
                "NVIDIA Container Toolkit base (gpufleet build of NVIDIA's binaries)",
                files=tool_files,
                conffiles=tuple(base_conffiles),
                scripts=base_scripts,
                debhelper=base_debhelper,
            ),
            Package(
                "nvidia-container-toolkit",
                version,
                TOOLKIT_REPO,
                "NVIDIA Container Toolkit (gpufleet build of NVIDIA's hook)",
                depends=(
                    f"nvidia-container-toolkit-base (= {version}), "
                    f"libnvidia-container-tools (>= {version}), "
                    "libnvidia-container-tools (<< 2.0.0)"
                ),
                files={
                    "/usr/bin/nvidia-container-runtime-hook": (
                        REAL + "nvidia-container-runtime-hook",
                        0o755,
                    )
                },
            ),
        ]
    result += [
        Package(
            "datacenter-gpu-manager-4-core",
            DCGM_VERSION,
            CUDA_REPO,
            "NVIDIA Data Center GPU Manager 4, core (gpufleet stand-in)",
            files={
                "/usr/bin/nv-hostengine": ("nv-hostengine", 0o755),
                "/usr/bin/dcgmi": ("dcgmi", 0o755),
                "/lib/systemd/system/nvidia-dcgm.service": ("nvidia-dcgm.service", 0o644),
            },
        ),
        # Paths of upstream's package (dcgm-exporter's packaging/ and hack/package/):
        # the binary, its counters and its own unit, which runs the exporter with the
        # default counters and an embedded host engine.
        Package(
            "datacenter-gpu-manager-exporter",
            EXPORTER_VERSION,
            CUDA_REPO,
            "NVIDIA DCGM Exporter (gpufleet stand-in)",
            depends="datacenter-gpu-manager-4-core",
            files={
                "/usr/bin/dcgm-exporter": ("dcgm-exporter", 0o755),
                "/etc/dcgm-exporter/default-counters.csv": ("default-counters.csv", 0o644),
                "/lib/systemd/system/nvidia-dcgm-exporter.service": (
                    "nvidia-dcgm-exporter.service",
                    0o644,
                ),
            },
            conffiles=("/etc/dcgm-exporter/default-counters.csv",),
        ),
    ]
    systemd = "systemd/"
    result.append(
        Package(
            "nvidia-mig-manager",
            MIG_MANAGER_VERSION,
            CUDA_REPO,
            "NVIDIA MIG Partition Editor and systemd service (gpufleet build of NVIDIA's)",
            # Paths and modes of upstream's packaging (deployments/systemd/packages/debian).
            files={
                "/usr/bin/nvidia-mig-parted": (MIG + "bin/nvidia-mig-parted", 0o755),
                "/lib/systemd/system/nvidia-mig-manager.service": (
                    MIG + systemd + "nvidia-mig-manager.service",
                    0o644,
                ),
                "/lib/systemd/system/nvidia-gpu-reset.target": (
                    MIG + systemd + "nvidia-gpu-reset.target",
                    0o644,
                ),
                "/etc/profile.d/nvidia-mig-parted.sh": (
                    MIG + systemd + "nvidia-mig-parted.sh",
                    0o644,
                ),
                "/etc/systemd/system/nvidia-mig-manager.service.d/override.conf": (
                    MIG + systemd + "override.conf",
                    0o644,
                ),
                **{
                    f"/etc/nvidia-mig-manager/{name}": (
                        MIG + systemd + name,
                        0o755 if name == "service.sh" else 0o644,
                    )
                    for name in (
                        "service.sh",
                        "utils.sh",
                        "hooks.sh",
                        "hooks-default.yaml",
                        "hooks-minimal.yaml",
                        "config-default.yaml",
                    )
                },
            },
            conffiles=("/etc/systemd/system/nvidia-mig-manager.service.d/override.conf",),
            scripts={
                "postinst": MIG + systemd + "packages/debian/postinst",
                "postrm": MIG + systemd + "packages/debian/postrm",
            },
            debhelper={"postinst": DH_ENABLE},
        )
    )
    # NVIDIA's CUDA repository also carries driver packages under Debian's names, at
    # other branches: a node that takes its driver from Debian must never pick these.
    result += [
        Package(
            name,
            "580.95.05-1",
            CUDA_REPO,
            "Stands for the CUDA repository's own driver packages (gpufleet stand-in)",
        )
        for name in ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1")
    ]
    for version in FABRICMANAGER_VERSIONS:
        branch = version.split(".", 1)[0]
        result.append(
            Package(
                f"nvidia-fabricmanager-{branch}",
                version,
                CUDA_REPO,
                "NVIDIA fabric manager for NVSwitch systems (gpufleet stand-in)",
                files={
                    "/usr/bin/nv-fabricmanager": ("nv-fabricmanager", 0o755),
                    "/lib/systemd/system/nvidia-fabricmanager.service": (
                        "nvidia-fabricmanager.service",
                        0o644,
                    ),
                    "/usr/share/nvidia/nvswitch/fabricmanager.cfg": ("fabricmanager.cfg", 0o644),
                },
            )
        )
    return result


def _toolkit_refresh_files(upstream_version: str) -> dict[str, str]:
    """Installed path -> file of deployments/systemd, for the refresh units and their
    environment file, where the base package's .install file puts them."""
    debian = toolkit_source(upstream_version) / TOOLKIT_DEBIAN
    install = debian / "nvidia-container-toolkit-base.install"
    found = {}
    for line in install.read_text().splitlines():
        name, _, directory = line.partition(" ")
        if name.startswith("nvidia-cdi-refresh."):
            found[directory.strip().rstrip("/") + "/" + name] = name
    if len(found) != 3:
        raise RuntimeError(f"{install}: expected the three refresh files, found {found}")
    return found


def _toolkit_debhelper(
    upstream_version: str, version: str, refresh: dict[str, str]
) -> dict[str, str]:
    """What debhelper adds to the base package's maintainer scripts: the calls of
    dpkg-maintscript-helper its .maintscript file asks for (at @VERSION@, the package
    version, as its debian/prepare substitutes), and, where its rules build with
    dh --with systemd (1.20 on, compatibility level 9: dh_systemd_enable and
    dh_systemd_start), the enabling, starting and stopping of the units it installs
    under /lib/systemd/system."""
    debian = toolkit_source(upstream_version) / TOOLKIT_DEBIAN
    added: dict[str, list[str]] = {}
    maintscript = debian / "nvidia-container-toolkit-base.maintscript"
    if maintscript.is_file():
        for line in maintscript.read_text().replace("@VERSION@", version).splitlines():
            if line.strip():
                for script in ("preinst", "postinst", "postrm"):
                    added.setdefault(script, []).append(
                        f'dpkg-maintscript-helper {line.strip()} -- "$@"'
                    )
    units = " ".join(
        path.rsplit("/", 1)[1] for path in refresh if path.startswith("/lib/systemd/system/")
    )
    if units and "--with systemd" in (debian / "rules").read_text():
        added.setdefault("postinst", []).append(
            'if [ "$1" = configure ]; then\n'
            f"  for unit in {units}; do deb-systemd-helper enable $unit >/dev/null || true; done\n"
            "  if [ -d /run/systemd/system ]; then\n"
            "    systemctl --system daemon-reload >/dev/null || true\n"
            f"    deb-systemd-invoke start {units} >/dev/null || true\n"
            "  fi\n"
            "fi"
        )
        added.setdefault("prerm", []).append(
            "if [ -d /run/systemd/system ]; then\n"
            f"  deb-systemd-invoke stop {units} >/dev/null || true\n"
            "fi"
        )
        added.setdefault("postrm", []).append(
            'if [ "$1" = remove ] && [ -d /run/systemd/system ]; then\n'
            "  systemctl --system daemon-reload >/dev/null || true\n"
            "fi\n"
            'if [ "$1" = purge ]; then\n'
            f"  for unit in {units}; do deb-systemd-helper purge $unit >/dev/null || true; done\n"
            "fi"
        )
    return {script: "\n".join(lines) for script, lines in added.items()}


def _run(cmd: list[str], **kwargs: object) -> None:
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def _build_deb(pkg: Package, standins: Path, work: Path, out_dir: Path) -> None:
    root = work / f"{pkg.name}_{pkg.version.replace(':', '_')}"
    (root / "DEBIAN").mkdir(parents=True)
    upstream = _upstream(pkg.version)
    for path, (source, mode) in pkg.files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.startswith(REAL):
            shutil.copyfile(toolkit_bin(upstream) / source.removeprefix(REAL), target)
        elif source.startswith(MIG):
            shutil.copyfile(migparted_dir() / source.removeprefix(MIG), target)
        elif source.startswith(TOOLKIT_SOURCE):
            shutil.copyfile(toolkit_source(upstream) / source.removeprefix(TOOLKIT_SOURCE), target)
        elif source == DEFAULT_CONFIG:
            _run(
                [
                    str(toolkit_bin(upstream) / "nvidia-ctk"),
                    "config",
                    "default",
                    f"--output={target}",
                ]
            )
        elif source == "libnvidia-container.so":
            c_file = work / f"lnc-{upstream}.c"
            c_file.write_text(
                (standins / "libnvidia-container.c").read_text().replace("@VERSION@", upstream)
            )
            _run(["gcc", "-shared", "-fPIC", "-o", str(target), str(c_file)])
        else:
            target.write_bytes(
                (standins / source).read_bytes().replace(b"@VERSION@", upstream.encode())
            )
        target.chmod(mode)
    for path, link_target in pkg.symlinks.items():
        link = root / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(link_target)
    control = [
        f"Package: {pkg.name}",
        f"Version: {pkg.version}",
        "Architecture: amd64",
        "Maintainer: gpufleet test fixtures <gpufleet@localhost>",
        "Section: utils",
        "Priority: optional",
    ]
    if pkg.depends:
        control.append(f"Depends: {pkg.depends}")
    control.append(
        f"Description: {pkg.description}\n Test fixture built by gpufleet's "
        "tests/sim/repo; not NVIDIA software."
    )
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
    if pkg.conffiles:
        (root / "DEBIAN" / "conffiles").write_text("\n".join(pkg.conffiles) + "\n")
    for script in sorted({*pkg.scripts, *pkg.debhelper}):
        source = pkg.scripts.get(script, "")
        if source.startswith(MIG):
            text = (migparted_dir() / source.removeprefix(MIG)).read_text()
        elif source.startswith(TOOLKIT_SOURCE):
            text = (toolkit_source(upstream) / source.removeprefix(TOOLKIT_SOURCE)).read_text()
        elif not source:
            # dh_installdeb's own frame for a script the package does not have.
            text = "#!/bin/sh\nset -e\n#DEBHELPER#\nexit 0\n"
        else:
            raise ValueError(f"{pkg.name} {script}: maintainer scripts come from upstream")
        text = text.replace("#DEBHELPER#", pkg.debhelper.get(script, ""))
        target = root / "DEBIAN" / script
        target.write_text(text)
        target.chmod(0o755)
    deb = out_dir / f"{pkg.name}_{pkg.version.split(':', 1)[-1]}_amd64.deb"
    # gzip, not dpkg-deb's default xz: the toolkit's Go binaries took xz about 30 s of
    # the suite's serial set-up (gzip about 3) and are unpacked about three times faster
    # on every node that installs them; apt and dpkg read either.
    _run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "-z6", "--build", str(root), str(deb)],
        stdout=subprocess.DEVNULL,
    )


# Each repository's Release Label, so that apt preferences can tell the two local
# repositories apart (both are file: sources, which apt gives the same empty origin).
LABELS = {TOOLKIT_REPO: "gpufleet-standin-libnvidia-container", CUDA_REPO: "gpufleet-standin-cuda"}


def _sign_repo(repo: Path, gnupg: Path, key_id: str, label: str) -> None:
    with (repo / "Packages").open("w") as handle:
        _run(["apt-ftparchive", "packages", "."], cwd=repo, stdout=handle)
    with (repo / "Release").open("w") as handle:
        _run(
            [
                "apt-ftparchive",
                "-o",
                "APT::FTPArchive::Release::Origin=gpufleet-test-fixture",
                "-o",
                f"APT::FTPArchive::Release::Label={label}",
                "release",
                ".",
            ],
            cwd=repo,
            stdout=handle,
        )
    env = dict(os.environ, GNUPGHOME=str(gnupg))
    _run(
        [
            "gpg",
            "--batch",
            "--yes",
            "--local-user",
            key_id,
            "--clearsign",
            "-o",
            "InRelease",
            "Release",
        ],
        cwd=repo,
        env=env,
    )
    _run(
        ["gpg", "--batch", "--yes", "--local-user", key_id, "-abs", "-o", "Release.gpg", "Release"],
        cwd=repo,
        env=env,
    )


def _release_assets(staging: Path) -> None:
    """Move nvidia-mig-manager out of the CUDA repository to where mig-parted's
    releases keep it, and list the sha256 of each release asset."""
    upstream = MIG_MANAGER_VERSION.rsplit("-", 1)[0]
    name = f"nvidia-mig-manager_{MIG_MANAGER_VERSION}_amd64.deb"
    release = staging / MIG_RELEASES / f"v{upstream}"
    release.mkdir(parents=True)
    asset = release / name
    (staging / CUDA_REPO / name).rename(asset)
    digest = hashlib.sha256(asset.read_bytes()).hexdigest()
    (staging / RELEASE_SUMS).write_text(f"{digest}  {MIG_RELEASES}/v{upstream}/{name}\n")


def source_hash(source_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted([Path(__file__), *(source_dir / "standins").iterdir()]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for version in TOOLKIT_VERSIONS:
        # The build directory is named after the toolkit's version and recipe.
        digest.update(str(toolkit_bin(_upstream(version))).encode() + b"\0")
    digest.update(str(migparted_dir()).encode() + b"\0")
    return digest.hexdigest()[:12]


def build(source_dir: Path, out: Path) -> Path:
    """Build (or reuse) the repositories under `out`; return `out`."""
    stamp = out / ".source-hash"
    wanted = source_hash(source_dir)
    if stamp.is_file() and stamp.read_text().strip() == wanted:
        return out
    standins = source_dir / "standins"
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix="repo-"))
    try:
        gnupg = staging / ".gnupg"
        gnupg.mkdir(mode=0o700)
        env = dict(os.environ, GNUPGHOME=str(gnupg))
        key_id = "gpufleet test repository <gpufleet-repo@localhost>"
        _run(
            [
                "gpg",
                "--batch",
                "--passphrase",
                "",
                "--quick-gen-key",
                key_id,
                "ed25519",
                "sign",
                "never",
            ],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        work = staging / ".work"
        work.mkdir()
        for repo in (TOOLKIT_REPO, CUDA_REPO):
            (staging / repo).mkdir(parents=True)
        for pkg in packages():
            _build_deb(pkg, standins, work, staging / pkg.repo)
        _release_assets(staging)
        armoured = subprocess.run(
            ["gpg", "--armor", "--export", key_id], env=env, check=True, capture_output=True
        ).stdout
        # The fingerprint the roles pin the key by (gpg's own listing of it).
        listing = subprocess.run(
            ["gpg", "--with-colons", "--fingerprint", key_id],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        fingerprint = next(
            line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")
        )
        (staging / FINGERPRINT_FILE).write_text(fingerprint + "\n")
        for repo, key_path in (
            # Key files named as upstream publishes them (the CUDA one after its key id).
            (TOOLKIT_REPO, "libnvidia-container/gpgkey"),
            (CUDA_REPO, f"{CUDA_REPO}/3bf863cc.pub"),
        ):
            _sign_repo(staging / repo, gnupg, key_id, LABELS[repo])
            (staging / key_path).write_bytes(armoured)
        # Debian 13 nodes find the same packages under NVIDIA's directory for
        # their release (the stand-ins do not depend on the release's libraries).
        (staging / CUDA_REPO_DEBIAN13).symlink_to(Path(CUDA_REPO).parent.name)
        # The device plugin is released as a container image and a binary, not a
        # package: host mode downloads the binary from a URL, here a file one.
        plugin = staging / "device-plugin" / "nvidia-device-plugin"
        plugin.parent.mkdir()
        plugin.write_bytes((standins / "nvidia-device-plugin").read_bytes())
        plugin.chmod(0o755)
        shutil.rmtree(work)
        shutil.rmtree(gnupg)
        (staging / ".source-hash").write_text(wanted + "\n")
        staging.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(f"built the local package repository in {out}", file=sys.stderr)
    return out

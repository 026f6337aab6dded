# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which packages, from which repository, install an NVIDIA driver on a given OS.

A pure function of the node's OS and the driver role's variables, so the choice can
be tested for every supported OS without such a machine. Package names and
repository layouts are the distributions' and NVIDIA's (see the comments per OS).
"""

from __future__ import annotations

import re

SUPPORTED = "Debian 12/13, Ubuntu 22.04/24.04, RHEL/Rocky/AlmaLinux 8/9"
RHEL_LIKE = ("rhel", "rocky", "almalinux", "centos")
BRANCH_RE = re.compile(r"^[0-9]{3}$")
VERSION_RE = re.compile(r"^[0-9]{3}\.[0-9]{2,3}\.[0-9]{2,3}$")
# A kernel release inside a package name: linux-image-5.15.0-91-generic.
KERNEL_RELEASE_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+-[0-9]+")
# GPUs from Turing (compute 7.5) on can run the open kernel modules; Blackwell
# (compute 10 and 12) can run nothing else. NVIDIA made open the default from 560 on.
OPEN_MIN_COMPUTE = (7, 5)
OPEN_ONLY_MIN_COMPUTE_MAJOR = 10
OPEN_DEFAULT_BRANCH = 560


# The oldest driver branch that runs each GPU generation: the minimum Linux driver of
# the CUDA release that introduced its compute capability (NVIDIA's CUDA Toolkit
# release notes, "CUDA Toolkit and Corresponding Driver Versions"): 9.0 >= 384.81,
# 10.0 >= 410.48, 11.0 >= 450.36.06, 11.1 >= 455.23, 11.8 >= 520.61.05 (Ada, Hopper),
# 12.8 >= 570.26 (Blackwell, compute 10.0 and 12.0). Newest capability first.
MIN_BRANCH = (
    ((10, 0), 570, "Blackwell"),
    ((9, 0), 520, "Hopper"),
    ((8, 9), 520, "Ada Lovelace"),
    ((8, 6), 455, "Ampere"),
    ((8, 0), 450, "Ampere"),
    ((7, 5), 410, "Turing"),
    ((7, 0), 384, "Volta"),
)

# The newest branch that still runs a generation: NVIDIA's Unix graphics deprecation
# schedule says the 580 series is the last for Maxwell, Pascal and Volta (below
# compute 7.5).
MAX_BRANCH = (((7, 5), None, ""), ((0, 0), 580, "Volta and older"))


def max_branch(compute):
    """The newest branch that runs a GPU of compute capability `compute` (None: no end)."""
    for since, branch, _generation in MAX_BRANCH:
        if compute >= since:
            return branch
    return None


# The branch of a node with no driver and none named: the newest its package source
# offers that runs every GPU of the node. Where the source cannot be asked (its
# repository not configured yet, dnf), 535 (Debian 12's only branch), raised to the
# oldest branch that runs the node's newest GPU generation (570 for Blackwell).
DEFAULT_BRANCH = 535
# Where an apt source lists the branches it offers: the prefix to ask apt for
# (`apt-cache pkgnames PREFIX`) and the pattern of a branch's package. Canonical's
# server builds (nvidia-headless-<branch>-server[-open]); NVIDIA's CUDA repository
# (cuda-drivers-<branch>, one per branch).
OFFERED = {
    "distro": ("nvidia-headless-", re.compile(r"^nvidia-headless-([0-9]{3})-server(?:-open)?$")),
    "cuda-repo": ("cuda-drivers-", re.compile(r"^cuda-drivers-([0-9]{3})$")),
}
# Debian's releases: codename, and the one driver branch its non-free archive carries
# (source package nvidia-graphics-drivers: 535.261.03 in 12, 550.163.01 in 13).
DEBIAN_RELEASES = {"12": ("bookworm", "535"), "13": ("trixie", "550")}


class PlanError(ValueError):
    """The requested driver cannot be installed this way; the message says why."""


def min_branch(compute):
    """(oldest branch, generation) for a GPU of compute capability `compute`."""
    for since, branch, generation in MIN_BRANCH:
        if compute >= since:
            return branch, generation
    return 0, "pre-Volta"


def _computes(gpus):
    return [
        (g["compute_major"], g.get("compute_minor") or 0)
        for g in gpus
        if g.get("compute_major") is not None
    ]


def offer_prefix(os_id, source):
    """What to ask apt for to learn the branches `source` offers ('' where apt is not
    asked: Debian's own archive, whose one branch is known, and dnf systems)."""
    apt = os_id == "ubuntu" or (os_id == "debian" and source == "cuda-repo")
    return OFFERED[source][0] if apt and source in OFFERED else ""


def fixed_branches(os_id, source, os_version):
    """The branches a source offers that are known without asking it: Debian's own
    archive carries one per release. Empty for every other source."""
    if os_id == "debian" and source == "distro":
        release = DEBIAN_RELEASES.get(str(os_version or "").split(".")[0])
        return [release[1]] if release else []
    return []


def offered_branches(os_id, source, names, os_version=""):
    """The branches the node's source offers, from apt's package names (`names`);
    empty where that is not known (the repository not configured yet)."""
    if os_id == "debian" and source == "distro":
        return fixed_branches(os_id, source, os_version)
    if not offer_prefix(os_id, source):
        return []
    pattern = OFFERED[source][1]
    matches = (pattern.match(name.strip()) for name in names)
    return sorted({match.group(1) for match in matches if match}, key=int)


def _neediest(gpus):
    """(oldest branch, generation, GPU in words) for the GPU that needs the newest, and
    the newest branch that runs the oldest GPU (None: no end)."""
    need, newest = (0, "pre-Volta", ""), None
    for gpu in gpus:
        if gpu.get("compute_major") is None:
            continue
        compute = (gpu["compute_major"], gpu.get("compute_minor") or 0)
        oldest, generation = min_branch(compute)
        if oldest > need[0]:
            name = gpu.get("name") or "unnamed"
            need = (oldest, generation, f"GPU {gpu.get('pci_address')} ({name})")
        last = max_branch(compute)
        if last is not None and (newest is None or last < newest):
            newest = last
    return (*need, newest)


def default_branch(gpus, offered=()):
    """The branch for a node without a driver when the settings name none: the newest
    of `offered` (the source's branches, where known) that runs every GPU."""
    oldest, generation, where, newest = _neediest(gpus)
    if not offered:
        return str(max(DEFAULT_BRANCH, oldest))
    fit = [
        branch
        for branch in offered
        if int(branch) >= oldest and (newest is None or int(branch) <= newest)
    ]
    if not fit:
        needs = f"{generation} GPUs need branch {oldest} or newer"
        if newest is not None:
            needs += f", and Volta or older ones {newest} or older"
        raise PlanError(
            f"driver_branch: the node's package source offers branch(es) "
            f"{', '.join(sorted(offered))}, none of which runs every GPU of the node "
            f"({where}: {needs}). Set driver_source to a source that has one, or name "
            "driver_branch."
        )
    return max(fit, key=int)


def desired(branch, version, module_type, manage, driver, gpus, offered=(), fixed=()):
    """Which driver the node should run: what the settings name, and for what they
    leave unset, the driver packages installed on the node (adopted) or the defaults.

    `driver` is gpu_facts' driver; `offered` the branches the node's package source
    offers (`offered_branches`), `fixed` those of them known without asking the source
    (`fixed_branches`). A driver some package installed is adopted under
    `driver_manage: auto`: its branch while the settings name neither a branch nor a
    version, its module flavour while they leave the flavour to `auto`. The adopted
    version is kept as installed (its packages held), not pinned. Returns branch,
    version and module_type (as requested: open, proprietary or auto) for `plan`,
    `adopted` (whether the branch was taken from the node), and `note`: what was
    adopted, said where it differs from what the defaults would install (empty where
    the node runs what the defaults would give it anyway).
    """
    branch, version = str(branch or ""), version or ""
    if version and not branch:
        branch = version.split(".")[0]
    installed = driver.get("installed_version") or ""
    adopt = manage == "auto" and driver.get("installed_by") == "package" and bool(installed)
    taken = {}
    if adopt and not branch:
        branch = taken["branch"] = installed.split(".")[0]
    if adopt and module_type == "auto":
        # The loaded module's flavour where the package's version is the loaded one;
        # the package's otherwise (the node boots into that one).
        same = driver.get("state") == "loaded" and driver.get("version") == installed
        flavour = driver.get("module_type") if same else driver.get("installed_module_type")
        if flavour in ("open", "proprietary"):
            module_type = taken["module_type"] = flavour
    if not branch:
        # Under `always` the defaults follow only a list known without asking the
        # source: a first run (NVIDIA's repository not configured yet) and the next
        # must agree.
        branch = default_branch(gpus, offered if manage == "auto" else fixed)
    result = {
        "branch": branch,
        "version": version,
        "module_type": module_type,
        # The driver itself came from the node (its branch): it is not checked against
        # the GPUs (it runs them) and is left as it is where the settings cannot install it.
        "adopted": "branch" in taken,
        "note": "",
    }
    if taken:
        kept = f"driver {installed} ({module_type}) adopted as installed"
        try:
            defaults = default_branch(gpus, offered)
        except PlanError as exc:
            result["note"] = f"{kept}; the defaults would install none: {exc}"
            return result
        # Only what was taken from the node is compared: a named branch stays named.
        defaults = defaults if "branch" in taken else branch
        default_flavour = resolve_module_type("auto", defaults, _computes(gpus))
        by_default = (defaults, default_flavour if "module_type" in taken else module_type)
        if by_default != (branch, module_type):
            result["note"] = (
                f"{kept}; the defaults would install branch {defaults} ({default_flavour})"
            )
    return result


def check_gpus(branch, module_type, gpus):
    """Refuse a branch too old for one of the node's GPUs, and `auto` for a GPU whose
    generation is unknown (not in gpufleet's table, no driver to ask): naming the GPU.

    `gpus` are gpu_facts' GPUs."""
    for gpu in gpus:
        name = gpu.get("name") or "unnamed"
        where = f"GPU {gpu.get('pci_address')} ({name}, device {gpu.get('device_id')})"
        if gpu.get("compute_major") is None:
            if module_type == "auto":
                raise PlanError(
                    f"driver_kernel_module_type: auto cannot tell the generation of {where}, "
                    "which gpufleet's table does not know: set open (Turing and newer, "
                    "required on Blackwell) or proprietary for this node"
                )
            continue
        compute = (gpu["compute_major"], gpu.get("compute_minor") or 0)
        oldest, generation = min_branch(compute)
        last = max_branch(compute)
        if last is not None and int(branch) > last:
            raise PlanError(
                f"driver_branch: {branch} does not support {where}: the {last} series is "
                f"the last to run {generation} GPUs (compute {compute[0]}.{compute[1]})"
            )
        if int(branch) < oldest:
            raise PlanError(
                f"driver_branch: {branch} does not support {where}: {generation} GPUs "
                f"(compute {compute[0]}.{compute[1]}) need branch {oldest} or newer"
            )


def resolve_module_type(requested, branch, computes):
    """open | proprietary for `requested` (open | proprietary | auto) on GPUs of `computes`.

    `computes` lists (major, minor) of the node's GPUs (those known).
    """
    lowest = min(computes) if computes else None
    highest = max(computes) if computes else None
    if requested == "open":
        if lowest is not None and lowest < OPEN_MIN_COMPUTE:
            raise PlanError(
                "driver_kernel_module_type: open kernel modules need a Turing or newer GPU "
                f"(compute capability 7.5+); this node has compute {lowest[0]}.{lowest[1]}. "
                "Use proprietary or auto."
            )
        return "open"
    if requested == "proprietary":
        if highest is not None and highest[0] >= OPEN_ONLY_MIN_COMPUTE_MAJOR:
            raise PlanError(
                "driver_kernel_module_type: Blackwell GPUs (compute 10+) only work with the "
                "open kernel modules. Use open or auto."
            )
        return "proprietary"
    if highest is not None and highest[0] >= OPEN_ONLY_MIN_COMPUTE_MAJOR:
        return "open"
    if lowest is not None and lowest >= OPEN_MIN_COMPUTE and int(branch) >= OPEN_DEFAULT_BRANCH:
        return "open"
    return "proprietary"


# Binary packages built from NVIDIA's driver sources on Debian/Ubuntu and in NVIDIA's
# repositories: an apt preferences pin on these names makes apt pick the one wanted
# version for the packages asked for and for their strict (=) dependencies alike.
# Globs, not one /regex/: apt matches a regex pin against every package each time it
# loads its cache, which cost about 5 s of CPU per apt run on a Debian 12 node (0.5 s
# without the pin, 0.8 s with these globs, the same priorities for every package).
DEB_DRIVER_PACKAGE_GLOBS = (
    "nvidia-*",
    "libnvidia-*",
    "libcuda1*",
    "firmware-nvidia-*",
    "cuda-drivers*",
    "xserver-xorg-video-nvidia*",
)


def _apt_pin(version):
    if not version:
        return None
    return {"packages": " ".join(DEB_DRIVER_PACKAGE_GLOBS), "version": f"{version}-*"}


def _debian(
    os_version, branch, version, module_type, source, base_url, mirror, security, kernel, fm
):
    major = os_version.split(".")[0]
    if major not in DEBIAN_RELEASES:
        raise PlanError(f"Debian {os_version} is not supported; supported: {SUPPORTED}")
    codename, distro_branch = DEBIAN_RELEASES[major]
    # NVIDIA's CUDA repository directory for the release (debian12, debian13).
    cuda_dir = f"debian{major}"
    plan = _apt_family_plan("debian", kernel)
    if source == "distro":
        if branch != distro_branch:
            raise PlanError(
                f"driver_branch: Debian {major} packages only the {distro_branch} branch, "
                f"not {branch}; set driver_source: cuda-repo for other branches"
            )
        # Debian's non-free archive (nvidia-graphics-drivers source package); the
        # open module is in contrib, the persistence daemon too. A site's own entries
        # for the same mirror and suite often carry no Signed-By: apt accepts a
        # Signed-By that comes after such an entry but refuses one before it ("Conflicting
        # values set for option Signed-By"), and reads sources.list.d in name order,
        # so these files are named to be read last.
        plan["repositories"].append(
            {
                "name": "zz-gpufleet-debian-nvidia",
                "uris": [mirror],
                "suites": [codename, f"{codename}-updates"],
                "components": ["contrib", "non-free", "non-free-firmware"],
                "signed_by": "/usr/share/keyrings/debian-archive-keyring.gpg",
            }
        )
        plan["repositories"].append(
            {
                "name": "zz-gpufleet-debian-security-nvidia",
                "uris": [security],
                "suites": [f"{codename}-security"],
                "components": ["contrib", "non-free", "non-free-firmware"],
                "signed_by": "/usr/share/keyrings/debian-archive-keyring.gpg",
            }
        )
        kmod = "nvidia-open-kernel-dkms" if module_type == "open" else "nvidia-kernel-dkms"
        # The two flavours do not conflict in Debian (libcuda1 accepts either), so a
        # module-type switch removes the other one once the new one is in.
        plan["remove"] = [
            "nvidia-kernel-dkms" if module_type == "open" else "nvidia-open-kernel-dkms"
        ]
        held = [kmod, "nvidia-smi", "libnvidia-ml1", "libcuda1", "firmware-nvidia-gsp"]
        plan["packages"] = [*held, "nvidia-persistenced"]
        plan["hold"] = held
    else:
        plan["repositories"].append(_cuda_deb_repo(base_url, cuda_dir))
        plan.update(_cuda_deb_packages(branch, version, module_type))
    plan["fabricmanager"] = _fm_deb(branch, version) if fm else []
    if source == "distro":
        # Debian does not package the fabric manager: it comes from NVIDIA's repo,
        # which also offers driver packages of Debian's names at other versions.
        # Of the driver's packages, only the fabric manager (and its NSCQ library)
        # may come from there.
        if fm:
            plan["repositories"].append(_cuda_deb_repo(base_url, cuda_dir))
        plan["cuda_repo_pin"] = _cuda_repo_pin(
            base_url, "nvidia-fabricmanager-* libnvidia-nscq-*" if fm else ""
        )
    return plan


def _cuda_repo_pin(base_url, allowed):
    """On a distro-driver node, what apt may take from NVIDIA's CUDA repository: the
    packages `allowed` (globs), and none of the driver's. Written whether or not the
    driver role adds that repository: another role (the exporter's DCGM) or the site
    may add it, and its driver packages, of the distribution's names at newer
    versions, would otherwise become apt's candidates for the driver's set."""
    return {
        "selector": f'origin "{_origin(base_url)}"',
        "allowed": allowed,
        "refused": " ".join(DEB_DRIVER_PACKAGE_GLOBS),
    }


def _apt_family_plan(family, kernel):
    """What Debian and Ubuntu plans share: headers of the running kernel, initramfs-tools."""
    return {
        "family": family,
        "repositories": [],
        "headers": [f"linux-headers-{kernel}"],
        "initramfs_command": ["update-initramfs", "-u"],
        "module_stream": None,
        "precompiled": None,
        "remove": [],
    }


def _origin(url):
    """apt's "origin" of a source: its host name (empty for file: sources)."""
    match = re.match(r"^[a-z+]+://([^/:]+)", url)
    return match.group(1) if match else ""


def _cuda_deb_repo(base_url, distro):
    url = f"{base_url.rstrip('/')}/{distro}/x86_64"
    return {
        "name": "nvidia-cuda",
        "uris": [url],
        "suites": ["/"],
        "components": [],
        "key_url": f"{url}/3bf863cc.pub",
    }


def _cuda_deb_packages(branch, version, module_type):
    # NVIDIA's CUDA repository: cuda-drivers-<branch> (proprietary) or
    # nvidia-driver-<branch>-open.
    meta = f"nvidia-driver-{branch}-open" if module_type == "open" else f"cuda-drivers-{branch}"
    other = f"cuda-drivers-{branch}" if module_type == "open" else f"nvidia-driver-{branch}-open"
    return {"packages": [meta], "hold": [meta], "remove": [other]}


def _fm_deb(branch, version):
    return [f"nvidia-fabricmanager-{branch}"]


def _ubuntu(os_version, branch, version, module_type, source, base_url, kernel, fm):
    if os_version not in ("22.04", "24.04"):
        raise PlanError(f"Ubuntu {os_version} is not supported; supported: {SUPPORTED}")
    distro = "ubuntu" + os_version.replace(".", "")
    plan = _apt_family_plan("ubuntu", kernel)
    if source == "distro":
        # Canonical's server builds. The kernel modules come precompiled and signed
        # by Canonical (accepted under Secure Boot) for Ubuntu's own kernels, as
        # linux-modules-nvidia-<branch>-server[-open]-<kernel release> plus one
        # metapackage per kernel flavour (…-generic, …-generic-hwe-22.04) that
        # follows kernel updates; nvidia-dkms-* builds them for other kernels.
        # Which applies is known only on the node: see kernel_modules().
        suffix = "-open" if module_type == "open" else ""
        headless = f"nvidia-headless-{branch}-server{suffix}"
        utils = f"nvidia-utils-{branch}-server"
        plan["packages"] = [headless, utils]
        plan["hold"] = [headless, utils]
        other = "" if module_type == "open" else "-open"
        plan["remove"] = [
            f"nvidia-headless-{branch}-server{other}",
            f"nvidia-dkms-{branch}-server{other}",
        ]
        plan["precompiled"] = {
            "prefix": f"linux-modules-nvidia-{branch}-server{suffix}-",
            "kernel_package": f"linux-modules-nvidia-{branch}-server{suffix}-{kernel}",
            "dkms_package": f"nvidia-dkms-{branch}-server{suffix}",
        }
        plan["fabricmanager"] = _fm_deb(branch, version) if fm else []
        # Ubuntu's archive has the fabric manager too: nothing of the driver's set
        # comes from NVIDIA's repository.
        plan["cuda_repo_pin"] = _cuda_repo_pin(base_url, "")
    else:
        plan["repositories"].append(_cuda_deb_repo(base_url, distro))
        plan.update(_cuda_deb_packages(branch, version, module_type))
        plan["fabricmanager"] = _fm_deb(branch, version) if fm else []
    return plan


def _rhel(os_version, branch, version, module_type, source, base_url, kernel, fm):
    major = os_version.split(".")[0]
    if major not in ("8", "9"):
        raise PlanError(f"RHEL-family {os_version} is not supported; supported: {SUPPORTED}")
    if source != "cuda-repo":
        raise PlanError(
            "driver_source: RHEL-family systems install the driver from NVIDIA's "
            "CUDA repository; set driver_source: cuda-repo"
        )
    url = f"{base_url.rstrip('/')}/rhel{major}/x86_64"
    # NVIDIA's dnf module "nvidia-driver", one stream per branch and module flavour
    # (535-dkms, 535-open, ...). With an exact version the stream is enabled first
    # and the version's packages are installed from it.
    stream = f"{branch}-{'open' if module_type == 'open' else 'dkms'}"
    packages = [f"@nvidia-driver:{stream}"]
    if version:
        packages = [
            f"nvidia-driver-{version}",
            f"nvidia-driver-cuda-{version}",
            f"kmod-nvidia-{'open-dkms' if module_type == 'open' else 'latest-dkms'}-{version}",
        ]
    return {
        "family": "rhel",
        "repositories": [
            {
                "name": "cuda-rhel" + major,
                "baseurl": url,
                "gpgkey": f"{url}/D42D0685.pub",
            }
        ],
        "module_stream": {"name": "nvidia-driver", "stream": stream},
        "packages": packages,
        # The two kmod flavours conflict; dnf swaps them (allowerasing).
        "remove": [],
        "hold": ["nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia*"],
        "headers": [f"kernel-devel-{kernel}", f"kernel-headers-{kernel}"],
        "initramfs_command": ["dracut", "-f"],
        # The RPM is spelled with a second hyphen; the role installs it at the
        # installed driver's version.
        "fabricmanager": ["nvidia-fabric-manager"] if fm else [],
    }


def validate_request(branch, version):
    """Check the branch and version settings; raises PlanError naming the variable."""
    if not BRANCH_RE.match(branch):
        raise PlanError(
            f"driver_branch: expected a three-digit driver branch such as '535', got {branch!r}"
        )
    if version:
        if not VERSION_RE.match(version):
            raise PlanError(
                "driver_version: expected an NVIDIA driver version such as '535.261.03', "
                f"got {version!r}"
            )
        if version.split(".")[0] != branch:
            raise PlanError(f"driver_version {version} is not of driver_branch {branch}")


def plan(
    os_id,
    os_version,
    kernel,
    branch,
    version,
    module_type,
    source,
    cuda_repo_base_url,
    debian_mirror="http://deb.debian.org/debian",
    debian_security_mirror="http://deb.debian.org/debian-security",
    fabricmanager=False,
):
    """The install plan for one node. Raises PlanError naming the variable at fault."""
    branch = str(branch)
    validate_request(branch, version)
    if module_type not in ("open", "proprietary"):
        raise PlanError(f"module type must be resolved to open or proprietary, got {module_type!r}")
    if source not in ("distro", "cuda-repo"):
        raise PlanError(f"driver_source: expected distro or cuda-repo, got {source!r}")
    os_id = (os_id or "").lower()
    args = (branch, version or "", module_type, source, cuda_repo_base_url)
    if os_id == "debian":
        result = _debian(
            os_version, *args, debian_mirror, debian_security_mirror, kernel, fabricmanager
        )
    elif os_id == "ubuntu":
        result = _ubuntu(os_version, *args, kernel, fabricmanager)
    elif os_id in RHEL_LIKE:
        result = _rhel(os_version, *args, kernel, fabricmanager)
    else:
        raise PlanError(
            f"operating system {os_id} {os_version} is not supported; supported: {SUPPORTED}"
        )
    if result["family"] in ("debian", "ubuntu"):
        result["apt_pin"] = _apt_pin(version)
        result.setdefault("cuda_repo_pin", None)
        if not fabricmanager:
            # A node without NVSwitches has no use for the fabric manager: one found
            # there leaves in the driver's own transaction (where it is installed).
            result["remove"] = [*result["remove"], *_fm_deb(branch, version)]
    result["module_type"] = module_type
    result["branch"] = branch
    result["version"] = version or None
    return result


def kernel_modules(plan, available, installed_images):
    """Which kernel-module packages to install on an apt node, and whether they are signed.

    `available`: names apt knows with the plan's precompiled prefix (from
    `apt-cache pkgnames <prefix>`); `installed_images`: the node's installed
    linux-image-* packages. Returns packages to install, packages to hold, and
    `signed` (true for Canonical's precompiled modules). Plans without precompiled
    modules (Debian, NVIDIA's repository) carry their module packages already.
    """
    pre = plan.get("precompiled")
    if not pre:
        return {"packages": [], "hold": [], "signed": False}
    available = set(available)
    if pre["kernel_package"] not in available:
        dkms = pre["dkms_package"]
        return {"packages": [dkms], "hold": [dkms], "signed": False}
    # A flavour metapackage (linux-image-generic-hwe-22.04 → …-generic-hwe-22.04) keeps
    # modules coming with kernel updates; the running kernel's package is held so
    # that it stays at the driver's version.
    metas = [
        pre["prefix"] + name.removeprefix("linux-image-")
        for name in sorted(installed_images)
        if name.startswith("linux-image-") and not KERNEL_RELEASE_RE.search(name)
    ]
    metas = [name for name in metas if name in available]
    return {
        "packages": [pre["kernel_package"], *metas],
        "hold": [pre["kernel_package"]],
        "signed": True,
    }


def differs(version, module_type, plan):
    """Whether a driver of `version` / `module_type` is not the one `plan` installs.

    Another exact version (when the plan pins one), another branch, or another kernel
    module flavour. False when there is no driver (`version` None).
    """
    if not version:
        return False
    return (
        (plan.get("version") is not None and version != plan["version"])
        or version.split(".")[0] != str(plan["branch"])
        or module_type != plan["module_type"]
    )

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""Our runtime-config edits against NVIDIA's own `nvidia-ctk runtime configure`.

For every input config below (containerd v1, v2, v3 and v4, in place and as a drop-in;
Docker's daemon.json missing, empty and with foreign settings; CRI-O's main config and
a drop-in) and two sets of options, our module's logic (module_utils/runtime_config, the
functions container_runtime.py calls) and the real nvidia-ctk edit the same files on the
same paths. nvidia-ctk is built from NVIDIA's published Go module at each pinned
version by tests/sim/toolkit/build.sh.

Both results are then read the way the runtime reads them, so that the layout (one file
or a drop-in) does not count but its effect does:
  containerd  the main config, then the files its `imports` match (sorted, as Go's
              filepath.Glob returns them), each plugin table replaced by key, as
              containerd 1.x merges them; no `version` key means 1;
  CRI-O       crio.conf, then every file of crio.conf.d in name order, a runtime
              handler table replaced as a whole (how CRI-O decodes a drop-in);
  Docker      daemon.json.
and compared leaf by leaf. Every difference must be one this file lists, with its
reason; one that is not listed, or a listed one that does not show, fails the test.

nvidia-ctk's own layout differs by version, so the oracle runs it in the mode that works
at that version (`theirs_layout`); what does not work is pinned in the tests at the end.
Differences that were bugs in our module (the cgroup driver of a kept containerd
entry, a CRI-O handler without the default handler's conmon) are fixed; their tests
stay at the end of this file as regressions.
"""

from __future__ import annotations

import copy
import glob
import json
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import (  # type: ignore[import-untyped]
    runtime_config as rc,
)
from conftest import PROJECT

BUILD = PROJECT / "tests" / "sim" / "toolkit" / "build.sh"
VERSIONS = ["1.17.8", "1.18.0", "1.19.1", "1.20.0"]
# Those that write containerd and CRI-O changes only through a drop-in (`theirs_layout`).
DROP_IN_ONLY = ("1.18.0", "1.19.1", "1.20.0")
ABSENT = "<absent>"
Leaves = dict[tuple[str, ...], Any]


# --- nvidia-ctk, built from the pinned Go modules ------------------------------------


@dataclass(frozen=True)
class Toolkit:
    version: str
    ctk: Path
    # `--drop-in-config` arrived in 1.18; 1.17 edits the one file it is given.
    drop_in_flag: bool

    def configure(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.ctk), "runtime", "configure", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )


@pytest.fixture(scope="session", params=VERSIONS)
def toolkit(request: pytest.FixtureRequest) -> Toolkit:
    version = request.param
    built = subprocess.run(
        ["bash", str(BUILD), version], capture_output=True, text=True, check=False
    )
    if built.returncode != 0:
        pytest.fail(f"{BUILD} {version} failed:\n{built.stderr}", pytrace=False)
    ctk = Path(built.stdout.strip().splitlines()[-1]) / "nvidia-ctk"
    reported = subprocess.run(
        [str(ctk), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert f"version {version}\n" in reported, reported
    help_text = subprocess.run(
        [str(ctk), "runtime", "configure", "--help"], capture_output=True, text=True, check=True
    ).stdout
    return Toolkit(version, ctk, "--drop-in-config" in help_text)


# --- options ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """One set of the module's options and nvidia-ctk's flags that mean the same."""

    id: str
    runtime_name: str
    runtime_path: str
    set_as_default: bool
    enable_cdi: bool

    def wanted(self) -> dict[str, Any]:
        return {
            "runtime_name": self.runtime_name,
            "runtime_path": self.runtime_path,
            "set_as_default": self.set_as_default,
            "enable_cdi": self.enable_cdi,
            "present": True,
        }

    def flags(self) -> list[str]:
        return [
            f"--nvidia-runtime-name={self.runtime_name}",
            f"--nvidia-runtime-path={self.runtime_path}",
            *(["--nvidia-set-as-default"] if self.set_as_default else []),
            *(["--cdi.enabled"] if self.enable_cdi else []),
        ]


# The runtime_config role's defaults.
ROLE_DEFAULTS = Options("role-defaults", "nvidia", "/usr/bin/nvidia-container-runtime", False, True)
# Another name and path, as the default runtime, CDI left alone.
AS_DEFAULT = Options(
    "as-default", "gpu", "/usr/local/nvidia/toolkit/nvidia-container-runtime", True, False
)
OPTIONS = [ROLE_DEFAULTS, AS_DEFAULT]


# --- the node's files, and how each side edits them -----------------------------------

CONTAINERD = "etc/containerd/config.toml"
CONTAINERD_DROP_IN = "etc/containerd/conf.d/99-nvidia.toml"
DOCKER = "etc/docker/daemon.json"
CRIO = "etc/crio/crio.conf"
CRIO_DROP_IN = "etc/crio/crio.conf.d/99-nvidia.toml"
MAIN = {"containerd": CONTAINERD, "docker": DOCKER, "crio": CRIO}
# Every TOML input carries this line; whether it survives is compared too.
COMMENT = "# site setting, do not lose this comment"
COMMENT_KEPT = ("<the main config's comment is kept>",)


@dataclass(frozen=True)
class Case:
    id: str
    runtime: str  # containerd, docker or crio
    files: dict[str, str]  # the node's files before the edit
    # containerd: our module writes a drop-in (drop_in_path); CRI-O: it edits the
    # drop-in (config_path, the module's default) instead of crio.conf.
    drop_in: bool = False
    plugin: str = ""  # containerd's CRI plugin table at the config's version
    # The differences from nvidia-ctk this case must show, each with its reason.
    expected: Callable[[Run], list[Difference]] = lambda run: []
    # nvidia-ctk refuses this input: (what its error says, why we do not).
    theirs_refuses: tuple[str, str] | None = None


@dataclass(frozen=True)
class Run:
    """One case with one set of options against one nvidia-ctk."""

    case: Case
    options: Options
    toolkit: Toolkit

    @property
    def theirs_drop_in(self) -> bool:
        return bool(theirs_layout(self.case, self.toolkit)[1])

    def entry(self, *keys: str) -> tuple[str, ...]:
        """The path of a key of the nvidia runtime's containerd entry."""
        name = self.options.runtime_name
        return ("plugins", self.case.plugin, "containerd", "runtimes", name, *keys)

    def handler(self, *keys: str) -> tuple[str, ...]:
        """The path of a key of the nvidia runtime's CRI-O handler."""
        return ("crio", "runtime", "runtimes", self.options.runtime_name, *keys)


@dataclass(frozen=True)
class Difference:
    path: tuple[str, ...]
    ours: Any
    theirs: Any
    kind: str  # one of KINDS
    why: str


KINDS = {
    "layout": "where the setting lives differs, its effect does not",
    "same effect": "spelled differently, containerd reads both the same",
    "on purpose": "we do it differently on purpose",
    "upstream bug": "nvidia-ctk gets it wrong",
}


def ours(case: Case, node: Path, options: Options) -> None:
    """Our module's logic on the node's files, written where container_runtime.py writes."""

    def read(rel: str) -> str | None:
        path = node / rel
        return path.read_text() if path.exists() else None

    def write(rel: str, text: str | None) -> None:
        path = node / rel
        if text is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    wanted = options.wanted()
    if case.runtime == "containerd" and case.drop_in:
        main, drop_in, _ = rc.containerd_drop_in(
            read(CONTAINERD), str(node / CONTAINERD), str(node / CONTAINERD_DROP_IN), **wanted
        )
        write(CONTAINERD, main)
        write(CONTAINERD_DROP_IN, drop_in)
    elif case.runtime == "containerd":
        write(CONTAINERD, rc.containerd_in_place(read(CONTAINERD), CONTAINERD, **wanted)[0])
    elif case.runtime == "docker":
        write(DOCKER, rc.docker_daemon_json(read(DOCKER), DOCKER, **wanted))
    else:
        target = CRIO_DROP_IN if case.drop_in else CRIO
        # As container_runtime.py does: the handler starts from CRI-O's default one, as
        # crio.conf and the other drop-ins define it.
        drop_ins = sorted(str(p.relative_to(node)) for p in (node / CRIO_DROP_IN).parent.glob("*"))
        configs = [(rel, read(rel)) for rel in [CRIO, *drop_ins] if read(rel) is not None]
        base = rc.crio_default_handler(configs, wanted["runtime_name"])
        write(target, rc.crio_drop_in(read(target), target, base=base, **wanted))


def theirs_layout(case: Case, toolkit: Toolkit) -> tuple[str, str | None]:
    """(--config, --drop-in-config) for nvidia-ctk; None: a version without that flag.

    1.17 has no drop-ins: it edits the one file it is given (for CRI-O's drop-in case,
    the drop-in). 1.18 to 1.20 edit containerd v2/v3 and CRI-O only through a drop-in (in place
    it loses the runtime, or all of crio.conf), and a v1 containerd config only in place
    (a v1 drop-in it writes is imported by nothing): both pinned at the end of this file.
    """
    if case.runtime == "docker":
        return DOCKER, "" if toolkit.drop_in_flag else None
    if case.runtime == "crio":
        if not toolkit.drop_in_flag:
            return (CRIO_DROP_IN if case.drop_in else CRIO), None
        return CRIO, CRIO_DROP_IN
    if not toolkit.drop_in_flag:
        return CONTAINERD, None
    if case.plugin == rc.CRI_PLUGIN[1]:
        return CONTAINERD, ""
    return CONTAINERD, CONTAINERD_DROP_IN


def ctk_configure(
    toolkit: Toolkit, runtime: str, node: Path, config: str, drop_in: str | None, *flags: str
) -> subprocess.CompletedProcess[str]:
    args = [f"--runtime={runtime}", f"--config={node / config}", *flags]
    if drop_in is not None:
        args += ["--drop-in-config", str(node / drop_in) if drop_in else ""]
    return toolkit.configure(*args)


# --- reading a result the way the runtime reads it ------------------------------------


def leaves(value: dict[str, Any], prefix: tuple[str, ...] = ()) -> Leaves:
    out: Leaves = {}
    for key, item in value.items():
        if isinstance(item, dict):
            out.update(leaves(item, (*prefix, key)))
        else:
            out[(*prefix, key)] = item
    return out


def _on_node(node: Path, path: str) -> str:
    """A path nvidia-ctk or we wrote (under node) as the node sees it."""
    return path[len(str(node)) :] if path.startswith(f"{node}/") else path


def containerd_view(node: Path, plugin: str) -> dict[str, Any]:
    """config.toml with its imports, merged as containerd 1.x does (LoadConfig).

    Plugin tables are replaced by key; an absolute import is read inside `node`. No
    `version` means 1 and no default_runtime_name means runc: containerd's defaults.
    """
    main_path = node / CONTAINERD
    main = tomllib.loads(main_path.read_text()) if main_path.exists() else {}
    view = copy.deepcopy(main)
    loaded = {str(main_path)}
    for pattern in main.get("imports", []):
        pattern = _on_node(node, pattern)
        on_disk = (
            node / pattern.lstrip("/") if pattern.startswith("/") else main_path.parent / pattern
        )
        for path in sorted(glob.glob(str(on_disk))):
            if path in loaded:
                continue
            loaded.add(path)
            for key, value in tomllib.loads(Path(path).read_text()).items():
                if key == "plugins":
                    view.setdefault("plugins", {}).update(value)
                elif key not in ("imports", "version"):
                    view[key] = value
    if main:
        view["version"] = main.get("version", 1)
    if "imports" in view:
        view["imports"] = [_on_node(node, i) for i in view["imports"]]
    cri = view.get("plugins", {}).get(plugin)
    if cri is not None:
        cri.setdefault("containerd", {}).setdefault(
            "default_runtime_name", rc.CONTAINERD_DEFAULT_RUNTIME
        )
    return view


def crio_view(node: Path) -> dict[str, Any]:
    """crio.conf, then crio.conf.d/* in name order; a runtime handler replaced whole.

    CRI-O decodes each drop-in over the config so far (UpdateFromDropInFile): tables
    merge key by key, and a handler of crio.runtime.runtimes is decoded afresh.
    """
    main_path = node / CRIO
    view = tomllib.loads(main_path.read_text()) if main_path.exists() else {}
    drop_in_dir = (node / CRIO_DROP_IN).parent
    for path in sorted(drop_in_dir.glob("*")) if drop_in_dir.is_dir() else []:
        _merge_crio(view, tomllib.loads(path.read_text()), ())
    return view


def _merge_crio(into: dict[str, Any], other: dict[str, Any], at: tuple[str, ...]) -> None:
    for key, value in other.items():
        handler = at == ("crio", "runtime", "runtimes")
        if isinstance(value, dict) and isinstance(into.get(key), dict) and not handler:
            _merge_crio(into[key], value, (*at, key))
        else:
            into[key] = copy.deepcopy(value)


def observe(case: Case, node: Path) -> Leaves:
    """What the runtime would make of the node's files, as leaves."""
    if case.runtime == "containerd":
        seen = leaves(containerd_view(node, case.plugin))
    elif case.runtime == "crio":
        seen = leaves(crio_view(node))
    else:
        path = node / DOCKER
        seen = leaves(json.loads(path.read_text()) if path.exists() else {})
    main = node / MAIN[case.runtime]
    if COMMENT in case.files.get(MAIN[case.runtime], ""):
        seen[COMMENT_KEPT] = main.exists() and COMMENT in main.read_text()
    return seen


# --- the differences we expect, each with its reason ----------------------------------

DROP_IN_GLOB = "/" + str(Path(CONTAINERD_DROP_IN).parent / "*.toml")


def comment(run: Run) -> list[Difference]:
    """nvidia-ctk loses the comments of every file it writes."""
    writes_main = not (run.case.runtime == "crio" and (run.theirs_drop_in or run.case.drop_in))
    if COMMENT not in run.case.files.get(MAIN[run.case.runtime], "") or not writes_main:
        return []
    return [
        Difference(
            COMMENT_KEPT,
            True,
            False,
            "on purpose",
            "we edit with tomlkit, which keeps comments and layout; nvidia-ctk writes "
            "every file it touches anew from go-toml's tree (1.18 rewrites config.toml "
            "even when all it adds is a drop-in: config_drop_in.go, 'TODO: Only do this "
            "if we've actually modified the config')",
        )
    ]


def imports(run: Run, before: list[str]) -> list[Difference]:
    """containerd's `imports`: where each side put the runtime."""
    ours_value = [*before, DROP_IN_GLOB] if run.case.drop_in else before
    if not run.theirs_drop_in:
        theirs_value, kind, why = (
            before,
            "layout",
            "our drop-in is imported from config.toml; nvidia-ctk 1.17 has no drop-ins "
            "(nor 1.18 to 1.20 for a v1 config) and edits config.toml itself",
        )
    elif not before or run.toolkit.version != "1.18.0":
        theirs_value, kind, why = (
            [*before, DROP_IN_GLOB],
            "layout",
            "nvidia-ctk 1.18 to 1.20 write containerd v2/v3 only as a drop-in imported "
            "from config.toml; we were asked to edit config.toml in place",
        )
    else:
        theirs_value, kind, why = (
            [DROP_IN_GLOB],
            "upstream bug",
            "nvidia-ctk 1.18.0 replaces the site's own imports with its drop-in's: "
            "ensureImports reads `imports` as []string where go-toml gives []interface{} "
            "(fixed in 1.18.2 by getCurrentImports); containerd then no longer reads "
            "the site's drop-ins",
        )
    if ours_value == theirs_value:
        return []
    return [Difference(("imports",), ours_value or ABSENT, theirs_value or ABSENT, kind, why)]


def cdi_on_by_default(run: Run) -> list[Difference]:
    """containerd 2.x (config versions 3 and 4): CDI is on unless the file turns it off."""
    if not run.options.enable_cdi:
        return []
    why = (
        "containerd 2.x enables CDI by default (enable_cdi defaults to true in 2.0 to "
        "2.3); 2.2 deprecated the key and 2.4 ignores it with a warning at every start, "
        "so we write it only over a false; nvidia-ctk writes it always"
    )
    return [Difference(("plugins", run.case.plugin, "enable_cdi"), ABSENT, True, "on purpose", why)]


def v1_spelling(run: Run) -> list[Difference]:
    """What nvidia-ctk writes differently into a v1 (version-less) containerd config."""
    found = [
        Difference(
            run.entry("options", "Runtime"),
            ABSENT,
            run.options.runtime_path,
            "same effect",
            "nvidia-ctk also writes options.Runtime into v1 configs: the binary option of "
            "the legacy io.containerd.runtime.v1.linux shim; the entry's runtime_type is "
            "io.containerd.runc.v2, whose options name the binary in BinaryName only",
        )
    ]
    if run.options.enable_cdi:
        why = (
            "nvidia-ctk writes enable_cdi for a v1 config under plugins.cri.containerd "
            "(ConfigV1.EnableCDI), where containerd does not read it: EnableCDI is a "
            "field of the CRI plugin's own table (containerd 1.7 pkg/cri/config/config.go, "
            "PluginConfig), plugins.cri.enable_cdi in v1, which is where we write it"
        )
        found += [
            Difference(("plugins", "cri", "enable_cdi"), True, ABSENT, "upstream bug", why),
            Difference(
                ("plugins", "cri", "containerd", "enable_cdi"), ABSENT, True, "upstream bug", why
            ),
        ]
    return found


def zero_values(run: Run) -> list[Difference]:
    """With no runtime to copy, nvidia-ctk spells out containerd's defaults."""
    why = (
        "with no runc (or crun) entry to copy, nvidia-ctk writes runtime_root = '', "
        "runtime_engine = '' and privileged_without_host_devices = false: containerd's "
        "defaults, which we leave unset"
    )
    return [
        Difference(run.entry("runtime_root"), ABSENT, "", "same effect", why),
        Difference(run.entry("runtime_engine"), ABSENT, "", "same effect", why),
        Difference(run.entry("privileged_without_host_devices"), ABSENT, False, "same effect", why),
    ]


def stale_nvidia_entry(run: Run) -> list[Difference]:
    """V2_WITH_NVIDIA: an old nvidia entry, which is also the default runtime.

    Both take runc's cgroup driver (SystemdCgroup = true): an entry named like ours
    follows it, and a new entry of another name copies runc, not the old nvidia
    default (nvidia-ctk skips a default named nvidia*, engine.GetLowLevelRuntimes).
    """
    found = []
    if run.options.runtime_name == "nvidia":
        kept = (
            "we keep what an existing entry holds (NoNewKeyring someone set) besides the "
            "cgroup driver; nvidia-ctk replaces the entry with a copy of runc's"
        )
        found.append(
            Difference(run.entry("options", "NoNewKeyring"), True, ABSENT, "on purpose", kept)
        )
    if not run.options.set_as_default and not run.toolkit.drop_in_flag:
        found.append(
            Difference(
                ("plugins", run.case.plugin, "containerd", "default_runtime_name"),
                "runc",
                "nvidia",
                "on purpose",
                "set_as_default: false hands a default that names our runtime back to runc "
                "(documented); nvidia-ctk 1.17 leaves it (1.18 does what we do)",
            )
        )
    return found


def crio_handler_copy(run: Run) -> list[Difference]:
    """Both start the handler as a copy of CRI-O's default one (crun here), except
    nvidia-ctk 1.17 on a drop-in: it edits that file alone and sees no default handler."""
    if run.theirs_drop_in or not run.case.drop_in:
        return []
    why = (
        "nvidia-ctk 1.17 edits the drop-in alone and cannot see crio.conf's default handler; "
        "we start the handler from it as nvidia-ctk 1.18 does, so that CRI-O finds conmon "
        "(monitor_path) where conmon is not in $PATH (cri-o pkg/config/config.go, "
        "validateExecutablePath)"
    )
    return [
        Difference(
            run.handler("allowed_annotations"),
            ["io.containers.trace-syscall"],
            ABSENT,
            "on purpose",
            why,
        ),
        Difference(
            run.handler("monitor_path"), "/usr/libexec/crio/conmon", ABSENT, "on purpose", why
        ),
        Difference(run.handler("runtime_root"), "/run/crun", ABSENT, "on purpose", why),
    ]


def site_lost(run: Run) -> list[Difference]:
    """What containerd no longer reads once nvidia-ctk 1.18.0 dropped the site's import."""
    if not run.theirs_drop_in or run.toolkit.version != "1.18.0":
        return []
    return [
        Difference(
            ("metrics", "address"),
            "127.0.0.1:1338",
            ABSENT,
            "upstream bug",
            "the site's own drop-in (site.d/10-site.toml) is no longer imported once "
            "nvidia-ctk 1.18.0 replaced `imports` (see imports above)",
        )
    ]


def features_lost(run: Run) -> list[Difference]:
    if not run.options.enable_cdi:
        return []
    return [
        Difference(
            ("features", "buildkit"),
            True,
            ABSENT,
            "upstream bug",
            "nvidia-ctk's EnableCDI reads `features` as map[string]bool where encoding/json "
            "gives map[string]interface{}, so it replaces the site's features with "
            "{cdi: true}; we add cdi to them",
        )
    ]


def old_docker_nvidia(run: Run) -> list[Difference]:
    if run.options.runtime_name != "nvidia":
        return []
    return [
        Difference(
            ("runtimes", "nvidia", "runtimeArgs"),
            ["--debug"],
            ABSENT,
            "on purpose",
            "we keep what an existing runtime entry holds; nvidia-ctk replaces it with "
            "{path, args: []}",
        ),
        Difference(
            ("default-runtime",),
            ABSENT,
            "nvidia",
            "on purpose",
            "set_as_default: false takes out a default-runtime naming our runtime (dockerd "
            "falls back to runc; documented); nvidia-ctk leaves it",
        ),
    ]


# --- the corpus ------------------------------------------------------------------------

V1 = f"""{COMMENT}
[plugins.cri]
  sandbox_image = "mirror.example/pause:3.9"
[plugins.cri.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[plugins.cri.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.cri.containerd.runtimes.runc.options]
  SystemdCgroup = true
"""

V2 = f"""{COMMENT}
version = 2
oom_score = -999

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "mirror.example/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]
      runtime_type = "io.containerd.kata.v2"
"""

# An nvidia entry from before: another BinaryName, an option of its own, no
# SystemdCgroup (runc has it since), and it is the default runtime.
V2_WITH_NVIDIA = f"""{COMMENT}
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
      BinaryName = "/usr/local/sbin/runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = "/opt/old/nvidia-container-runtime"
      NoNewKeyring = true
"""

# A site that already imports drop-ins of its own.
SITE_IMPORTS = ["/etc/containerd/site.d/*.toml"]
V2_WITH_IMPORTS = f"""{COMMENT}
version = 2
imports = {json.dumps(SITE_IMPORTS)}
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""
SITE_DROP_IN = """version = 2
[metrics]
  address = "127.0.0.1:1338"
"""

V3 = f"""{COMMENT}
version = 3

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "mirror.example/pause:3.10"

[plugins.'io.containerd.cri.v1.runtime']
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "crun"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.crun]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.crun.options]
        BinaryName = "/usr/bin/crun"
        SystemdCgroup = true
"""

# containerd 2.3 and newer (version 4): the server settings live in plugins of their own.
V4 = (
    V3.replace("version = 3\n", "version = 4\n")
    + """
[plugins.'io.containerd.server.v1.grpc']
  address = "/run/containerd/containerd.sock"
"""
)

DAEMON_JSON = """{
  "log-driver": "json-file",
  "data-root": "/srv/docker",
  "features": {"buildkit": true},
  "runtimes": {
    "kata": {"path": "/usr/bin/kata-runtime"}
  }
}
"""

# An nvidia runtime someone set up by hand: an extra argument, and it is the default.
DAEMON_JSON_WITH_NVIDIA = """{
  "default-runtime": "nvidia",
  "runtimes": {
    "nvidia": {"path": "/opt/old/nvidia-container-runtime", "runtimeArgs": ["--debug"]}
  }
}
"""

CRIO_CONF = f"""{COMMENT}
[crio.image]
pause_image = "mirror.example/pause:3.9"

[crio.runtime]
default_runtime = "crun"

[crio.runtime.runtimes.crun]
runtime_path = "/usr/libexec/crio/crun"
runtime_type = "oci"
runtime_root = "/run/crun"
monitor_path = "/usr/libexec/crio/conmon"
allowed_annotations = ["io.containers.trace-syscall"]
"""

V1_CRI, V2_CRI, V3_CRI = rc.CRI_PLUGIN[1], rc.CRI_PLUGIN[2], rc.CRI_PLUGIN[3]

CASES = [
    Case(
        "containerd-v1",
        "containerd",
        {CONTAINERD: V1},
        plugin=V1_CRI,
        expected=lambda run: [*comment(run), *v1_spelling(run)],
    ),
    Case(
        "containerd-v1-drop-in",
        "containerd",
        {CONTAINERD: V1},
        drop_in=True,
        plugin=V1_CRI,
        expected=lambda run: [*comment(run), *v1_spelling(run), *imports(run, [])],
    ),
    Case(
        "containerd-v2",
        "containerd",
        {CONTAINERD: V2},
        plugin=V2_CRI,
        expected=lambda run: [*comment(run), *imports(run, [])],
    ),
    Case(
        "containerd-v2-drop-in",
        "containerd",
        {CONTAINERD: V2},
        drop_in=True,
        plugin=V2_CRI,
        expected=lambda run: [*comment(run), *imports(run, [])],
    ),
    Case(
        "containerd-v2-old-nvidia",
        "containerd",
        {CONTAINERD: V2_WITH_NVIDIA},
        plugin=V2_CRI,
        expected=lambda run: [*comment(run), *imports(run, []), *stale_nvidia_entry(run)],
    ),
    Case(
        "containerd-v2-site-imports-drop-in",
        "containerd",
        {CONTAINERD: V2_WITH_IMPORTS, "etc/containerd/site.d/10-site.toml": SITE_DROP_IN},
        drop_in=True,
        plugin=V2_CRI,
        expected=lambda run: [*comment(run), *imports(run, SITE_IMPORTS), *site_lost(run)],
    ),
    *(
        Case(
            f"containerd-v{version}{'-drop-in' if drop_in else ''}",
            "containerd",
            {CONTAINERD: text},
            drop_in=drop_in,
            plugin=V3_CRI,
            expected=lambda run: [*comment(run), *imports(run, []), *cdi_on_by_default(run)],
        )
        for version, text in ((3, V3), (4, V4))
        for drop_in in (False, True)
    ),
    Case(
        "containerd-missing",
        "containerd",
        {},
        plugin=V2_CRI,
        expected=lambda run: [*imports(run, []), *zero_values(run)],
    ),
    Case("docker-missing", "docker", {}),
    Case("docker-empty-object", "docker", {DOCKER: "{}\n"}),
    Case(
        "docker-empty-file",
        "docker",
        {DOCKER: ""},
        theirs_refuses=(
            "EOF",
            "nvidia-ctk decodes daemon.json with encoding/json, which fails on a 0-byte "
            "file; we read an empty file as {}",
        ),
    ),
    Case("docker-foreign", "docker", {DOCKER: DAEMON_JSON}, expected=features_lost),
    Case(
        "docker-old-nvidia", "docker", {DOCKER: DAEMON_JSON_WITH_NVIDIA}, expected=old_docker_nvidia
    ),
    Case(
        "crio-main",
        "crio",
        {CRIO: CRIO_CONF},
        expected=lambda run: [*comment(run), *crio_handler_copy(run)],
    ),
    Case(
        "crio-drop-in",
        "crio",
        {CRIO: CRIO_CONF},
        drop_in=True,
        expected=lambda run: [*comment(run), *crio_handler_copy(run)],
    ),
]


# --- the comparison --------------------------------------------------------------------


def lay_out(node: Path, files: dict[str, str]) -> None:
    shutil.rmtree(node, ignore_errors=True)
    node.mkdir(parents=True)
    for rel, text in files.items():
        (node / rel).parent.mkdir(parents=True, exist_ok=True)
        (node / rel).write_text(text)


def runtime_path_key(run: Run) -> tuple[str, ...]:
    """Where each runtime names the binary of our runtime entry."""
    if run.case.runtime == "containerd":
        return run.entry("options", "BinaryName")
    if run.case.runtime == "crio":
        return run.handler("runtime_path")
    return ("runtimes", run.options.runtime_name, "path")


def _show(value: Any) -> str:
    return "<absent>" if value == ABSENT else json.dumps(value)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda options: options.id)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_same_meaning_as_nvidia_ctk(
    case: Case, options: Options, toolkit: Toolkit, tmp_path: Path
) -> None:
    run = Run(case, options, toolkit)
    node = tmp_path / "node"
    lay_out(node, case.files)
    ours(case, node, options)
    our_result = observe(case, node)

    lay_out(node, case.files)
    config, drop_in = theirs_layout(case, toolkit)
    ctk = ctk_configure(toolkit, case.runtime, node, config, drop_in, *options.flags())

    # Whatever else differs, our runtime is registered with the binary asked for.
    assert our_result.get(runtime_path_key(run)) == options.runtime_path, our_result
    if case.theirs_refuses:
        error, why = case.theirs_refuses
        assert ctk.returncode != 0 and error in ctk.stderr, (why, ctk.stderr)
        return
    assert ctk.returncode == 0, ctk.stderr
    their_result = observe(case, node)
    assert their_result.get(runtime_path_key(run)) == options.runtime_path, their_result

    actual = {
        path: (our_result.get(path, ABSENT), their_result.get(path, ABSENT))
        for path in sorted(set(our_result) | set(their_result))
        if our_result.get(path, ABSENT) != their_result.get(path, ABSENT)
    }
    expected = {d.path: (d.ours, d.theirs) for d in case.expected(run)}
    assert all(d.kind in KINDS for d in case.expected(run))
    unexpected = [
        f"  {'.'.join(path)}: ours {_show(o)}, nvidia-ctk {_show(t)}"
        for path, (o, t) in actual.items()
        if expected.get(path) != (o, t)
    ]
    missing = [
        f"  {'.'.join(d.path)}: ours {_show(d.ours)}, nvidia-ctk {_show(d.theirs)} ({d.why})"
        for d in case.expected(run)
        if actual.get(d.path) != (d.ours, d.theirs)
    ]
    assert not unexpected and not missing, (
        f"nvidia-ctk {toolkit.version} and our module differ in meaning\n"
        + ("differences nobody listed:\n" + "\n".join(unexpected) + "\n" if unexpected else "")
        + ("listed differences that did not show:\n" + "\n".join(missing) if missing else "")
    )


# --- what nvidia-ctk's layouts do at each version (why theirs_layout picks its mode) ---


def test_nvidia_ctk_in_place_containerd_v2(toolkit: Toolkit, tmp_path: Path) -> None:
    """1.17 edits config.toml; 1.18.0, 1.19.1 and 1.20.0 cannot: the runtime is lost, its own dir
    imported.

    They write every v2/v3 change as a drop-in; with an empty --drop-in-config they
    writes that drop-in to config.toml itself, then overwrites it with the top-level
    config plus `imports` of config.toml's own directory.
    """
    lay_out(tmp_path, {CONTAINERD: V2})
    drop_in = "" if toolkit.drop_in_flag else None
    ctk = ctk_configure(
        toolkit, "containerd", tmp_path, CONTAINERD, drop_in, *ROLE_DEFAULTS.flags()
    )
    assert ctk.returncode == 0, ctk.stderr
    runtimes = containerd_view(tmp_path, V2_CRI)["plugins"][V2_CRI]["containerd"]["runtimes"]
    main = tomllib.loads((tmp_path / CONTAINERD).read_text())
    if toolkit.version == "1.17.8":
        assert runtimes["nvidia"]["options"]["BinaryName"] == ROLE_DEFAULTS.runtime_path
        assert "imports" not in main
    else:
        assert toolkit.version in DROP_IN_ONLY, "pin what this nvidia-ctk does"
        assert "nvidia" not in runtimes
        assert main["imports"] == [f"{tmp_path}/etc/containerd/*.toml"]


def test_nvidia_ctk_in_place_crio(toolkit: Toolkit, tmp_path: Path) -> None:
    """1.17 edits crio.conf; 1.18.0, 1.19.1 and 1.20.0 replace crio.conf with the nvidia handler
    alone."""
    lay_out(tmp_path, {CRIO: CRIO_CONF})
    drop_in = "" if toolkit.drop_in_flag else None
    ctk = ctk_configure(toolkit, "crio", tmp_path, CRIO, drop_in, *ROLE_DEFAULTS.flags())
    assert ctk.returncode == 0, ctk.stderr
    crio = tomllib.loads((tmp_path / CRIO).read_text())["crio"]
    assert crio["runtime"]["runtimes"]["nvidia"]["runtime_path"] == ROLE_DEFAULTS.runtime_path
    if toolkit.version == "1.17.8":
        assert crio["image"]["pause_image"] == "mirror.example/pause:3.9"
        assert crio["runtime"]["default_runtime"] == "crun"
        assert set(crio["runtime"]["runtimes"]) == {"crun", "nvidia"}
    else:
        assert toolkit.version in DROP_IN_ONLY, "pin what this nvidia-ctk does"
        # The site's pause image, default runtime and crun handler are gone.
        assert crio == {"runtime": {"runtimes": {"nvidia": crio["runtime"]["runtimes"]["nvidia"]}}}


def test_nvidia_ctk_drop_in_for_a_v1_containerd_config(toolkit: Toolkit, tmp_path: Path) -> None:
    """1.17 has no --drop-in-config; 1.18.0, 1.19.1 and 1.20.0 write a v1 drop-in that nothing
    imports.

    containerd reads `imports` whatever the config's version (1.7's LoadConfig), and our
    module imports its v1 drop-in; nvidia-ctk 1.18 to 1.20 leave config.toml as it was.
    """
    lay_out(tmp_path, {CONTAINERD: V1})
    ctk = ctk_configure(
        toolkit, "containerd", tmp_path, CONTAINERD, CONTAINERD_DROP_IN, *ROLE_DEFAULTS.flags()
    )
    if toolkit.version == "1.17.8":
        assert ctk.returncode != 0
        assert "flag provided but not defined: -drop-in-config" in ctk.stderr
        return
    assert toolkit.version in DROP_IN_ONLY, "pin what this nvidia-ctk does"
    assert ctk.returncode == 0, ctk.stderr
    assert (tmp_path / CONTAINERD).read_text() == V1
    drop_in = tomllib.loads((tmp_path / CONTAINERD_DROP_IN).read_text())
    assert drop_in["plugins"]["cri"]["containerd"]["runtimes"]["nvidia"]["options"][
        "BinaryName"
    ] == (ROLE_DEFAULTS.runtime_path)
    runtimes = containerd_view(tmp_path, V1_CRI)["plugins"]["cri"]["containerd"]["runtimes"]
    assert "nvidia" not in runtimes


# --- differences that were bugs in our module, kept as regressions -------------------


def test_an_existing_nvidia_entry_takes_runcs_cgroup_driver() -> None:
    """A kept nvidia entry runs with the kubelet's cgroup driver, as nvidia-ctk's would."""
    after, _ = rc.containerd_in_place(V2_WITH_NVIDIA, CONTAINERD, **ROLE_DEFAULTS.wanted())
    runtimes = tomllib.loads(after)["plugins"][V2_CRI]["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    assert runtimes["nvidia"]["options"].get("SystemdCgroup") is True


def test_a_crio_handler_takes_the_default_handlers_conmon(tmp_path: Path) -> None:
    """A new handler inherits the default handler's conmon, as nvidia-ctk 1.18's does."""
    lay_out(tmp_path, {CRIO: CRIO_CONF})
    ours(Case("crio-drop-in", "crio", {CRIO: CRIO_CONF}, drop_in=True), tmp_path, ROLE_DEFAULTS)
    handler = crio_view(tmp_path)["crio"]["runtime"]["runtimes"]["nvidia"]
    assert handler.get("monitor_path") == "/usr/libexec/crio/conmon"

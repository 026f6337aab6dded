# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.nvidia as the artifact a user installs: built with ansible-galaxy, installed
from its tarball into an empty collections path, its plugins run from there; every
plugin's documentation renders with ansible-doc; the changelog's fragments lint; the
project's collection requirements match the collections its pinned `ansible` bundles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
COLLECTION = PROJECT / "collections" / "ansible_collections" / "gpufleet" / "nvidia"
BIN = Path(sys.executable).parent
VERSION = yaml.safe_load((COLLECTION / "galaxy.yml").read_text())["version"]


def tool(name: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(BIN / name), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def clean_env(collections: Path) -> dict[str, str]:
    """No project ansible.cfg (whose collections_path already holds gpufleet.nvidia):
    only the given collections path (and ansible's own collections) are seen."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_NOCOLOR="1")
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tarball, collections path it was installed into)."""
    work = tmp_path_factory.mktemp("collection")
    path = work / "installed"
    env = clean_env(path)
    build = ("collection", "build", str(COLLECTION), "--output-path", str(work))
    tool("ansible-galaxy", *build, cwd=work, env=env)
    tarball = work / f"gpufleet-nvidia-{VERSION}.tar.gz"
    tool(
        "ansible-galaxy", "collection", "install", str(tarball), "-p", str(path), cwd=work, env=env
    )
    assert (path / "ansible_collections" / "gpufleet" / "nvidia" / "MANIFEST.json").is_file()
    return tarball, path


def test_the_tarball_holds_the_plugins_docs_and_changelog_and_no_tests(installed):
    tarball, _ = installed
    with tarfile.open(tarball) as archive:
        names = set(archive.getnames())
    for name in (
        "MANIFEST.json",
        "README.md",
        "COPYING",
        "CHANGELOG.md",
        "meta/runtime.yml",
        "plugins/modules/gpu_facts.py",
        "plugins/filter/k8s.py",
        "plugins/filter/k8s_manifests.yml",
        "plugins/module_utils/driver_plan.py",
    ):
        assert name in names, name
    assert not any(n.startswith(("tests/", "changelogs/.plugin-cache")) for n in names)


def test_a_module_and_a_filter_run_from_the_installed_collection(installed, sim_node, tmp_path):
    _, path = installed
    sim_node("t4-1")
    env = clean_env(path)
    where = json.loads(
        tool("ansible-doc", "--json", "gpufleet.nvidia.gpu_facts", cwd=tmp_path, env=env)
    )
    assert where["gpufleet.nvidia.gpu_facts"]["doc"]["filename"].startswith(str(path))
    playbook = tmp_path / "use.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "gpufleet.nvidia.gpu_facts": {
                                "sysfs_root": str(sim_node.tmp / "run" / "sys")
                            }
                        },
                        {
                            "ansible.builtin.debug": {
                                "msg": "{{ ansible_facts.gpufleet | gpufleet.nvidia.node_summary }}"
                            }
                        },
                    ],
                }
            ]
        )
    )
    out = tool(
        "ansible-playbook",
        "-e",
        json.dumps({"ansible_python_interpreter": sys.executable}),
        str(playbook),
        cwd=tmp_path,
        env={**env, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal"},
    )
    assert '"msg": "1x Tesla T4; driver absent' in out, out


def plugins(kind: str) -> list[str]:
    listing = json.loads(
        tool("ansible-doc", "--json", "-t", kind, "-l", "gpufleet.nvidia", cwd=PROJECT)
    )
    return sorted(listing)


def released_plugins(kind: str) -> dict[str, str]:
    """{plugin: version} for the plugins the changelog records as released."""
    changelog = yaml.safe_load((COLLECTION / "changelogs" / "changelog.yaml").read_text())
    found = {}
    for version, release in changelog["releases"].items():
        changes = release.get("modules", []) if kind == "module" else []
        changes += release.get("plugins", {}).get(kind, [])
        found.update({plugin["name"]: version for plugin in changes})
    return found


@pytest.mark.parametrize("kind", ["module", "filter"])
def test_every_plugin_has_documentation_and_examples(kind):
    names = plugins(kind)
    assert len(names) >= (6 if kind == "module" else 20)
    docs = json.loads(tool("ansible-doc", "--json", "-t", kind, *names, cwd=PROJECT))
    released = released_plugins(kind)
    for name in names:
        entry = docs[name]
        assert entry["doc"]["short_description"], name
        # A plugin of a released version says that version; a new one, the next.
        short = name.removeprefix("gpufleet.nvidia.")
        assert entry["doc"]["version_added"] == released.get(short, VERSION), name
        assert (entry.get("examples") or "").strip(), f"{name} has no examples"
    text = tool("ansible-doc", "-t", kind, names[0], cwd=PROJECT)
    assert "EXAMPLES" in text


def test_the_changelog_fragments_lint():
    tool("antsibull-changelog", "lint", cwd=COLLECTION)


def test_collection_requirements_match_what_the_pinned_ansible_bundles():
    wanted = yaml.safe_load((PROJECT / "collections" / "requirements.yml").read_text())
    import ansible_collections

    for entry in wanted["collections"]:
        namespace, name = entry["name"].split(".")
        manifest = next(
            Path(root) / namespace / name / "MANIFEST.json"
            for root in ansible_collections.__path__
            if (Path(root) / namespace / name / "MANIFEST.json").is_file()
        )
        version = json.loads(manifest.read_text())["collection_info"]["version"]
        assert entry["version"] == version, entry["name"]
    used = set()
    for file in [*(PROJECT / "roles").rglob("*.yml"), *(PROJECT / "playbooks").rglob("*.yml")]:
        for word in file.read_text().split():
            parts = word.rstrip(":").split(".")
            if (
                len(parts) == 3
                and parts[0] in ("kubernetes", "community", "ansible")
                and parts[1] != "builtin"
            ):
                used.add(f"{parts[0]}.{parts[1]}")
    assert used == {e["name"] for e in wanted["collections"]}, used

# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The command line's contract with scripts (docs/cli.md): every verb that reports has
--json, every --json prints one envelope {schema_version, kind, data}, an exit code is
the same with and without it, errors are documents too, Ansible failing in the middle
of a cycle is not a usage error, every option says what it does, and the program calls
itself by the name it was started as."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runner import __version__, cli, output
from runner.arguments import build_parser
from runner.engine import EngineError
from runner.state import (
    HistoryEntry,
    HistoryKind,
    HostRecord,
    RolloutRecord,
    StateStore,
    state_dir_for,
)

PROJECT = Path(__file__).resolve().parents[2]
EMPTY_INVENTORY = str(PROJECT / "inventories" / "none.yml")
DOCS = PROJECT / "docs" / "cli.md"


@pytest.fixture
def where(tmp_path: Path) -> list[str]:
    """A state with a converged host, a quarantined one and a pool's rollout."""
    state = tmp_path / "state"
    with StateStore(state_dir_for(state, EMPTY_INVENTORY)) as store:
        store.save(
            HostRecord("gpu-a", status="converged"),
            [HistoryEntry(1.0, "gpu-a", "corrective", "exporter", "1 task(s) changed")],
        )
        store.save(HostRecord("gpu-b", status="failed", quarantined=True, reason="toolkit: x"))
        store.save_rollout(RolloutRecord("train", started=time.time() - 60, done=["gpu-a"]))
    return ["-i", EMPTY_INVENTORY, "--state-dir", str(state)]


def both(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, int, dict[str, Any]]:
    """(exit code as text, exit code with --json, the JSON document)."""
    text_code = cli.main(list(argv))
    capsys.readouterr()
    json_code = cli.main([*argv, "--json"])
    out = capsys.readouterr().out
    return text_code, json_code, json.loads(out)


def envelope(doc: dict[str, Any], kind: str) -> Any:
    assert set(doc) == {"schema_version", "kind", "data"}, doc
    assert doc["schema_version"] == output.SCHEMA_VERSION == 1
    assert doc["kind"] == kind
    return doc["data"]


def test_status_is_a_document_with_the_tables_exit_code(capsys, where):
    text, json_code, doc = both(capsys, "status", *where)
    assert text == json_code == output.Exit.FAILED, "gpu-b is quarantined"
    status = envelope(doc, "status")
    assert [h["name"] for h in status["hosts"]] == ["gpu-a", "gpu-b"]
    assert status["cluster"]["status"] == "unknown"
    assert [r["pool"] for r in status["rollouts"]] == ["train"]


def test_history_release_and_version_are_documents(capsys, where):
    text, json_code, doc = both(capsys, "history", *where)
    assert text == json_code == output.Exit.OK
    (entry,) = envelope(doc, "history")["entries"]
    assert (entry["host"], entry["kind"], entry["component"]) == ("gpu-a", "corrective", "exporter")

    code = cli.main(["release", "gpu-b", *where, "--json"])
    released = envelope(json.loads(capsys.readouterr().out), "release")["released"]
    assert (code, released) == (output.Exit.OK, [{"host": "gpu-b", "status": "failed"}])

    text, json_code, doc = both(capsys, "version")
    assert text == json_code == output.Exit.OK
    version = envelope(doc, "version")
    assert version["version"] == __version__
    assert version["source"] in ("checkout", "installed package", "$GPUFLEET_PROJECT")
    assert Path(version["playbooks"], "site.yml").is_file()


def test_plan_and_reconcile_print_the_cycles_report(capsys, tmp_path):
    where = ["-i", EMPTY_INVENTORY, "--state-dir", str(tmp_path / "state")]
    for verb, extra in (("plan", []), ("reconcile", ["--once"])):
        text, json_code, doc = both(capsys, verb, *where, *extra)
        assert text == json_code == output.Exit.OK, verb
        report = envelope(doc, verb)
        assert (report["probed"], report["outcomes"], report["interrupted"]) == (0, {}, False)


def test_an_error_is_a_document_too_with_its_exit_code(capsys, where):
    code = cli.main(["release", "gpu-z", *where, "--json"])
    out, err = capsys.readouterr()
    assert code == output.Exit.USAGE
    error = envelope(json.loads(out), "error")
    assert error == {"message": error["message"], "exit_code": 2}
    assert "unknown host(s) gpu-z" in error["message"] and error["message"] in err


def test_ansible_failing_mid_cycle_is_not_a_usage_error(capsys, tmp_path, monkeypatch):
    def broken(self: Any, once: bool = False) -> None:
        raise EngineError("ansible-playbook site.yml did not run (error): no such file")

    monkeypatch.setattr(cli.Reconciler, "run", broken)
    where = ["-i", EMPTY_INVENTORY, "--state-dir", str(tmp_path / "state")]
    code = cli.main(["reconcile", "--once", *where, "--json"])
    out, err = capsys.readouterr()
    assert code == output.Exit.ENGINE == 6
    assert envelope(json.loads(out), "error")["exit_code"] == 6
    assert "did not run" in err
    # The help's list of exit codes names it.
    assert "6 Ansible could not be run" in " ".join(output.EXIT_TEXT.split())


def _options(parser: argparse.ArgumentParser, where: str = "") -> list[tuple[str, Any]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, f"{where}{name} ")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            found.append((f"{where}{action.dest}", action))
    return found


def test_every_option_of_every_verb_says_what_it_does():
    silent = [name for name, action in _options(build_parser()) if not action.help]
    assert not silent, f"options without help: {silent}"


def test_every_verb_that_reports_has_json():
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in verbs.choices.items():
        assert "--json" in sub._option_string_actions, name


def test_history_kind_lists_its_values_and_refuses_others(capsys, where):
    kind = next(a for name, a in _options(build_parser()) if name == "history kind")
    assert kind.choices == [str(k) for k in HistoryKind]
    with pytest.raises(SystemExit) as refused:
        cli.main(["history", "--kind", "drifted", *where])
    assert refused.value.code == output.Exit.USAGE
    assert "invalid choice: 'drifted'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv0", "name"),
    [
        ("/opt/gpufleet/bin/gpufleet", "gpufleet"),
        ("/usr/lib/python3/site-packages/runner/__main__.py", "python -m runner"),
    ],
)
def test_the_program_calls_itself_as_it_was_started(capsys, tmp_path, monkeypatch, argv0, name):
    monkeypatch.setattr(sys, "argv", [argv0])
    assert build_parser().prog == name
    code = cli.main(["status", "-i", EMPTY_INVENTORY, "--state-dir", str(tmp_path)])
    assert code == output.Exit.USAGE
    assert f"run `{name} reconcile -i {EMPTY_INVENTORY}` first" in capsys.readouterr().err


def test_the_contract_is_written_down():
    text = " ".join(DOCS.read_text().split())
    for code in output.Exit:
        assert f"| {int(code)} |" in text, f"docs/cli.md does not list exit code {int(code)}"
    for kind in output.Kind:
        assert f"`{kind}`" in text, f"docs/cli.md does not describe documents of kind {kind}"
    assert f"schema_version` is {output.SCHEMA_VERSION}" in text

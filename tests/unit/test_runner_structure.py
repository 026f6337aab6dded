# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reconciler's shape, as docs/reconciler.md maps it: one module writes the state,
and no module or function grows past what a reader takes in at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[2] / "src" / "runner"
STATE = RUNNER / "state.py"
# The one module that may call StateStore's write methods (state.py defines them).
WRITER = RUNNER / "writer.py"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 50


def _modules() -> list[Path]:
    return sorted(RUNNER.glob("*.py"))


def _store_writes() -> set[str]:
    """StateStore's methods that write: those that open a transaction or append
    history (opening and rebuilding the database are the CLI's, not writes)."""
    tree = ast.parse(STATE.read_text())
    store = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "StateStore")
    writes = set()
    for method in store.body:
        if not isinstance(method, ast.FunctionDef) or method.name in ("open", "rebuild"):
            continue
        called = {
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in ast.walk(method)
            if isinstance(node, ast.Call)
        }
        if called & {"_transaction", "_append"}:
            writes.add(method.name)
    return writes


def _store_calls(path: Path, methods: set[str]) -> list[str]:
    """Calls of `methods` on something named *store (store.save, ctx.writer.store.record)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = node.func.value
        name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
        if node.func.attr in methods and name.endswith("store"):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node.func)}")
    return found


def test_the_store_write_methods_are_known() -> None:
    assert {"save", "forget_missing", "save_cluster", "save_rollout", "record"} <= _store_writes()


def test_only_the_writer_writes_the_state() -> None:
    writes = _store_writes()
    assert _store_calls(WRITER, writes), "the writer itself is found by the check"
    others = [c for p in _modules() if p not in (WRITER, STATE) for c in _store_calls(p, writes)]
    assert others == [], "state written outside runner.writer"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_modules_and_functions_stay_short(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []

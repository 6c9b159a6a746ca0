"""The benchmarks import what the project still has: they are scripts that type checking does not
read and most tests do not run, so a name moved in a refactor would break them unseen."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py"))


def _imported(path: Path) -> list[tuple[str, str]]:
    """(module, name) of each ``from shipyard... import name`` in the file, read, not run."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("shipyard")
        ):
            found += [(str(node.module), alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.name for p in BENCHMARKS])
def test_every_name_a_benchmark_imports_exists(path: Path) -> None:
    missing = []
    for module, name in _imported(path):
        if not hasattr(importlib.import_module(module), name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{path.name} imports names the project no longer has: {missing}"

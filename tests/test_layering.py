"""Imports flow one way: gateway → ledger, projections → ledger; emulator imports nothing of ours."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"ledger", "gateway", "projections", "emulator", "usage_ledger", "migrations"}
ALLOWED = {
    "ledger": set(),
    "gateway": {"ledger"},
    "projections": {"ledger"},
    "emulator": set(),
}


def _imported_packages(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_flow_one_way(package: str) -> None:
    violations = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in sorted((ROOT / package).rglob("*.py"))
        if (bad := _imported_packages(path) - ALLOWED[package] - {package})
    }
    assert violations == {}


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from projections.engine import x\nimport gateway.app\n")
    assert _imported_packages(module) == {"projections", "gateway"}

"""Imports flow one way: gateway → ledger, projections → ledger, answers → projections, imports → answers, replay →
gateway and answers, ui and otel → answers; emulator imports nothing of ours."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "usage_ledger"
LAYERS = {"ledger", "gateway", "projections", "answers", "imports", "replay", "emulator", "migrations", "ui", "otel"}
ALLOWED = {
    "ledger": set(),
    "gateway": {"ledger"},
    "projections": {"ledger"},  # the read-model engine: tables, folds, follower, rebuild, digest, formulas
    "answers": {"ledger", "projections"},  # reads the read models to answer questions
    "imports": {"ledger", "projections", "answers"},  # a writer: appends what files hold
    "replay": {"ledger", "gateway", "projections", "answers"},  # a writer: a run sent again through the gateway
    "emulator": set(),
    "ui": {
        "ledger",
        "projections",
        "answers",
    },  # the dashboard reads read models; `cli` hands its routers to the gateway
    "otel": {"ledger", "projections", "answers"},  # exports committed events by the read model's rules; `cli` starts it
}


def _layer(module: str) -> str | None:
    """The layer a module belongs to: `usage_ledger.gateway.call` → gateway, `usage_ledger.cli` → the
    composition root; a bare `gateway.call` is the old top-level name, which no longer exists."""
    parts = module.split(".")
    if parts[0] in LAYERS:
        return f"bare {parts[0]}"
    if parts[0] != "usage_ledger":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "usage_ledger"


def _imported_packages(path: Path) -> set[str]:
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules += (
                [node.module] if node.module != "usage_ledger" else [f"usage_ledger.{a.name}" for a in node.names]
            )
    return {layer for module in modules if (layer := _layer(module))}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_flow_one_way(package: str) -> None:
    violations = {
        str(path.relative_to(PACKAGE)): sorted(bad)
        for path in sorted((PACKAGE / package).rglob("*.py"))
        if (bad := _imported_packages(path) - ALLOWED[package] - {package})
    }
    assert violations == {}


def _imports_argparse(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(alias.name == "argparse" for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "argparse":
            return True
    return False


@pytest.mark.parametrize("package", sorted(ALLOWED.keys() - {"emulator"}))
def test_the_command_line_lives_in_the_composition_root(package: str) -> None:
    """`usage_ledger.commands` and `cli` own the CLI and its helpers; a layer has none (the emulator,
    which runs alone as `python -m usage_ledger.emulator`, keeps its own)."""
    parsing = [str(p.relative_to(PACKAGE)) for p in sorted((PACKAGE / package).rglob("*.py")) if _imports_argparse(p)]
    assert parsing == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from usage_ledger.projections.engine import x\nimport usage_ledger.gateway.app\n"
        "from usage_ledger import cli\nimport emulator.app\nimport os\n"
    )
    assert _imported_packages(module) == {"projections", "gateway", "usage_ledger", "bare emulator"}

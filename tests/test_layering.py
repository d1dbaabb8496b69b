"""Imports flow one way: gateway → ledger, projections → ledger, answers → projections, imports → answers, replay →
gateway and answers, ui → answers, otel → answers and gateway; emulator imports nothing of ours.

Between packages, only faces: a module outside a package imports what the package's `__init__` exports
(`from usage_ledger.ledger import Database`), never one of its inner modules (two exceptions: the tables of
`ledger.schema` and `projections.tables`, the storage contract queried with plain SQL), and never a
`_`-private module or name of another package. And no import circle anywhere, counting every import
(inside functions and `if TYPE_CHECKING:` too).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
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
    # exports committed calls by the read model's fold, names their endpoints as the gateway routes them; `cli` starts it
    "otel": {"ledger", "gateway", "projections", "answers"},
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


HTTP_PARSERS = {"httptools", "h11", "llhttp", "aiohttp", "http.client"}


def _parses_http(path: Path) -> bool:
    return any(module.split(".")[0] in HTTP_PARSERS or module in HTTP_PARSERS for module, _ in _imports(path))


def test_http_is_parsed_by_hand_only_in_the_gateways_http_package() -> None:
    """Issue #38: the gateway's own HTTP/1.1 server and client live in `gateway._http` (kept by measurement,
    its docstring says which); no other module of the product parses HTTP itself or brings a second stack."""
    parsing = [
        str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py")) if "_http" not in p.parts and _parses_http(p)
    ]
    assert parsing == []
    assert _parses_http(PACKAGE / "gateway" / "_http" / "connection.py")  # the check sees a parser where one is


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from usage_ledger.projections.engine import x\nimport usage_ledger.gateway.app\n"
        "from usage_ledger import cli\nimport emulator.app\nimport os\n"
    )
    assert _imported_packages(module) == {"projections", "gateway", "usage_ledger", "bare emulator"}


FACED = ("ledger", "gateway", "projections", "answers", "imports", "replay", "otel", "ui", "emulator", "demo")
TABLE_MODULES = {"usage_ledger.ledger.schema", "usage_ledger.projections.tables"}  # the storage contract (DESIGN §3)
NOT_YET_FACED = {"migrations"}  # Alembic's


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(module: str) -> str | None:
    """`usage_ledger.answers.compare` → answers; a module of the composition root (`usage_ledger.cli`) → None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def _imports(path: Path) -> Iterator[tuple[str, list[str]]]:
    """Every import in a module, at any depth: (module imported from, names imported)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [alias.name for alias in node.names]


def _reaches_inside(path: Path, own: str | None) -> list[str]:
    """The imports of `path` (a module of package `own`) that reach past another package's face, or take a
    private module or name of it."""
    found = []
    for module, names in _imports(path):
        parts = module.split(".")
        if parts[0] != "usage_ledger" or len(parts) < 2 or parts[1] == own or not (PACKAGE / parts[1]).is_dir():
            continue
        private = [p for p in parts[2:] if p.startswith("_")] + [n for n in names if n.startswith("_")]
        if private or (
            own not in NOT_YET_FACED and parts[1] in FACED and len(parts) > 2 and module not in TABLE_MODULES
        ):
            found.append(f"{module} import {', '.join(names)}" if names else module)
        elif len(parts) == 2 and parts[1] in FACED:
            face = importlib.import_module(module)
            found += [f"{module} import {name} (not in its __all__)" for name in names if name not in face.__all__]
    return found


def test_other_packages_import_only_a_face() -> None:
    reaching = {
        str(path.relative_to(PACKAGE)): bad
        for path in sorted(PACKAGE.rglob("*.py"))
        if (bad := _reaches_inside(path, _package_of(_module_name(path))))
    }
    assert reaching == {}


def _import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module → the modules of ours it imports (`from pkg import name` counts `pkg.name` when that is a module)."""
    modules = {_module_name(path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, names in _imports(path):
            targets |= {f"{module}.{n}" if f"{module}.{n}" in modules else module for n in names} or {module}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_no_import_circle() -> None:
    """A module's package `__init__` is not counted as imported by it (Python runs it first, always)."""
    assert _circles(_import_graph(sorted(PACKAGE.rglob("*.py")))) == []


def test_no_import_circle_between_packages() -> None:
    """Nor between the packages (and the composition root's modules): `demo` once imported `commands`, which
    imported `demo` inside a function; it now gets what it needs of the CLI as parameters."""
    graph: dict[str, set[str]] = {}
    for module, targets in _import_graph(sorted(PACKAGE.rglob("*.py"))).items():
        room = module.split(".")[1] if "." in module else module
        graph.setdefault(room, set()).update(t.split(".")[1] for t in targets if "." in t)
        graph[room].discard(room)
    graph = {room: {t for t in targets if t in graph} for room, targets in graph.items()}
    assert _circles(graph) == []


def test_the_checkers_see_a_reach_inside_and_a_circle(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from usage_ledger.ledger.db import Database\nfrom usage_ledger.ledger.schema import events\n"
        "from usage_ledger.answers._aggregate import run_filter\nfrom usage_ledger.ledger import Database\n"
        "from usage_ledger.answers import export_columns\nfrom usage_ledger.ui.views import calls_view\n"
        "from usage_ledger.gateway.relay import _relay\nfrom usage_ledger.gateway.app import create_app\n"
    )
    assert _reaches_inside(module, "ui") == [
        "usage_ledger.ledger.db import Database",
        "usage_ledger.answers._aggregate import run_filter",
        "usage_ledger.answers import export_columns (not in its __all__)",
        "usage_ledger.gateway.relay import _relay",
        "usage_ledger.gateway.app import create_app",
    ]
    assert _reaches_inside(module, "gateway") == [  # its own inner modules are its own
        "usage_ledger.ledger.db import Database",
        "usage_ledger.answers._aggregate import run_filter",
        "usage_ledger.answers import export_columns (not in its __all__)",
        "usage_ledger.ui.views import calls_view",
    ]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []

"""The gateway imports `usage_ledger.ledger` (and third-party code) only: never projections or the emulator."""

from __future__ import annotations

import ast
from pathlib import Path

from usage_ledger import gateway

FORBIDDEN = ("usage_ledger.projections", "usage_ledger.emulator")


def test_gateway_imports_neither_projections_nor_emulator() -> None:
    root = Path(gateway.__file__).parent
    offenders: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}:{node.lineno}: {n}" for n in names if n.startswith(FORBIDDEN)]
    assert offenders == []


def test_public_names() -> None:
    assert set(gateway.__all__) >= {"create_app", "serve", "SseScanner", "GatewayError"}
    for name in gateway.__all__:
        assert hasattr(gateway, name)


def _gateway_imports() -> dict[str, set[str]]:
    """Each gateway module and the gateway modules it imports (TYPE_CHECKING imports too)."""
    root = Path(gateway.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in sorted(root.glob("*.py")):
        deps = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("usage_ledger.gateway."):
                deps.add(node.module.split(".")[2])
    return graph


def test_no_import_circle_inside_the_gateway() -> None:
    graph = _gateway_imports()
    circles: list[list[str]] = []

    def walk(start: str, node: str, path: list[str]) -> None:
        for dep in sorted(graph.get(node, ())):
            if dep == start:
                circles.append(path)
            elif dep not in path and dep > start:
                walk(start, dep, [*path, dep])

    for module in graph:
        walk(module, module, [module])
    assert circles == []

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

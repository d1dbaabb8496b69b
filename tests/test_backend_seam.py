"""Issue #56: nothing outside the backend modules asks which database it is on.

Every SQLite/PostgreSQL difference lives in `ledger.backend_sqlite` or `ledger.backend_postgresql` (and the
appenders and digest they own), behind `ledger.backend.Backend`; `ledger.db` maps names to them. Any other
module of the package that compares against a backend's name, reads `dialect.name` or `get_backend_name()`,
imports a dialect or a backend's module, or uses a backend's own attributes fails here. Migrations keep theirs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "usage_ledger"
BACKEND_MODULES = {
    "ledger/backend_sqlite.py",
    "ledger/backend_postgresql.py",
    "ledger/sqlite_append.py",
    "ledger/sqlite_digest.py",
    "ledger/sqlite_digest_lines.py",
    "ledger/pg_append.py",
    "ledger/db.py",  # the registry: which backend serves a URL's scheme or a connection's dialect
}
NAMES = {"sqlite", "postgresql", "postgres"}
PER_BACKEND_MODULES = {m.removesuffix(".py").replace("/", ".") for m in BACKEND_MODULES - {"ledger/db.py"}}
PER_BACKEND_ATTRIBUTES = {"sqlite_appender", "postgres_appender", "sqlite_write", "get_backend_name"}


def _is_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in NAMES
    return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(_is_name(e) for e in node.elts)


def branches(source: str) -> list[str]:
    """Where a module's source asks which database it is on, as `line: what`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare) and any(_is_name(side) for side in (node.left, *node.comparators)):
            found.append(f"{line}: compares with a backend's name")
        elif isinstance(node, ast.Call) and any(_is_name(arg) for arg in node.args):
            if isinstance(node.func, ast.Attribute) and node.func.attr in {"startswith", "endswith", "get"}:
                found.append(f"{line}: {node.func.attr} a backend's name")
        elif isinstance(node, ast.Attribute):
            if node.attr == "name" and isinstance(node.value, ast.Attribute) and node.value.attr == "dialect":
                found.append(f"{line}: dialect.name")
            elif node.attr in PER_BACKEND_ATTRIBUTES:
                found.append(f"{line}: {node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            for module in modules:
                if (
                    module.startswith("sqlalchemy.dialects")
                    or module.removeprefix("usage_ledger.") in PER_BACKEND_MODULES
                ):
                    found.append(f"{line}: imports {module}")
        elif isinstance(node, ast.Import):
            found += [f"{line}: imports {a.name}" for a in node.names if a.name.startswith("sqlalchemy.dialects")]
    return found


def _modules(package: Path) -> list[Path]:
    return [
        path
        for path in sorted(package.rglob("*.py"))
        if "migrations" not in path.relative_to(package).parts and str(path.relative_to(package)) not in BACKEND_MODULES
    ]


def test_no_module_outside_the_backends_branches_on_the_database() -> None:
    asking = {str(p.relative_to(PACKAGE)): b for p in _modules(PACKAGE) if (b := branches(p.read_text()))}
    assert asking == {}


def test_the_backend_modules_exist() -> None:
    assert all((PACKAGE / module).is_file() for module in BACKEND_MODULES)


@pytest.mark.parametrize(
    "source",
    [
        'if database.backend == "postgresql": pass',
        'x = a if conn.dialect.name != "sqlite" else b',
        'ok = backend in ("postgresql", "postgres")',
        "name = conn.dialect.name",
        "appender = database.sqlite_appender or database.postgres_appender",
        'sqlite = url.drivername.startswith("sqlite")',
        "kind = make_url(url).get_backend_name()",
        "from sqlalchemy.dialects import postgresql",
        "from usage_ledger.ledger.pg_append import PostgresAppender",
        "from usage_ledger.ledger import backend_sqlite",
    ],
)
def test_the_checker_sees_a_branch(source: str) -> None:
    assert branches(source) != []


def test_the_checker_lets_the_interface_pass() -> None:
    source = 'if not database.backend_ops.can_hold(call_id): raise NotFound(call_id)\nlog.info("x", backend=db.backend)'
    assert branches(source) == []

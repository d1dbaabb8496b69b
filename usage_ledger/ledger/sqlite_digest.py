"""A read model's digest on SQLite; a big version's upper half encoded by a child process.

    parent: rows with key < split ──encode──► sha256 ◄── then the child's bytes, in order
    child (`sqlite_digest_lines`): rows with key ≥ split ──encode──► a scratch file

The stored datetime text is rewritten to the RFC 3339 form msgspec writes in SQL, and rows are read as
plain tuples and encoded a page at a time: what decoding each value to a `datetime` and encoding that
would give, without the per-value round trip. Reading a million rows of 26 columns into Python and
encoding them is the cost of a digest (the hash itself is cheap), and it is one core's work; the child
does half of it on the other core. Both halves read the ledger read-only with the standard library's
`sqlite3` (the library the ledger's own connections use), each recording the version's checkpoint in
its read transaction; if it moved in between (a catch-up on that version), the version is digested in
one snapshot instead, as small versions are.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.errors import LedgerError
from usage_ledger.ledger.schema import UTCDateTime
from usage_ledger.ledger.sqlite_digest_lines import connect_read_only, encode_page, encode_range

__all__ = ("CHILD_FROM", "digest_rows")

CHILD_FROM = 200_000  # rows: below this a second process costs more than it saves
_PAGE = 20_000
# where this package was imported from: the child process imports the same code
_ROOT = str(Path(__file__).resolve().parents[2])


def _rfc3339_sql(name: str) -> str:
    """SQL: a stored SQLite datetime (`YYYY-MM-DD HH:MM:SS.ffffff`, naive UTC) as msgspec encodes it (RFC 3339).

    In that shape the only `.000000` is the fraction; any other stored text is marked with `ODD`.
    """
    return (
        f"CASE WHEN {name} GLOB '????-??-?? ??:??:??.??????' "
        f"THEN replace(replace({name}, ' ', 'T'), '.000000', '') || 'Z' ELSE char(0) || {name} END"
    )


class _Query:
    """`table`'s digest SQL: its columns but `version`, of one version, in key order (`{op}`: a bound on
    the key for a half of the rows)."""

    def __init__(self, table: Table) -> None:
        columns = [c for c in table.columns if c.name != "version"]
        (self.key,) = [c.name for c in table.primary_key.columns if c.name != "version"]
        self.table = table.name
        self.times = tuple(i for i, c in enumerate(columns) if isinstance(c.type, UTCDateTime))
        self.range = (
            "SELECT "
            + ", ".join(_rfc3339_sql(c.name) if i in self.times else c.name for i, c in enumerate(columns))
            + f" FROM {table.name} WHERE version = ? AND {self.key} {{op}} ? ORDER BY {self.key}"
        )
        self.all = self.range.replace(f"{self.key} {{op}} ?", "1")


_queries: dict[str, _Query] = {}


async def digest_rows(
    conn: AsyncConnection, table: Table, version: int, checkpoint: str, child_from: int = CHILD_FROM
) -> str:
    """`Backend.digest` on SQLite; from `child_from` rows the upper half in a child process."""
    query = _queries.get(table.name) or _queries.setdefault(table.name, _Query(table))
    ledger = conn.engine.url.database
    assert ledger is not None
    split = await asyncio.to_thread(_split_digest, ledger, query, version, checkpoint, child_from)
    if split is not None:
        return split
    digest = hashlib.sha256()
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    cursor = await driver.execute(query.all, (version,))
    try:
        while rows := await cursor.fetchmany(_PAGE):
            digest.update(encode_page(rows, query.times))
    finally:
        await cursor.close()
    return digest.hexdigest()


def _split_digest(ledger: str, query: _Query, version: int, checkpoint: str, child_from: int) -> str | None:
    """SHA-256 over the lines of `query` in key order, the upper half encoded by a child process.

    None when the version has fewer than `child_from` rows, or when it changed between the two
    halves' snapshots: the caller then digests it in one. Blocking: run it in a thread.
    """
    conn = connect_read_only(ledger)
    try:
        count = conn.execute(f"SELECT count(*) FROM {query.table} WHERE version = ?", (version,)).fetchone()[0]
        if count < max(child_from, 2):
            return None
        (split,) = conn.execute(
            f"SELECT {query.key} FROM {query.table} WHERE version = ? ORDER BY {query.key} LIMIT 1 OFFSET ?",
            (version, count // 2),
        ).fetchone()
        digest = hashlib.sha256()
        with tempfile.TemporaryDirectory(prefix="ledger-digest-") as workdir:
            upper = Path(workdir) / "upper.jsonl"
            child = _start_child(ledger, query.range, version, split, query.times, checkpoint, upper)
            try:
                mine = encode_range(conn, query.range, version, ("<", split), query.times, checkpoint, digest.update)
                out, err = child.communicate()
            finally:
                if child.poll() is None:  # failed or interrupted here: the child must not outlive the digest
                    child.kill()
                    child.wait()
            if child.returncode != 0:
                raise LedgerError(
                    f"digest of {checkpoint} version {version} in {ledger} failed: "
                    f"{err.decode(errors='replace').strip()}"
                )
            if int(out) != mine:
                return None
            with upper.open("rb") as lines:
                while chunk := lines.read(1 << 20):
                    digest.update(chunk)
        return digest.hexdigest()
    finally:
        conn.close()


def _start_child(
    ledger: str, sql: str, version: int, split: str, time_indexes: Sequence[int], checkpoint: str, out: Path
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)}
    argv = [ledger, sql, str(version), split, ",".join(map(str, time_indexes)), checkpoint, str(out)]
    return subprocess.Popen(
        [sys.executable, "-m", "usage_ledger.ledger.sqlite_digest_lines", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )

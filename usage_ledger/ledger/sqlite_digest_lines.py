"""Digest lines of a read model on SQLite, and the child process that writes half of them.

    python -m usage_ledger.ledger.sqlite_digest_lines LEDGER SQL VERSION SPLIT TIMES PROJECTION OUT
        rows of VERSION with key ≥ SPLIT ──encode──► OUT; prints PROJECTION's checkpoint of VERSION

A digest line is the msgspec JSON array of a row's values. The SQL rewrites each stored datetime
to the text msgspec writes for it; any stored datetime not in SQLAlchemy's shape comes back marked
with `ODD` and is parsed here as SQLAlchemy would. Imports nothing heavy: the child starts fast.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

__all__ = ("ODD", "connect_read_only", "encode_page", "encode_range", "main")

ODD = "\x00"  # prefixed (in SQL) to a stored datetime not in SQLAlchemy's shape; escaped by msgspec as \u0000
_PAGE = 20_000
_encoder = msgspec.json.Encoder(order="sorted")
_CHECKPOINT = "SELECT position FROM ledger_checkpoints WHERE projection = ? AND version = ?"


def encode_page(rows: Sequence[Sequence[Any]], time_indexes: Sequence[int]) -> bytes:
    """The digest lines of a page of rows (one msgspec JSON array per row)."""
    lines = _encoder.encode_lines(rows)
    if b"\\u0000" in lines:  # a datetime SQL left alone (or a NUL in some text: harmless)
        lines = _encoder.encode_lines([_odd_times_parsed(r, time_indexes) for r in rows])
    return lines


def _odd_times_parsed(row: Sequence[Any], time_indexes: Sequence[int]) -> tuple[Any, ...]:
    out = list(row)
    for i in time_indexes:
        value = out[i]
        if isinstance(value, str) and value.startswith(ODD):
            out[i] = datetime.fromisoformat(value[1:]).replace(tzinfo=UTC)
    return tuple(out)


def connect_read_only(ledger: str) -> sqlite3.Connection:
    uri = f"file:{quote(Path(ledger).resolve().as_posix())}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def encode_range(
    conn: sqlite3.Connection,
    sql: str,
    version: int,
    bounds: tuple[str, str],
    time_indexes: Sequence[int],
    projection: str,
    sink: Callable[[bytes], object],
) -> int:
    """Feed the lines of the rows with key `bounds` (e.g. `("<", split)`) to `sink`; returns `projection`'s
    checkpoint of `version`."""
    conn.execute("BEGIN")  # one snapshot: the checkpoint and the rows together
    try:
        checkpoint = conn.execute(_CHECKPOINT, (projection, version)).fetchone()
        cursor = conn.execute(sql.format(op=bounds[0]), (version, bounds[1]))
        while rows := cursor.fetchmany(_PAGE):
            sink(encode_page(rows, time_indexes))
    finally:
        conn.execute("COMMIT")
    return int(checkpoint[0]) if checkpoint else 0


def main(argv: Sequence[str]) -> int:
    """Child: write the lines of the rows with key ≥ SPLIT to OUT; print the checkpoint it read."""
    ledger, sql, version, split, times, projection, out = argv
    time_indexes = [int(i) for i in times.split(",") if i]
    try:
        conn = connect_read_only(ledger)
        try:
            with open(out, "wb") as sink:
                checkpoint = encode_range(conn, sql, int(version), (">=", split), time_indexes, projection, sink.write)
        finally:
            conn.close()
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

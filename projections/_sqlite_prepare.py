"""The read-only half of the SQLite bulk calls load, in a child process with a current SQLite.

    parent: prepare_calls ── python -m projections._sqlite_prepare LEDGER WORKDIR HEAD ──► child
    child:  ledger (read-only) ─┬─ starts, then ends after `split` ──► WORKDIR/starts.db ┐ two threads,
                                └─ ends up to `split`               ──► WORKDIR/ends.db   ┘ two connections
            the ends in starts.db appended to those in ends.db, indexed
            starts ⟕ ends ──► WORKDIR/rows.db (rebuild_rows, rebuild_rest) ◄── ATTACHed by the parent for the copy

Why a child process: the JSON scans are most of a rebuild, and SQLite's JSON functions got much
faster in 3.45; the standard library links the system's SQLite (3.40 on Debian 12), so the child
uses the one bundled in the `sqlean.py` wheel. That is a second copy of the SQLite library, and two
copies in one process must never open the same database file (closing one's file descriptor drops
the POSIX locks the other holds: <https://sqlite.org/howtocorrupt.html>, "Multiple copies of SQLite
linked into the same application"). In its own process it is just another reader, and it opens
the ledger read-only. Without the wheel the child runs the same statements on the standard library's
`sqlite3`. The scans share nothing, so they run on two connections at once (SQLite releases the
GIL while it works). The ends cost more to scan than the starts, so the starts connection also
scans the ends of the last positions (`_ENDS_FIRST_SHARE`); that part is appended to the rest
before the ends are indexed. One statement per table and connection: `CREATE TABLE … AS` runs on
both connections at once, an `INSERT … SELECT` per range of positions (tried) took turns with
the other connection and was no faster than one.

Work files are scratch: no journal, no fsync, a bounded page cache per connection (memory stays
flat; SQLite spills to the files); the parent deletes the directory after the load.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

from projections._bulk_sqlite import (
    ENDS_INDEX,
    ENDS_SELECT,
    ORPHANS_POSSIBLE,
    ROWS_STATEMENTS,
    STARTS_STATEMENTS,
    rest_statements,
)

__all__ = ("ROWS_FILE", "main", "prepare")

ROWS_FILE = "rows.db"
_CACHE = "-65536"  # KiB per connection and schema, as PRAGMA cache_size takes it
_ENDS_FIRST_SHARE = 0.8
"""The share of positions whose ends the ends connection scans; the starts connection scans the ends
after them once its starts are done. Gateway calls' starts cost about 0.6 of their ends to scan
(4.2 s and 7.1 s for 1M calls, one connection each), so 0.8 ends both connections about together."""


def _driver() -> Any:
    try:
        import sqlean

        return sqlean
    except ImportError:  # pragma: no cover - the wheel is a dependency; this keeps a broken install working
        import sqlite3

        return sqlite3


def _connect(driver: Any, path: str, *, read_only: bool) -> Any:
    uri = f"file:{quote(Path(path).resolve().as_posix())}{'?mode=ro' if read_only else ''}"
    conn = driver.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA cache_size = {_CACHE}")
    conn.execute(f"PRAGMA temp.cache_size = {_CACHE}")
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def _attach(conn: Any, path: Path, schema: str) -> None:
    conn.execute(f"ATTACH DATABASE ? AS {schema}", (str(path),))
    for pragma in ("journal_mode = OFF", "synchronous = OFF", f"cache_size = {_CACHE}"):
        conn.execute(f"PRAGMA {schema}.{pragma}")


def _scan(driver: Any, ledger: str, work: Path, head: int, split: int, *, starts: bool) -> None:
    """One scan connection: the ledger as `main` (read-only), `work` its own file.

    With `starts`: the starts scan, then the ends after position `split` (`rebuild_ends_tail`);
    else the ends up to `split` (`rebuild_ends`).
    """
    conn = _connect(driver, ledger, read_only=True)
    try:
        _attach(conn, work, "work")
        conn.execute("BEGIN")  # one read snapshot for the whole scan
        if starts:
            for statement in STARTS_STATEMENTS:
                conn.execute(statement, {"head": head})
            conn.execute(f"CREATE TABLE work.rebuild_ends_tail AS {ENDS_SELECT}", {"first": split + 1, "last": head})
        else:
            conn.execute(f"CREATE TABLE work.rebuild_ends AS {ENDS_SELECT}", {"first": 1, "last": split})
        conn.execute("COMMIT")
    finally:
        conn.close()


def prepare(ledger: str, workdir: Path, head: int) -> Path:
    """Write `rebuild_rows` and `rebuild_rest` for every call event up to `head` into `workdir`/rows.db."""
    driver = _driver()
    starts, ends, rows = workdir / "starts.db", workdir / "ends.db", workdir / ROWS_FILE
    split = round(head * _ENDS_FIRST_SHARE)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="rebuild-scan") as pool:
        scans = [
            pool.submit(_scan, driver, ledger, ends, head, split, starts=False),
            pool.submit(_scan, driver, ledger, starts, head, split, starts=True),
        ]
        for scan in scans:
            scan.result()
    conn = _connect(driver, str(rows), read_only=False)
    try:
        for pragma in ("journal_mode = OFF", "synchronous = OFF"):
            conn.execute(f"PRAGMA {pragma}")
        _attach(conn, starts, "s")
        _attach(conn, ends, "e")
        conn.execute("BEGIN")
        # the same columns; indexed once, after the append
        conn.execute("INSERT INTO e.rebuild_ends SELECT * FROM s.rebuild_ends_tail")
        conn.execute(ENDS_INDEX)
        for statement in ROWS_STATEMENTS:
            conn.execute(statement)
        for statement in rest_statements(orphans=bool(conn.execute(ORPHANS_POSSIBLE).fetchone()[0])):
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()
    starts.unlink()
    ends.unlink()
    return rows


def main(argv: Sequence[str]) -> int:
    ledger, workdir, head = argv
    try:
        prepare(ledger, Path(workdir), int(head))
    except Exception as exc:  # the parent reports it with the ledger's URL
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

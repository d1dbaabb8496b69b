"""The read-only half of the SQLite bulk calls load, in a child process with a current SQLite.

    parent: prepare_calls ── python -m projections._sqlite_prepare LEDGER WORKDIR HEAD ──► child
    child:  ledger (read-only) ─┬─ starts scan ──► WORKDIR/starts.db ┐ two connections,
                                └─ ends scan   ──► WORKDIR/ends.db   ┘ two threads
            starts ⟕ ends ──► WORKDIR/rows.db (rebuild_rows, rebuild_rest) ◄── ATTACHed by the parent for the copy

Why a child process: the JSON scans are most of a rebuild, and SQLite's JSON functions got much
faster in 3.45; the standard library links the system's SQLite (3.40 on Debian 12), so the child
uses the one bundled in the `sqlean.py` wheel. That is a second copy of the SQLite library, and two
copies in one process must never open the same database file (closing one's file descriptor drops
the POSIX locks the other holds: <https://sqlite.org/howtocorrupt.html>, "Multiple copies of SQLite
linked into the same application"). In its own process it is just another reader, and it opens
the ledger read-only. Without the wheel the child runs the same statements on the standard library's
`sqlite3`. The two scans share nothing, so they run on two connections at once (SQLite releases
the GIL while it works): on two cores the starts scan is hidden behind the longer ends scan.

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

from projections._bulk_sqlite import ENDS_STATEMENTS, ROWS_STATEMENTS, STARTS_STATEMENTS

__all__ = ("ROWS_FILE", "main", "prepare")

ROWS_FILE = "rows.db"
_CACHE = "-65536"  # KiB per connection and schema, as PRAGMA cache_size takes it


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


def _scan(driver: Any, ledger: str, work: Path, head: int, statements: Sequence[str]) -> None:
    """Run one scan's statements: the ledger as `main` (read-only), `work` its own file."""
    conn = _connect(driver, ledger, read_only=True)
    try:
        _attach(conn, work, "work")
        conn.execute("BEGIN")  # one read snapshot for the whole scan
        for statement in statements:
            conn.execute(statement, {"head": head} if ":head" in statement else {})
        conn.execute("COMMIT")
    finally:
        conn.close()


def prepare(ledger: str, workdir: Path, head: int) -> Path:
    """Write `rebuild_rows` and `rebuild_rest` for every call event up to `head` into `workdir`/rows.db."""
    driver = _driver()
    starts, ends, rows = workdir / "starts.db", workdir / "ends.db", workdir / ROWS_FILE
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="rebuild-scan") as pool:
        scans = [
            pool.submit(_scan, driver, ledger, starts, head, STARTS_STATEMENTS),
            pool.submit(_scan, driver, ledger, ends, head, ENDS_STATEMENTS),
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
        for statement in ROWS_STATEMENTS:
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

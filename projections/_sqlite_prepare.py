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

Progress: the scans call back into Python every `_bulk_sqlite.NOTE_EVERY` positions, and the
child prints how far they have got on stdout (`ScanProgress`), a few lines a second, for the
parent's progress bar: the scans are most of a large rebuild.
"""

from __future__ import annotations

import io
import math
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from projections._bulk_sqlite import (
    ENDS_INDEX,
    ENDS_SELECT,
    NOTE_FUNCTION,
    ORPHANS_POSSIBLE,
    ROWS_STATEMENTS,
    STARTS_STATEMENTS,
    rest_statements,
)

__all__ = ("ROWS_FILE", "ScanProgress", "main", "prepare")

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


class ScanProgress:
    """How far the two scans have got, printed as `progress EVENTS HEAD` lines for the parent's progress bar.

    Every position is passed twice, by the starts scan and by one of the ends scans: EVENTS is half
    the positions passed. A line goes out at most every `interval_s` (the first at once), and at
    `finish`.
    """

    def __init__(self, head: int, out: TextIO, interval_s: float = 0.2) -> None:
        self.head = head
        self.out = out
        self.interval_s = interval_s
        self._passed = [0, 0]  # per scan connection
        self._lock = threading.Lock()
        self._last = -math.inf

    def note(self, scan: int, passed: int) -> None:
        with self._lock:
            self._passed[scan] = passed
            now = time.monotonic()
            if now - self._last >= self.interval_s:
                self._last = now
                self._print(sum(self._passed))

    def finish(self) -> None:
        with self._lock:
            self._print(2 * self.head)

    def _print(self, passed: int) -> None:
        self.out.write(f"progress {passed // 2} {self.head}\n")
        self.out.flush()


def _scan(driver: Any, ledger: str, work: Path, head: int, split: int, progress: ScanProgress, *, starts: bool) -> None:
    """One scan connection: the ledger as `main` (read-only), `work` its own file.

    With `starts`: the starts scan, then the ends after position `split` (`rebuild_ends_tail`);
    else the ends up to `split` (`rebuild_ends`).
    """
    conn = _connect(driver, ledger, read_only=True)
    scan = 0 if starts else 1
    passed_before = 0  # positions this connection passed in its earlier statements

    def note(position: int) -> int:
        progress.note(scan, passed_before + position - first + 1)
        return 1

    try:
        conn.create_function(NOTE_FUNCTION, 1, note)
        _attach(conn, work, "work")
        conn.execute("BEGIN")  # one read snapshot for the whole scan
        if starts:
            first = 1
            for statement in STARTS_STATEMENTS:
                conn.execute(statement, {"head": head})
            passed_before, first = head, split + 1
            conn.execute(f"CREATE TABLE work.rebuild_ends_tail AS {ENDS_SELECT}", {"first": first, "last": head})
        else:
            first = 1
            conn.execute(f"CREATE TABLE work.rebuild_ends AS {ENDS_SELECT}", {"first": first, "last": split})
        conn.execute("COMMIT")
    finally:
        conn.close()


def prepare(ledger: str, workdir: Path, head: int, progress: ScanProgress | None = None) -> Path:
    """Write `rebuild_rows` and `rebuild_rest` for every call event up to `head` into `workdir`/rows.db."""
    driver = _driver()
    starts, ends, rows = workdir / "starts.db", workdir / "ends.db", workdir / ROWS_FILE
    split = round(head * _ENDS_FIRST_SHARE)
    scanned = progress or ScanProgress(head, io.StringIO())
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="rebuild-scan") as pool:
        scans = [
            pool.submit(_scan, driver, ledger, ends, head, split, scanned, starts=False),
            pool.submit(_scan, driver, ledger, starts, head, split, scanned, starts=True),
        ]
        for scan in scans:
            scan.result()
    scanned.finish()
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
        prepare(ledger, Path(workdir), int(head), ScanProgress(int(head), sys.stdout))
    except Exception as exc:  # the parent reports it with the ledger's URL
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

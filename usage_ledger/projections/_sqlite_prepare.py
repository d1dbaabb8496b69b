"""The read-only half of the SQLite bulk calls load, in a child process with a current SQLite.

    parent: prepare_calls ── python -m usage_ledger.projections._sqlite_prepare LEDGER WORKDIR HEAD ──► child
    child:  ledger (read-only) ─┬─ starts, then ends after `split` ──► WORKDIR/starts.db ┐ two workers
                                └─ ends up to `split`               ──► WORKDIR/ends.db   ┘
            the ends in starts.db appended to those in ends.db, indexed
            starts ⟕ ends, call ids below the median ──► WORKDIR/rows.db (rebuild_rows) ┐ the same two
                           from the median on     ──► WORKDIR/rows_upper.db          ┘ workers
            the calls left to the Python fold ──► WORKDIR/rows.db (rebuild_rest)
            rows.db and rows_upper.db ◄── ATTACHed by the parent for the copy, in that order

Why a child process: the JSON scans are most of a rebuild, and SQLite's JSON functions got much
faster in 3.45; the standard library links the system's SQLite (3.40 on Debian 12), so the child
uses the one bundled in the `sqlean.py` wheel. That is a second copy of the SQLite library, and two
copies in one process must never open the same database file (closing one's file descriptor drops
the POSIX locks the other holds: <https://sqlite.org/howtocorrupt.html>, "Multiple copies of SQLite
linked into the same application"). In its own process it is just another reader, and it opens
the ledger read-only. Without the wheel the child runs the same statements on the standard library's
`sqlite3`. The scans share nothing, so they run on two connections at once. The ends cost more
to scan than the starts, so the starts connection also
scans the ends of the last positions (`_ENDS_FIRST_SHARE`); that part is appended to the rest
before the ends are indexed. One statement per table and connection: `CREATE TABLE … AS` runs on
both connections at once, an `INSERT … SELECT` per range of positions (tried) took turns with
the other connection and was no faster than one.

The rows are written in two halves by call id, each its own statement into its own file.

The two workers are processes (spawned) from `PROCESSES_FROM` positions on. SQLite releases the GIL
while it works, yet two statements on two threads of one process got in each other's way: at 1M
calls (by hand, estimates) the scans took 7.0–7.9 s on threads and 6.4–6.7 s on processes, the
halves of the rows 1.5–3.0 s on threads and 1.1 s on processes, against 2.0 s for the whole on
one. Below that size the scans run on two threads and the halves here, one after the other: a
process costs more than it saves.

Work files are scratch: no journal, no fsync, a bounded page cache per connection (memory stays
flat; SQLite spills to the files); the parent deletes the directory after the load.

Progress: the scans call back into Python every `_bulk_sqlite.NOTE_EVERY` positions, and the
child prints how far they have got on stdout (`ScanProgress`), a few lines a second, for the
parent's progress bar: the scans are most of a large rebuild.
"""

from __future__ import annotations

import io
import math
import multiprocessing
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from usage_ledger.projections._bulk_sqlite import (
    ENDS_INDEX,
    ENDS_SELECT,
    NOTE_FUNCTION,
    ORPHANS_POSSIBLE,
    REPEATED_STATEMENTS,
    STARTS_STATEMENTS,
    rest_statements,
    rows_statement,
)

__all__ = ("PROCESSES_FROM", "ROWS_FILES", "ScanProgress", "main", "prepare")

ROWS_FILES = ("rows.db", "rows_upper.db")
"""The work files holding `rebuild_rows`, lower call ids first; the first holds `rebuild_rest` too."""
PROCESSES_FROM = 200_000
"""Positions from which the scans and the halves of the rows run on two processes instead of here."""
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


def _work_connection(driver: Any, main: Path, starts: Path, ends: Path) -> Any:
    """A connection to the work file `main` (scratch: no journal, no sync), the starts and ends attached as `s`, `e`."""
    conn = _connect(driver, str(main), read_only=False)
    try:
        for pragma in ("journal_mode = OFF", "synchronous = OFF"):
            conn.execute(f"PRAGMA {pragma}")
        _attach(conn, starts, "s")
        _attach(conn, ends, "e")
    except BaseException:
        conn.close()
        raise
    return conn


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
        self.update({scan: passed})

    def update(self, passed: dict[int, int]) -> None:
        """How many positions each scan in `passed` (by number) has passed."""
        with self._lock:
            for scan, count in passed.items():
                self._passed[scan] = count
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


_shared_notes: Any = None
"""In a worker process: where its scan notes how far it got (`_share_notes`; one slot per scan)."""


def _share_notes(slots: Any) -> None:
    """A worker process's initializer: the shared array the scans note their progress in."""
    global _shared_notes
    _shared_notes = slots


def _scan(ledger: str, work: Path, head: int, split: int, progress: ScanProgress | None, *, starts: bool) -> None:
    """One scan connection: the ledger as `main` (read-only), `work` its own file.

    With `starts`: the starts scan, then the ends after position `split` (`rebuild_ends_tail`);
    else the ends up to `split` (`rebuild_ends`). How far it got goes to `progress`, or in a worker
    process (`progress` None) to the shared slots.
    """
    conn = _connect(_driver(), ledger, read_only=True)
    scan = 0 if starts else 1
    passed_before = 0  # positions this connection passed in its earlier statements

    def note(position: int) -> int:
        passed = passed_before + position - first + 1
        if progress is None:
            _shared_notes[scan] = passed
        else:
            progress.note(scan, passed)
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


def _write_rows(rows: str, starts: str, ends: str, split: str | None, upper: bool) -> None:
    """One half of `rebuild_rows` (`rows_statement`) into the work file `rows`, on its own connection."""
    conn = _work_connection(_driver(), Path(rows), Path(starts), Path(ends))
    try:
        conn.execute("BEGIN")
        conn.execute(rows_statement(upper=upper), {"split": split})
        conn.execute("COMMIT")
    finally:
        conn.close()


def _scan_both(
    pool: Executor, ledger: str, files: tuple[Path, Path], head: int, progress: ScanProgress, slots: Any
) -> None:
    """Both scans on `pool`, `progress` told how far they got (from `slots` when they run on processes)."""
    split = round(head * _ENDS_FIRST_SHARE)
    starts, ends = files
    mine = None if slots is not None else progress
    scans = [
        pool.submit(_scan, ledger, ends, head, split, mine, starts=False),
        pool.submit(_scan, ledger, starts, head, split, mine, starts=True),
    ]
    while slots is not None:
        _, pending = wait(scans, timeout=max(progress.interval_s, 0.01))
        progress.update({0: slots[0], 1: slots[1]})
        if not pending:
            break
    for scan in scans:
        scan.result()
    progress.finish()


def prepare(
    ledger: str,
    workdir: Path,
    head: int,
    progress: ScanProgress | None = None,
    *,
    processes_from: int = PROCESSES_FROM,
) -> tuple[Path, Path]:
    """Write `rebuild_rows` (in two halves, `ROWS_FILES`) and `rebuild_rest` for every call event up to `head`."""
    driver = _driver()
    starts, ends = workdir / "starts.db", workdir / "ends.db"
    rows, upper = (workdir / name for name in ROWS_FILES)
    processes = head >= processes_from
    pool: Executor
    if processes:
        # spawn: fresh interpreters, nothing inherited from this process's threads and connections
        context = multiprocessing.get_context("spawn")
        slots = context.Array("q", 2, lock=False)
        pool = ProcessPoolExecutor(2, mp_context=context, initializer=_share_notes, initargs=(slots,))
    else:
        slots = None
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rebuild-scan")
    with pool:
        _scan_both(pool, ledger, (starts, ends), head, progress or ScanProgress(head, io.StringIO()), slots)
        _index_ends(driver, rows, starts, ends)
        _write_halves(pool if processes else None, driver, (rows, upper), starts, ends)
    _write_rest(driver, (rows, upper), starts, ends)
    starts.unlink()
    ends.unlink()
    return rows, upper


def _index_ends(driver: Any, rows: Path, starts: Path, ends: Path) -> None:
    """The ends in one table, indexed; the call ids that repeat, beside the tables they come from."""
    conn = _work_connection(driver, rows, starts, ends)
    try:
        conn.execute("BEGIN")
        # the same columns; indexed once, after the append
        conn.execute("INSERT INTO e.rebuild_ends SELECT * FROM s.rebuild_ends_tail")
        conn.execute(ENDS_INDEX)
        for statement in REPEATED_STATEMENTS:
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _write_halves(pool: Executor | None, driver: Any, files: tuple[Path, Path], starts: Path, ends: Path) -> None:
    """`rebuild_rows` in two halves by call id, one to each of `files`: on `pool`'s processes, else here."""
    conn = _connect(driver, str(starts), read_only=True)
    try:
        count = conn.execute("SELECT count(*) FROM rebuild_starts WHERE cid IS NOT NULL").fetchone()[0]
        median = conn.execute(
            "SELECT cid FROM rebuild_starts WHERE cid IS NOT NULL ORDER BY cid LIMIT 1 OFFSET ?", (count // 2,)
        ).fetchone()
    finally:
        conn.close()
    split = median[0] if median else None
    halves = [
        (str(path), str(starts), str(ends), split, upper) for path, upper in zip(files, (False, True), strict=True)
    ]
    if pool is None:
        for half in halves:
            _write_rows(*half)
        return
    for written in [pool.submit(_write_rows, *half) for half in halves]:
        written.result()


def _write_rest(driver: Any, files: tuple[Path, Path], starts: Path, ends: Path) -> None:
    """`rebuild_rest` (the calls left to the Python fold) into the first of `files`, from both halves."""
    conn = _work_connection(driver, files[0], starts, ends)
    try:
        _attach(conn, files[1], "u")
        conn.execute("BEGIN")
        for statement in rest_statements(orphans=bool(conn.execute(ORPHANS_POSSIBLE).fetchone()[0])):
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


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

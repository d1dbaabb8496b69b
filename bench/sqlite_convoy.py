"""Benchmark: `sqlite3` `executemany` on one thread while another thread runs Python (the GIL's convoy).

    .venv/bin/python bench/sqlite_convoy.py [--rows 5000] [--switch-ms 5] [--alone]

`sqlite3` lets go of the GIL around every step of a statement, so an `executemany` takes the GIL back
once per row. While another thread of the process runs Python, each of those takes waits for that thread
to give it up, up to `sys.getswitchinterval()` (5 ms by default). This times `--rows` rows of the
calls read model's shape (31 columns, its two indexes) upserted in one transaction:

- alone;
- beside a thread that runs Python all along (what a rebuild's fold is while the page before it is being
  written: `engine.catch_up` overlaps them, so in one process they take turns, and `--workers N`
  processes are how a rebuild uses a second core);
- the same rows as multi-row `INSERT … VALUES (…), (…)` statements of 1,000 rows, alone and beside it:
  one GIL take per statement, so the other thread hardly slows them (`--rows 100000 --alone`: the two
  alone at a size where the cases beside a thread would take minutes).

These rows carry their datetimes as stored text. The rebuild's upsert rewrites msgspec's text in SQL
(`backend_sqlite._time_sql`, a CASE per datetime column): with it, multi-row statements cost 24–44 µs a
row against `executemany`'s 14–19 (an ad-hoc copy of this script, 100,000 folded rows, 2026-12-06), which is
why the rebuild's writes stay `executemany`.

Prints rows per second for each. Never used as a test.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy.dialects import sqlite
from sqlalchemy.schema import CreateIndex, CreateTable

from usage_ledger.projections.tables import calls

_MULTI = 1_000


def _row(i: int) -> tuple[object, ...]:
    values: list[object] = []
    for column in calls.columns:
        python = column.type.python_type if column.name != "version" else int
        if column.name == "call_id":
            values.append(f"call-{i:08d}")
        elif python is int:
            values.append(i if column.name != "version" else 7)
        elif python is float:
            values.append(i / 7)
        else:
            values.append(f"2026-03-01 13:00:{i % 60:02d}.050000" if "_at" in column.name else f"text-{i % 97}")
    return tuple(values)


def _ddl(conn: sqlite3.Connection) -> None:
    conn.execute(str(CreateTable(calls).compile(dialect=sqlite.dialect())))
    for index in calls.indexes:
        conn.execute(str(CreateIndex(index).compile(dialect=sqlite.dialect())))


def _time(path: Path, rows: list[tuple[object, ...]], multi: bool, busy: bool) -> float:
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    _ddl(conn)
    columns = [c.name for c in calls.columns]
    key = ("version", "call_id")
    upsert_tail = f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET " + ", ".join(
        f"{c} = excluded.{c}" for c in columns if c not in key
    )
    one = "(" + ", ".join("?" * len(columns)) + ")"
    head = f"INSERT INTO {calls.name} ({', '.join(columns)}) VALUES "
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1_000))

    spinner = threading.Thread(target=spin)
    if busy:
        spinner.start()
    t = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    if multi:
        for start in range(0, len(rows), _MULTI):
            chunk = rows[start : start + _MULTI]
            conn.execute(f"{head}{', '.join([one] * len(chunk))} {upsert_tail}", [v for r in chunk for v in r])
    else:
        conn.executemany(f"{head}{one} {upsert_tail}", rows)
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - t
    stop.set()
    if busy:
        spinner.join()
    conn.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000)
    parser.add_argument("--switch-ms", type=float, default=5.0, help="sys.setswitchinterval, in ms")
    parser.add_argument("--alone", action="store_true", help="only the cases without the Python thread beside")
    args = parser.parse_args()
    sys.setswitchinterval(args.switch_ms / 1000)
    rows = [_row(i) for i in range(args.rows)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "convoy.db"
        for multi in (False, True):
            for busy in (False,) if args.alone else (False, True):
                elapsed = _time(path, rows, multi, busy)
                what = "multi-row INSERT" if multi else "executemany"
                beside = "beside a Python thread" if busy else "alone"
                print(f"{what:16s} {beside:22s} {args.rows / elapsed:>10,.0f} rows/s  ({elapsed:.2f} s)")


if __name__ == "__main__":
    main()

"""SQLite's own share of a rebuild: inserting a version's calls rows, given prepared tuples, no Python fold.

    .venv/bin/python bench/rebuild_insert.py --db /path/made/by/bench/rebuild.py [--runs 3]

Reads the calls rows of a ledger `bench/rebuild.py --keep` left behind, then, in a scratch SQLite file
with the same table (WAL, synchronous NORMAL, as the ledger), holding one version already (the live
one), times `executemany` of the rows as the next version, in pages of 50,000, per variant: the
rebuild's upsert (twice: a call's row is written again when its finish is on a later page), a plain
INSERT, the table `WITHOUT ROWID`, and without the two secondary indexes. CPU seconds of this process
(SQLite runs in it) per variant, median of `--runs`: the floor the fold's writes sit on, whatever the
Python above them does. Prints JSON. Never used as a test.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

PAGE = 50_000


def _variant(rows: list[tuple[object, ...]], ddl: str, indexes: list[str], statement: str, passes: int) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-insert-") as tmp:
        conn = sqlite3.connect(Path(tmp) / "scratch.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(ddl)
        for index in indexes:
            conn.execute(index)
        marks = ",".join("?" * len(rows[0]))
        conn.execute("BEGIN")
        conn.executemany(f"INSERT INTO projection_calls VALUES ({marks})", rows)  # the live version
        conn.execute("COMMIT")
        following = [(-1, *row[1:]) for row in rows]
        started = time.process_time()
        for _ in range(passes):
            for first in range(0, len(following), PAGE):
                conn.execute("BEGIN")
                conn.executemany(statement, following[first : first + PAGE])
                conn.execute("COMMIT")
        spent = time.process_time() - started
        conn.close()
        return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="a SQLite ledger file bench/rebuild.py made")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    source = sqlite3.connect(args.db)
    live = source.execute("SELECT live_version FROM projection_versions WHERE name = 'calls'").fetchone()[0]
    rows = source.execute("SELECT * FROM projection_calls WHERE version = ?", (live,)).fetchall()
    ddl = source.execute("SELECT sql FROM sqlite_master WHERE name = 'projection_calls'").fetchone()[0]
    indexes = [
        sql
        for (sql,) in source.execute(
            "SELECT sql FROM sqlite_master WHERE tbl_name = 'projection_calls' AND type = 'index' AND sql IS NOT NULL"
        )
    ]
    names = [row[1] for row in source.execute("PRAGMA table_info(projection_calls)")]
    source.close()
    marks = ",".join("?" * len(names))
    plain = f"INSERT INTO projection_calls ({','.join(names)}) VALUES ({marks})"
    upsert = f"{plain} ON CONFLICT (version, call_id) DO UPDATE SET " + ", ".join(
        f"{name} = excluded.{name}" for name in names[2:]
    )
    variants = {
        "upsert, each row twice (the rebuild's statement)": (ddl, indexes, upsert, 2),
        "plain insert": (ddl, indexes, plain, 1),
        "plain insert, WITHOUT ROWID": (ddl + " WITHOUT ROWID", indexes, plain, 1),
        "plain insert, no secondary index": (ddl, [], plain, 1),
    }
    result: dict[str, object] = {"rows": len(rows)}
    for name, (table, index_sql, statement, passes) in variants.items():
        runs = [_variant(rows, table, index_sql, statement, passes) for _ in range(args.runs)]
        result[name] = {
            "cpu_s_median": round(statistics.median(runs), 3),
            "cpu_us_per_row_and_pass": round(statistics.median(runs) / passes / len(rows) * 1e6, 2),
            "runs": [round(r, 3) for r in runs],
        }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The calls digest of a big version on SQLite: the upper half of the rows encoded by a child process.

    parent: rows with call_id < split ──encode──► sha256 ◄── then the child's bytes, in order
    child (`_digest_lines`): rows with call_id ≥ split ──encode──► a scratch file

Reading a million rows of 26 columns into Python and encoding them is the cost of a digest (the
hash itself is cheap), and it is one core's work; the child does half of it on the other core.
Both halves read the ledger read-only with the standard library's `sqlite3` (the library the
ledger's own connections use), each recording the version's checkpoint in its read transaction;
if it moved in between (a catch-up on that version), the caller digests the version in one
snapshot instead, as it does for small versions.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from usage_ledger.ledger import LedgerError
from usage_ledger.projections._digest_lines import connect_read_only, encode_range

__all__ = ("CHILD_FROM", "split_digest")

CHILD_FROM = 200_000  # rows: below this a second process costs more than it saves
# where this package was imported from: the child process imports the same code
_ROOT = str(Path(__file__).resolve().parents[2])


def split_digest(
    ledger: str, sql: str, version: int, time_indexes: Sequence[int], *, child_from: int = CHILD_FROM
) -> str | None:
    """SHA-256 over the lines of `sql` in call-id order, the upper half encoded by a child process.

    `sql` selects the digest columns with `version = ?` and `call_id {op} ?`, ordered by call_id.
    None when the version has fewer than `child_from` rows, or when it changed between the two
    halves' snapshots: the caller then digests it in one. Blocking: run it in a thread.
    """
    conn = connect_read_only(ledger)
    try:
        count = conn.execute("SELECT count(*) FROM projection_calls WHERE version = ?", (version,)).fetchone()[0]
        if count < max(child_from, 2):
            return None
        (split,) = conn.execute(
            "SELECT call_id FROM projection_calls WHERE version = ? ORDER BY call_id LIMIT 1 OFFSET ?",
            (version, count // 2),
        ).fetchone()
        digest = hashlib.sha256()
        with tempfile.TemporaryDirectory(prefix="ledger-digest-") as workdir:
            upper = Path(workdir) / "upper.jsonl"
            child = _start_child(ledger, sql, version, split, time_indexes, upper)
            try:
                mine = encode_range(conn, sql, version, ("<", split), time_indexes, digest.update)
                out, err = child.communicate()
            finally:
                if child.poll() is None:  # failed or interrupted here: the child must not outlive the digest
                    child.kill()
                    child.wait()
            if child.returncode != 0:
                raise LedgerError(
                    f"digest of calls version {version} in {ledger} failed: {err.decode(errors='replace').strip()}"
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
    ledger: str, sql: str, version: int, split: str, time_indexes: Sequence[int], out: Path
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)}
    argv = [ledger, sql, str(version), split, ",".join(map(str, time_indexes)), str(out)]
    return subprocess.Popen(
        [sys.executable, "-m", "usage_ledger.projections._digest_lines", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )

"""The randomized fault soak, short: 45 s of faults per backend (LEDGER_SOAK_SECONDS to change it).

The long run is the script (`python -m tests.soak.soak --minutes 30 --backend pg`); this is the same
engine, so CI tries every kind of fault on SQLite and PostgreSQL on each run: the breaker injects each
environment fault once before it draws at random, and each upstream fault is a few per cent of the
≈ 1,000 calls of a short run. The live chain verification runs every 15 s here (60 s in the long run),
so that a short run verifies while faults run too. It needs root (a tmpfs, and `runuser` for the
private PostgreSQL cluster): without them it skips, or fails under CI=true.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from tests._required import unavailable
from tests.reliability.helpers import CannotMount
from tests.soak.cluster import ClusterUnavailable
from tests.soak.soak import SoakConfig, soak

pytestmark = [pytest.mark.slow, pytest.mark.serial]

# every fault the soak injects on each backend: the test fails if a short run missed one
_ENVIRONMENT = {
    "pg": {"kill", "pause", "disk_full", "db_stop", "db_crash"},
    "sqlite": {"kill", "pause", "disk_full", "db_lock"},
}
_REQUESTS = {
    "disconnect",
    "trickle",
    "head-bomb",
    "spelling",
    "reopen-trickle",
    "upstream:reset-mid-stream",
    "upstream:garbage-head",
    "upstream:hang-mid-stream",
    "upstream:endless-head",
}


@pytest.mark.parametrize("backend", ["sqlite", "pg"])
async def test_randomized_faults_lose_duplicate_and_strand_nothing(backend: str, tmp_path: Path) -> None:
    seconds = float(os.environ.get("LEDGER_SOAK_SECONDS", "45"))
    config = SoakConfig(
        backend=backend,
        seconds=seconds,
        seed=20261205,
        mean_fault_gap_s=3.0,
        verify_every_s=15.0,
        work_dir=str(tmp_path),
    )
    try:
        summary = await soak(config)
    except (CannotMount, ClusterUnavailable) as exc:
        unavailable(str(exc))
    print(f"\nSOAK {backend}: " + msgspec.json.encode({k: v for k, v in summary.items() if k != "violations"}).decode())
    assert summary["violations"] == [] and summary["ok"], msgspec.json.format(msgspec.json.encode(summary)).decode()
    assert (summary["lost"], summary["duplicated"], summary["stuck"], summary["token_mismatches"]) == (0, 0, 0, 0)
    if backend == "sqlite":  # a body and its event share one transaction there: never an orphan
        assert summary["orphan_blobs"] == 0, summary
    faults: dict[str, int] = summary["faults"]  # type: ignore[assignment]
    assert _ENVIRONMENT[backend] | _REQUESTS <= set(faults), faults
    spelled: dict[str, int] = summary["spelled"]  # type: ignore[assignment]
    assert spelled.get("recorded", 0) > 0 and spelled.get("refused_400", 0) > 0, spelled  # both ways were taken
    assert summary["reached_upstream_all_recorded"] > 100, summary  # the relay saw the calls' markers  # type: ignore[operator]
    assert summary["whole_200"] > 100, summary  # the load went on through the faults  # type: ignore[operator]

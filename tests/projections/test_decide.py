"""`ledger decide` and the labels/returns events it reads, held to scikit-learn and SciPy computed here.

The trace (tests/projections/decide_trace.py): three MoE and two dense repetitions of 99 tickers,
Hold-heavy labels, returns. Every expected figure is computed in this file from the trace's own
definition, never through the code under test.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from datetime import date
from pathlib import Path

import pytest
from scipy.stats import spearmanr  # type: ignore[import-untyped]
from sklearn.metrics import cohen_kappa_score  # type: ignore[import-untyped]
from sqlalchemy import func, select

from tests.projections.decide_trace import (
    DENSE,
    EXTRACT,
    MOE,
    SCALE,
    TICKERS,
    append_trace,
    build_labels,
    build_returns,
    shape,
    write_labels,
    write_returns,
)
from usage_ledger.answers import BodySelection
from usage_ledger.answers.decide import decide
from usage_ledger.commands.retention import erase_selected
from usage_ledger.imports.label_import import extract_labels, import_labels, import_returns
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.schema import events
from usage_ledger.projections.errors import ImportFailed, NotFound, ProjectionError
from usage_ledger.projections.recorded import recorded_labels, recorded_returns

SCALE_TEXT = ",".join(SCALE)


def sk_qwk(x: dict[str, str], y: dict[str, str]) -> float:
    keys = sorted(x.keys() & y.keys())
    return float(cohen_kappa_score([x[k] for k in keys], [y[k] for k in keys], weights="quadratic", labels=SCALE))


def rate(x: dict[str, str], y: dict[str, str]) -> float:
    keys = x.keys() & y.keys()
    return sum(x[k] == y[k] for k in keys) / len(keys)


def sp_rho(labels: dict[str, str], returns: dict[str, float]) -> float:
    keys = sorted(labels.keys() & returns.keys())
    return float(spearmanr([SCALE.index(labels[k]) for k in keys], [returns[k] for k in keys]).statistic)


async def _events(database: Database, type_: str) -> int:
    async with database.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).where(events.c.type == type_))).scalar_one())


@pytest.fixture
async def traced(database: Database, tmp_path: Path) -> tuple[Database, dict[str, dict[str, str]], dict[str, float]]:
    labels, returns = build_labels(), build_returns()
    await append_trace(database, labels)
    await import_labels(database, write_labels(tmp_path / "labels.csv", labels))
    await import_returns(database, write_returns(tmp_path / "returns.csv", returns))
    return database, labels, returns


async def test_decide_matches_an_independent_computation(
    traced: tuple[Database, dict[str, dict[str, str]], dict[str, float]],
) -> None:
    database, labels, returns = traced
    result = await decide(database, MOE, DENSE, SCALE_TEXT)
    for group, runs in ((result.a, MOE), (result.b, DENSE)):
        gap, length, tokens = shape(runs[0])
        wall = gap * (len(TICKERS) - 1) + length
        assert group.runs == runs
        assert group.throughput_tps == pytest.approx(len(TICKERS) * tokens / wall)
        assert group.hours_per_100_tickers == pytest.approx(wall / 3600 * 100 / len(TICKERS))
        assert group.latency["ttft_ms.p50"] == pytest.approx(500.0)  # the helper's TTFT, 0.5 s
        assert group.latency["e2e_ms.p50"] == pytest.approx((length - 0.1) * 1000)  # to the last token
        pairs = list(itertools.combinations(runs, 2))
        assert group.self_qwk == pytest.approx(statistics.fmean(sk_qwk(labels[x], labels[y]) for x, y in pairs))
        assert group.self_agree_rate == pytest.approx(statistics.fmean(rate(labels[x], labels[y]) for x, y in pairs))
        counts = Counter(label for run in runs for label in labels[run].values())
        assert group.label_shares == pytest.approx({s: counts[s] / (len(runs) * len(TICKERS)) for s in SCALE})
        assert list(group.label_shares) == SCALE
        assert group.rank_ic == pytest.approx(statistics.fmean(sp_rho(labels[r], returns) for r in runs))
        assert group.server == {}
    assert result.a.label_shares["Hold"] > 0.6  # Hold-heavy, as the seed's grades
    cross = list(itertools.product(MOE, DENSE))
    assert result.between.qwk == pytest.approx(statistics.fmean(sk_qwk(labels[x], labels[y]) for x, y in cross))
    assert result.between.agree_rate == pytest.approx(statistics.fmean(rate(labels[x], labels[y]) for x, y in cross))
    expected_flips = {}
    for key in TICKERS:
        tops = []
        for runs in (MOE, DENSE):
            counts = Counter(labels[run][key] for run in runs)
            top = max(counts.values())
            tops.append([s for s in SCALE if counts[s] == top])
        if tops[0] != tops[1]:
            expected_flips[key] = tops
    assert {f.key: [f.a, f.b] for f in result.between.flipped} == expected_flips
    assert any(len(f.b) > 1 for f in result.between.flipped)  # two dense runs that disagree: a tie, shown as one
    assert [f.key for f in result.between.flipped] == sorted(expected_flips)
    assert any("no server samples" in item for item in result.unmeasured)
    assert not any("returns" in item for item in result.unmeasured)


async def test_one_run_and_no_returns_are_unmeasured(database: Database, tmp_path: Path) -> None:
    labels = build_labels()
    await append_trace(database, labels)
    await import_labels(
        database, write_labels(tmp_path / "l.csv", {"moe-1": labels["moe-1"], "dense-1": labels["dense-1"]})
    )
    result = await decide(database, ["moe-1"], ["dense-1", "dense-2"], SCALE_TEXT)
    assert result.a.self_qwk is None and result.a.self_agree_rate is None and result.a.rank_ic is None
    assert result.b.self_qwk is None  # dense-2 has no labels: no pair has keys in common
    assert result.b.label_shares == pytest.approx(
        {s: Counter(labels["dense-1"].values())[s] / len(TICKERS) for s in SCALE}
    )
    text = "\n".join(result.unmeasured)
    assert "no returns recorded" in text
    assert "group a has one run only" in text
    assert "run dense-2 has no labels" in text
    assert result.between.qwk == pytest.approx(sk_qwk(labels["moe-1"], labels["dense-1"]))


async def test_imports_are_idempotent_and_a_correction_supersedes(
    traced: tuple[Database, dict[str, dict[str, str]], dict[str, float]], tmp_path: Path
) -> None:
    database, labels, returns = traced
    again = await import_labels(database, write_labels(tmp_path / "renamed.csv", dict(reversed(labels.items()))))
    assert not again.appended  # same content, another name and order: nothing added
    assert not (await import_returns(database, write_returns(tmp_path / "r2.csv", returns))).appended
    assert await _events(database, "labels.recorded") == 1
    corrected = {run: dict(by_key) for run, by_key in labels.items()}
    corrected["moe-1"]["T000"] = "Strong Buy" if labels["moe-1"]["T000"] != "Strong Buy" else "Strong Sell"
    fixed = await import_labels(database, write_labels(tmp_path / "fixed.csv", {"moe-1": corrected["moe-1"]}))
    assert fixed.appended and fixed.rows == len(TICKERS)
    assert await _events(database, "labels.recorded") == 2  # history kept
    result = await decide(database, MOE, DENSE, SCALE_TEXT)
    pairs = list(itertools.combinations(MOE, 2))
    assert result.a.self_qwk == pytest.approx(statistics.fmean(sk_qwk(corrected[x], corrected[y]) for x, y in pairs))


async def test_returns_as_of(database: Database, tmp_path: Path) -> None:
    early = tmp_path / "early.csv"
    early.write_text("key,return,as_of\nT000,0.1,2026-03-01\nT001,0.2,2026-03-01\nT002,0.5,\n")
    late = tmp_path / "late.csv"
    late.write_text("key,return,as_of\nT000,-0.3,2026-04-01\n")
    await import_returns(database, early)
    await import_returns(database, late)
    assert (await recorded_returns(database)).values == {"T000": -0.3, "T001": 0.2, "T002": 0.5}
    march = await recorded_returns(database, as_of=date(2026, 3, 15))
    assert march.values == {"T000": 0.1, "T001": 0.2} and march.keys_recorded == 3


async def test_extract_reads_the_stored_answers(database: Database) -> None:
    labels = build_labels()
    await append_trace(database, labels)
    first = await extract_labels(database, "moe-1", EXTRACT)
    assert first.appended and first.rows == len(TICKERS)
    assert not (await extract_labels(database, "moe-1", EXTRACT)).appended
    await extract_labels(database, "dense-1", EXTRACT)
    result = await decide(database, ["moe-1"], ["dense-1"], SCALE_TEXT)
    assert result.between.qwk == pytest.approx(sk_qwk(labels["moe-1"], labels["dense-1"]))
    with pytest.raises(ProjectionError, match="found no label"):
        await extract_labels(database, "moe-2", r"Verdict: (\w+)")


async def test_extract_from_erased_answers_says_when_and_why_they_went(database: Database) -> None:
    await append_trace(database, build_labels())
    gone = await erase_selected(database, BodySelection(run="moe-1"), "retention: 90 days")
    assert gone.bodies > 0
    with pytest.raises(
        ProjectionError,
        match=r"without a label: redacted.* answer\(s\) erased on \d{4}-\d\d-\d\d "
        r"\(retention: 90 days\)",
    ):
        await extract_labels(database, "moe-1", EXTRACT)
    assert (await extract_labels(database, "dense-1", EXTRACT)).appended  # another run's answers are all there


async def test_a_new_extraction_withdraws_the_labels_it_no_longer_finds(database: Database) -> None:
    labels = build_labels()
    await append_trace(database, labels)
    await extract_labels(database, "moe-1", EXTRACT)
    holds = sorted(key for key, label in labels["moe-1"].items() if label == "Hold")
    assert holds and len(holds) < len(TICKERS)
    narrower = await extract_labels(database, "moe-1", r"Grade: (Hold)\s*$")
    assert narrower.appended and narrower.rows == len(TICKERS)
    assert any("without a label (any earlier one withdrawn)" in w for w in narrower.warnings)
    assert (await recorded_labels(database, ["moe-1"]))["moe-1"] == dict.fromkeys(holds, "Hold")


async def test_the_right_extraction_after_a_wrong_one_is_appended_and_counts(database: Database) -> None:
    labels = build_labels()
    await append_trace(database, labels)
    assert (await extract_labels(database, "moe-1", EXTRACT)).appended
    assert (await extract_labels(database, "moe-1", r"Grade: (Hold)\s*$")).appended  # a wrong pattern
    again = await extract_labels(database, "moe-1", EXTRACT)  # the right one, as first run: its content again
    assert again.appended  # was "the same content is already in the ledger", the wrong labels kept
    assert (await recorded_labels(database, ["moe-1"]))["moe-1"] == labels["moe-1"]
    assert not (await extract_labels(database, "moe-1", EXTRACT)).appended  # now the current state
    assert await _events(database, "labels.recorded") == 3


async def test_an_earlier_file_imported_again_after_a_correction_is_appended(
    traced: tuple[Database, dict[str, dict[str, str]], dict[str, float]], tmp_path: Path
) -> None:
    database, labels, returns = traced
    original = write_labels(tmp_path / "labels.csv", {"moe-1": labels["moe-1"]})
    wrong = {key: "Hold" for key in labels["moe-1"]}
    assert (await import_labels(database, write_labels(tmp_path / "wrong.csv", {"moe-1": wrong}))).appended
    assert (await import_labels(database, original)).appended
    assert (await recorded_labels(database, ["moe-1"]))["moe-1"] == labels["moe-1"]
    assert not (await import_labels(database, original)).appended
    # returns the same: the latest import per (key, as_of) is the state, an earlier one re-asserted is appended
    shifted = {key: value + 1.0 for key, value in returns.items()}
    assert (await import_returns(database, write_returns(tmp_path / "shifted.csv", shifted))).appended
    restored = await import_returns(database, write_returns(tmp_path / "r.csv", returns))
    assert restored.appended and (await recorded_returns(database)).values == returns
    assert not (await import_returns(database, write_returns(tmp_path / "r.csv", returns))).appended
    assert await _events(database, "returns.recorded") == 3


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("run,key,label\nmoe-1,T000,Hold\nmoe-1,T000,Buy\n", ":3: a second label for run 'moe-1', key 'T000'"),
        ("run,key,label\nnope,T000,Hold\n", ":2: no run 'nope' in the ledger"),
        ("run,key\nmoe-1,T000\n", ":1: no column label"),
        ("run,key,label\nmoe-1,,Hold\n", ":2: key: must be 1-255 characters"),
        ("run,key,label\nmoe-1,T000\n", ":2: expected 3 columns, got 2"),
    ],
)
async def test_bad_label_rows_append_nothing(database: Database, tmp_path: Path, content: str, reason: str) -> None:
    await append_trace(database, build_labels())
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ImportFailed) as caught:
        await import_labels(database, path)
    assert any(f"{path}{reason}" in e for e in caught.value.errors), caught.value.errors
    assert await _events(database, "labels.recorded") == 0


async def test_label_rows_are_read_as_import_reads_them(database: Database, tmp_path: Path) -> None:
    """The line cap and the UTF-8 check of `ledger import`'s reader apply to label files too."""
    await append_trace(database, build_labels())
    path = tmp_path / "odd.csv"
    path.write_bytes(b"run,key,label\nmoe-1,T000,Hold" + b"," * (1 << 20) + b"\nmoe-1,T001,\xff\n")
    with pytest.raises(ImportFailed) as caught:
        await import_labels(database, path)
    assert caught.value.errors == [
        f"{path}:2: line longer than 1,048,576 bytes",
        f"{path}:3: not valid UTF-8; save the file as UTF-8",
    ]
    assert await _events(database, "labels.recorded") == 0


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("key,return\nT000,abc\n", ":2: return: expected a number"),
        ("key,return\nT000,nan\n", ":2: return: 'nan' is not a finite number"),
        ("key,return,as_of\nT000,1,2026-13-01\n", ":2: as_of: expected a date"),
        ("key,return\nT000,1\nT000,2\n", ":3: a second return for key 'T000'"),
    ],
)
async def test_bad_return_rows_append_nothing(database: Database, tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ImportFailed) as caught:
        await import_returns(database, path)
    assert any(f"{path}{reason}" in e for e in caught.value.errors), caught.value.errors
    assert await _events(database, "returns.recorded") == 0


async def test_decide_refuses_bad_input(
    traced: tuple[Database, dict[str, dict[str, str]], dict[str, float]],
) -> None:
    database, _, _ = traced
    with pytest.raises(NotFound, match="no run 'ghost'"):
        await decide(database, ["ghost"], DENSE, SCALE_TEXT)
    with pytest.raises(ProjectionError, match="labels outside --scale: 'Strong Buy'"):
        await decide(database, MOE, DENSE, ",".join(SCALE[:-1]))
    with pytest.raises(ProjectionError, match="more than once"):
        await decide(database, MOE, ["moe-1"], SCALE_TEXT)
    with pytest.raises(ProjectionError, match="empty label"):
        await decide(database, MOE, DENSE, "Sell,,Buy")

"""The Decide page over the decision trace (tests/projections/decide_trace.py), on both backends without a browser:
the figures `ledger decide` gives, the label bars, the flipped keys, and their answers only behind the token."""

from __future__ import annotations

import html
import itertools
import re
import statistics
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient
from sklearn.metrics import cohen_kappa_score  # type: ignore[import-untyped]

from tests.projections.decide_trace import (
    DENSE,
    MOE,
    SCALE,
    append_trace,
    build_labels,
    build_returns,
    write_labels,
    write_returns,
)
from usage_ledger.answers.decide import decide
from usage_ledger.imports.label_import import import_labels, import_returns
from usage_ledger.ledger.db import Database
from usage_ledger.projections.engine import catch_up_all
from usage_ledger.projections.settings import ReportSettings
from usage_ledger.ui.decide import marked
from usage_ledger.ui.routers import create_ui_app

TOKEN = "t0ken"
QUERY = {"a": ",".join(MOE), "b": ",".join(DENSE), "scale": ",".join(SCALE)}


async def decision_ledger(database: Database, tmp_path: Path) -> dict[str, dict[str, str]]:
    labels = build_labels()
    await append_trace(database, labels)
    await import_labels(database, write_labels(tmp_path / "labels.csv", labels))
    await import_returns(database, write_returns(tmp_path / "returns.csv", build_returns()))
    await catch_up_all(database)
    return labels


def _figure(page: str, name: str) -> str:
    found = re.search(rf'data-figure="{re.escape(name)}">([^<]*)<', page)
    assert found, name
    return found.group(1)


async def test_the_page_shows_the_decision(database: Database, tmp_path: Path) -> None:
    labels = await decision_ledger(database, tmp_path)
    expected = await decide(database, MOE, DENSE, ",".join(SCALE))
    qwk = statistics.fmean(
        cohen_kappa_score(
            [labels[x][k] for k in sorted(labels[x])],
            [labels[y][k] for k in sorted(labels[x])],
            weights="quadratic",
            labels=SCALE,
        )
        for x, y in itertools.combinations(MOE, 2)
    )
    app = create_ui_app(database, ReportSettings(), admin_token=TOKEN, refresh=False)
    async with AsyncTestClient(app) as client:
        assert (await client.get("/_ledger/ui/decide", params=QUERY, follow_redirects=False)).status_code == 303
        await client.post("/_ledger/ui/login", data={"token": TOKEN, "next": "/_ledger/ui/"})
        page = (await client.get("/_ledger/ui/decide", params=QUERY)).text
        assert _figure(page, "a.self_qwk") == f"{qwk:,.4f}"
        assert (
            expected.a.throughput_tps is not None
            and _figure(page, "a.throughput_tps") == f"{expected.a.throughput_tps:,.1f}"
        )
        for figure in ("a.self_qwk", "b.rank_ic", "between.qwk"):  # each interval and its n, as decide gives them
            group, name = figure.split(".")
            owner = expected.between if group == "between" else getattr(expected, group)
            evidence = owner.evidence[name]
            assert evidence.ci95 is not None
            low, high = (f"{v:,.4f}" for v in evidence.ci95)
            assert f'data-ci="{figure}" data-n="{evidence.n}">[{low}, {high}] n {evidence.n}</span>' in page
        for name in ("throughput_tps", "self_qwk", "self_agree_rate", "rank_ic"):
            noted = re.search(rf'data-noise="{name}">([^<]*)<', page)
            assert noted and noted.group(1) == ("within noise" if name in expected.within_noise else "")
        assert expected.within_noise  # the trace's groups overlap somewhere
        hold = expected.a.label_shares["Hold"]
        assert f"width: {round(100 * hold, 1)}%" in page
        flip = expected.between.flipped[0]
        assert f'data-key="{flip.key}"' in page
        answers = await client.get(
            "/_ledger/ui/decide/answers", params={"key": flip.key, "a": QUERY["a"], "b": QUERY["b"]}
        )
        text = html.unescape(re.sub(r"</?mark>", "", answers.text))
        for run in MOE + DENSE:
            assert f"{flip.key} under {run}: revenue grew, margins held.\nGrade: {labels[run][flip.key]}" in text
        assert "<mark>" in answers.text
        bad = await client.get("/_ledger/ui/decide", params={**QUERY, "scale": "Sell,Hold"})
        assert bad.status_code == 400 and "labels outside --scale" in html.unescape(bad.text)
        assert (await client.get("/_ledger/ui/decide", params={**QUERY, "a": "ghost"})).status_code == 404
        assert 'id="pick-more"' in (await client.get("/_ledger/ui/decide")).text  # nothing asked yet: the form


async def test_without_a_token_the_answers_stay_hidden(database: Database, tmp_path: Path) -> None:
    await decision_ledger(database, tmp_path)
    app = create_ui_app(database, ReportSettings(), admin_token=None, refresh=False)
    async with AsyncTestClient(app) as client:
        answers = await client.get("/_ledger/ui/decide/answers", params={"key": "T000", "a": "moe-1", "b": "dense-1"})
        assert answers.status_code == 200 and 'id="answers-hidden"' in answers.text and "Grade:" not in answers.text


@pytest.mark.parametrize(
    ("text", "other", "differs"),
    [("Grade: Hold", "Grade: Buy", ["Hold"]), ("same words", "same words", []), ("a b c", None, [])],
)
def test_differences_are_marked_by_word(text: str, other: str | None, differs: list[str]) -> None:
    segments = marked(text, other)
    assert "".join(s.text for s in segments) == text
    assert [s.text for s in segments if s.differs] == differs

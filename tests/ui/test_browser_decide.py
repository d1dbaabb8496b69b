"""The Decide page in headless chromium: log in, read a figure, open a flipped key's answers side by side."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from sklearn.metrics import cohen_kappa_score  # type: ignore[import-untyped]

from tests.ledger.helpers import build_ledger
from tests.projections.decide_trace import DENSE, MOE, SCALE, TICKERS, build_labels
from tests.ui.conftest import TOKEN, UiServer, run_async, start_ui, stop
from tests.ui.test_decide_page import decision_ledger


@pytest.fixture(scope="module")
def decide_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    where = tmp_path_factory.mktemp("decide-ledger")
    url = f"sqlite:///{where / 'ledger.db'}"

    async def build() -> None:
        await build_ledger(url, lambda database: decision_ledger(database, where))

    run_async(build)
    process, server = start_ui(url, token=TOKEN)
    try:
        yield server
    finally:
        stop(process)


def test_the_decide_page_in_a_browser(browser: Any, decide_ui: UiServer, screenshot_dirs: list[Path]) -> None:
    labels = build_labels()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        query = urlencode({"a": ",".join(MOE), "b": ",".join(DENSE), "scale": ",".join(SCALE)})
        page.goto(f"{decide_ui.base}/_ledger/ui/decide?{query}")
        assert "/_ledger/ui/login" in page.url
        page.fill("input[name=token]", TOKEN)
        page.click("#login button")
        page.wait_for_selector("#decide-table")
        qwk = statistics.fmean(
            cohen_kappa_score(
                [labels[x][t] for t in TICKERS], [labels[y][t] for t in TICKERS], weights="quadratic", labels=SCALE
            )
            for x, y in itertools.combinations(DENSE, 2)
        )
        assert page.inner_text('[data-figure="b.self_qwk"]') == f"{qwk:,.4f}"
        interval = page.inner_text('[data-ci="b.self_qwk"]')  # under the figure: its 95 % interval and n
        low, high = (float(v) for v in interval.split("]")[0].strip("[").split(","))
        assert low < qwk < high and interval.endswith(f"n {len(TICKERS)}")
        assert page.locator('[data-noise="self_qwk"]').count() == 1
        assert page.locator("#label-shares .fill.a").count() == len(SCALE)
        for directory in screenshot_dirs:
            page.screenshot(path=str(directory / "decide.png"), full_page=True)
        row = page.locator("#flipped tbody tr").first
        key = row.get_attribute("data-key")
        assert key is not None
        row.locator("a").click()
        page.wait_for_selector("#answers-a")
        for group, runs in (("a", MOE), ("b", DENSE)):
            shown = page.locator(f"#answers-{group} pre.body")
            assert shown.count() == len(runs)
            for i, run in enumerate(runs):
                assert shown.nth(i).inner_text().endswith(f"Grade: {labels[run][key]}")
        assert page.locator("mark").count() > 0
        for directory in screenshot_dirs:
            page.screenshot(path=str(directory / "decide-answers.png"), full_page=True)
        assert errors == []
    finally:
        context.close()

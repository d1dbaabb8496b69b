"""The dashboard on a phone (390 × 844) and its oddities (issue #54), in headless chromium over seed_busy_ledger:
no page scrolls sideways, no axis labels overlap, each column named once, bars from zero, two scales said,
Compare's baseline the first run ticked, an all-failed run says why, Decide offers the runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ui.conftest import UiServer
from tests.ui.seed import BUSY_CALLS, BUSY_RUN, BUSY_STREAMED, ERA_RUNS, FAILED_CALLS, FAILED_RUN
from tests.ui.test_browser import Tab, _shoot

PHONE = {"width": 390, "height": 844}

PHONE_PAGES = {
    "phone-runs": "/_ledger/ui/",
    "phone-run": f"/_ledger/ui/run?run={BUSY_RUN}",
    "phone-run-failed": f"/_ledger/ui/run?run={FAILED_RUN}",
    "phone-eras": "/_ledger/ui/eras",
    "phone-daily": "/_ledger/ui/daily",
    "phone-calls": "/_ledger/ui/calls",
    "phone-call": f"/_ledger/ui/call?id={BUSY_RUN}-0",
    "phone-compare-pick": "/_ledger/ui/compare",
    "phone-compare": "/_ledger/ui/compare?run=era-0&run=era-1",
    "phone-decide": "/_ledger/ui/decide",
}

# The x-axis tick labels as uPlot draws them on its canvas: each line of each label centred on its tick,
# as wide as the axis font measures it. Two boxes on the same line that intersect overlap on screen.
_OVERLAPPING_LABELS = """() => {
  const measure = document.createElement("canvas").getContext("2d");
  const found = [];
  let axes = 0;
  for (const [name, u] of Object.entries(window.ledgerCharts)) {
    u.axes.forEach((axis, i) => {
      if (axis.show === false || axis.side % 2 === 1 || !axis._values) return;
      axes++;
      measure.font = axis.font[0];
      const lines = [];
      axis._splits.forEach((v, j) => {
        const text = axis._values[j];
        if (text === null || text === undefined || text === "") return;
        const x = u.valToPos(v, axis.scale);
        String(text).split("\\n").forEach((line, k) => {
          const half = measure.measureText(line).width / devicePixelRatio / 2;
          (lines[k] ??= []).push([x - half, x + half, line]);
        });
      });
      for (const boxes of lines) {
        boxes.sort((a, b) => a[0] - b[0]);
        for (let k = 1; k < boxes.length; k++) {
          if (boxes[k][0] < boxes[k - 1][1]) found.push(`${name} axis ${i}: ${boxes[k - 1][2]} | ${boxes[k][2]}`);
        }
      }
    });
  }
  return { axes, found };
}"""


@pytest.fixture
def phone(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport=PHONE)
    try:
        yield ctx
    finally:
        ctx.close()


def test_no_page_scrolls_sideways_on_a_phone_and_no_axis_labels_overlap(
    phone: Any, busy_ui: UiServer, screenshot_dirs: list[Path]
) -> None:
    tab = Tab(phone, busy_ui.base)
    wide, overlapping, axes = [], [], 0
    for name, path in PHONE_PAGES.items():
        page = tab.open(path)
        _shoot(page, name, screenshot_dirs)
        scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        if scroll > client:
            wide.append(f"{path}: {scroll} px wide in {client}")
        checked = page.evaluate(_OVERLAPPING_LABELS)
        axes += checked["axes"]
        overlapping += [f"{path}: {o}" for o in checked["found"]]
    assert wide == []
    assert overlapping == []
    assert axes >= 14  # runs 1, run 5 + 5, eras 1, daily 2, compare 4 (and the checker saw them all)
    assert tab.errors == []


def test_the_runs_table_names_each_column_once(phone: Any, busy_ui: UiServer) -> None:
    tab = Tab(phone, busy_ui.base)
    for path in ("/_ledger/ui/", "/_ledger/ui/?label=model"):
        headers = [h.strip().lower() for h in tab.open(path).locator("#runs-table thead th").all_inner_texts()]
        assert len(headers) == len(set(headers)), headers
        cells = tab.page.locator("#runs-table tbody tr:first-child td").count()
        assert cells == len(headers)


def test_bar_charts_of_counts_and_means_start_at_zero(phone: Any, busy_ui: UiServer) -> None:
    tab = Tab(phone, busy_ui.base)
    tab.open(f"/_ledger/ui/run?run={BUSY_RUN}")
    assert min(tab.series("tickers", 1)) >= 5  # 5 to 8 calls a ticker: uPlot's own range starts above 0
    assert tab.page.evaluate("window.ledgerCharts.tickers.scales.y.min") == 0
    tab.open("/_ledger/ui/eras")
    assert tab.page.evaluate("window.ledgerCharts.eras.scales.y.min") == 0


def test_the_daily_charts_say_they_have_two_scales(phone: Any, busy_ui: UiServer) -> None:
    tab = Tab(phone, busy_ui.base)
    page = tab.open("/_ledger/ui/daily")
    for chart in ("daily", "weekday"):
        axes = page.evaluate(
            """(name) => { const u = window.ledgerCharts[name];
              const colour = (c, i) => (typeof c === "function" ? c(u, i) : c);
              return u.axes.slice(1).map((a, i) => [a.scale, a.label, colour(a.stroke, i + 1),
                colour(u.series.find((s) => s.scale === a.scale).stroke, i + 1)]); }""",
            chart,
        )
        assert [a[0] for a in axes] == ["in", "out"]
        assert "left" in axes[0][1] and "right" in axes[1][1]
        assert all(a[2] == a[3][:7] for a in axes), axes  # each axis in its bars' colour
    assert "Two scales" in page.inner_text("#daily-scales")


def test_compare_measures_against_the_run_ticked_first(phone: Any, busy_ui: UiServer) -> None:
    tab = Tab(phone, busy_ui.base)
    page = tab.open("/_ledger/ui/compare")
    page.check("#pick input[value=era-3]")
    page.check("#pick input[value=era-1]")
    assert page.inner_text("#pick label:has(input[value=era-3]) .rank") == "1"
    page.click("#pick button")
    tab.ready()
    assert page.locator("#compare-table thead th").all_inner_texts()[1:] == ["era-3", "era-1", "era-1 ÷ era-3"]
    page.uncheck("#pick input[value=era-3]")  # the kept order: era-1 first now, then era-0
    page.check("#pick input[value=era-0]")
    page.click("#pick button")
    tab.ready()
    assert page.locator("#compare-table thead th").all_inner_texts()[-1] == "era-0 ÷ era-1"
    assert tab.errors == []


def test_a_run_whose_calls_all_failed_says_why_its_charts_are_empty(phone: Any, busy_ui: UiServer) -> None:
    tab = Tab(phone, busy_ui.base)
    page = tab.open(f"/_ledger/ui/run?run={FAILED_RUN}")
    for chart in ("output_rate", "ttft", "tpot"):
        text = page.inner_text(f"[data-source={chart}]")
        assert text == f"no ok call among the run's {FAILED_CALLS}: {FAILED_CALLS} failed", chart
    assert tab.points("ttft") == 0 and tab.points("output-rate") == 0


def test_token_time_histograms_say_only_streamed_calls_count(phone: Any, busy_ui: UiServer) -> None:
    tab = Tab(phone, busy_ui.base)
    page = tab.open(f"/_ledger/ui/run?run={BUSY_RUN}")
    for chart in ("ttft", "tpot"):
        text = page.inner_text(f"[data-source={chart}]")
        assert f"{BUSY_STREAMED} of the {BUSY_CALLS} ok calls (only a streamed call has token times)" in text
        assert sum(tab.series(chart, 1)) == BUSY_STREAMED


def test_histograms_show_their_first_and_last_bars_whole(phone: Any, busy_ui: UiServer) -> None:
    tab = Tab(phone, busy_ui.base)
    tab.open(f"/_ledger/ui/run?run={BUSY_RUN}")
    for chart in ("ttft", "tpot"):
        mids = tab.series(chart, 0)
        half = (mids[1] - mids[0]) / 2
        x = tab.page.evaluate(
            f"[window.ledgerCharts[{chart!r}].scales.x.min, window.ledgerCharts[{chart!r}].scales.x.max]"
        )
        assert x[0] <= mids[0] - half + 1e-9 and x[1] >= mids[-1] + half - 1e-9, (chart, x, mids)


def test_the_decide_page_offers_the_runs(phone: Any, busy_ui: UiServer) -> None:
    tab = Tab(phone, busy_ui.base)
    page = tab.open("/_ledger/ui/decide?a=era-2")
    assert page.is_checked("#decide-picker input[data-pick-into=a][value=era-2]")
    page.check("#decide-picker input[data-pick-into=a][value=era-0]")
    page.check("#decide-picker input[data-pick-into=b][value=era-1]")
    page.check("#decide-picker input[data-pick-into=b][value=era-3]")
    assert page.input_value("input[name=a]") == "era-2,era-0"
    assert page.input_value("input[name=b]") == "era-1,era-3"
    page.uncheck("#decide-picker input[data-pick-into=a][value=era-2]")
    assert page.input_value("input[name=a]") == "era-0"
    boxes = page.locator("#decide-picker input[data-pick-into=a]").count()
    assert (
        boxes == page.locator("#decide-picker input[data-pick-into=b]").count() == ERA_RUNS + 2
    )  # busy, the eras, broken
    assert tab.errors == []

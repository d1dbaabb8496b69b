"""The dashboard in headless chromium: every page loads without a console error, the charts draw the
seeded ledger's points, filters change what is shown, the token form opens the door, a live run updates."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.projections.helpers import append
from tests.ui.conftest import TOKEN, UiServer, run_async, seeded_ledger, start_ui, stop
from tests.ui.seed import DENSE_CALLS, MOE_CALLS, REQUEST_BODY, WIDE_RUNS
from usage_ledger.ledger.db import open_database
from usage_ledger.ledger.events import CallFinished, CallStarted, Timings, Usage, new_event

PAGES = {
    "runs": "/_ledger/ui/",
    "run": "/_ledger/ui/run?run=moe-a",
    "eras": "/_ledger/ui/eras",
    "daily": "/_ledger/ui/daily?tz=Asia/Seoul",
    "calls": "/_ledger/ui/calls",
    "call": "/_ledger/ui/call?id=moe-a-0",
    "compare": "/_ledger/ui/compare?run=moe-a&run=dense-b",
}


class Tab:
    """A browser page that remembers every console error and uncaught exception."""

    def __init__(self, context: Any, base: str) -> None:
        self.page = context.new_page()
        self.base = base
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def open(self, path: str) -> Any:
        self.page.goto(self.base + path)
        return self.ready()

    def ready(self) -> Any:
        self.page.wait_for_selector("main[data-ready]", state="attached")
        assert self.page.get_attribute("main", "data-ready") == "1", self.errors
        return self.page

    def points(self, chart: str) -> int:
        return int(self.page.get_attribute(f'[data-chart="{chart}"]', "data-points") or -1)

    def series(self, chart: str, index: int) -> list[Any]:
        values: list[Any] = self.page.evaluate(f"window.ledgerCharts[{chart!r}].data[{index}]")
        return values


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        yield ctx
    finally:
        ctx.close()


def _shoot(page: Any, name: str, dirs: list[Path]) -> None:
    for directory in dirs:
        page.screenshot(path=str(directory / f"{name}.png"), full_page=True)


def test_every_page_loads_without_a_console_error(
    context: Any, open_ui: UiServer, guarded_ui: UiServer, screenshot_dirs: list[Path]
) -> None:
    tab = Tab(context, open_ui.base)
    for name, path in PAGES.items():
        tab.open(path)
        assert tab.page.locator("h1").count() == 1
        _shoot(tab.page, name, screenshot_dirs)
    tab.open("/_ledger/ui/login")
    tab.open("/_ledger/ui/eras?by=model&kind=nightly")  # no run is of that kind: empty tables, an empty chart
    assert tab.points("eras") == 0
    picker = tab.open("/_ledger/ui/compare")
    assert picker.locator("#pick input[type=checkbox]").count() == 2 and picker.locator("#pick-more").count() == 1
    guarded = Tab(context, guarded_ui.base)
    guarded.open("/_ledger/ui/")  # redirected to the form
    _shoot(guarded.page, "login", screenshot_dirs)
    assert tab.errors == [] and guarded.errors == []
    assert all((d / "runs.png").stat().st_size > 10_000 for d in screenshot_dirs)


def test_the_charts_draw_the_seeded_points(context: Any, open_ui: UiServer) -> None:
    tab = Tab(context, open_ui.base)
    tab.open(PAGES["runs"])
    assert tab.points("runs-throughput") == 2  # one point per run, coloured by hardware
    assert [s["label"] for s in tab.page.evaluate("window.ledgerCharts['runs-throughput'].series")][1:] == [
        "a100",
        "h100",
    ]
    tab.open(PAGES["run"])
    # starts at 0,1,2,10,11,12 s and ends 8 s later: 11 distinct moments (10 s is an end and a start)
    assert tab.points("in-flight") == 11
    assert max(tab.series("in-flight", 1)) == 3
    assert sum(tab.series("ttft", 1)) == MOE_CALLS and sum(tab.series("tpot", 1)) == MOE_CALLS
    assert tab.points("tickers") == 2 and tab.series("tickers", 1) == [3, 3]
    assert tab.points("server") == 3  # the samples at -2 s, 9 s and 30 s bracket and fall inside the run
    assert tab.series("server", 2) == [None, 0.5, 1.0]  # accepted ÷ drafted between samples
    rate = tab.series("output-rate", 1)
    assert sum(rate) * 1 == pytest.approx(200 + 210 + 220 + 230 + 240 + 250)  # 1 s buckets: Σ tokens/s = tokens
    tab.open("/_ledger/ui/eras")
    assert tab.points("eras") == 2
    assert len(tab.page.evaluate("window.ledgerCharts['eras'].series")) == 3  # x, then both formulas
    tab.open(PAGES["daily"])
    assert tab.points("daily") == 2 and tab.points("weekday") == 3  # Mon, Wed, Mon-Fri in Seoul
    page = tab.open(PAGES["compare"])
    assert tab.points("compare-throughput") == 2  # both formulas, a bar per run at each
    assert tab.points("compare-ttft") == 3 and tab.points("compare-tpot") == 3  # p50, p90, p99
    assert tab.points("compare-itl") == 0  # the seed streamed no token times
    assert [s["label"] for s in page.evaluate("window.ledgerCharts['compare-throughput'].series")][1:] == [
        "moe-a",
        "dense-b",
    ]
    assert page.locator("#compare-table thead th").all_inner_texts() == [
        "Metric",
        "moe-a",
        "dense-b",
        "dense-b ÷ moe-a",
    ]
    assert tab.errors == []


def _rows(page: Any, table: str) -> list[str]:
    return [t.strip() for t in page.locator(f"#{table} tbody tr td:first-child").all_inner_texts()]


def test_filters_and_sorting_change_what_is_shown(context: Any, open_ui: UiServer) -> None:
    tab = Tab(context, open_ui.base)
    page = tab.open("/_ledger/ui/calls")
    assert len(_rows(page, "calls-table")) == MOE_CALLS + DENSE_CALLS
    page.select_option("select[name=status]", "failed")
    page.click("#call-filters button")
    tab.ready()
    assert _rows(page, "calls-table") == ["dense-b-3"]
    page.select_option("select[name=status]", "")
    page.select_option("select[name=model]", "qwen-moe")
    page.fill("input[name=ticker]", "MSFT")
    page.click("#call-filters button")
    tab.ready()
    assert _rows(page, "calls-table") == ["moe-a-3", "moe-a-4", "moe-a-5"]
    page = tab.open("/_ledger/ui/calls")
    page.fill("input[name=since]", "2026-03-02T12:00:10")
    page.fill("input[name=until]", "2026-03-02")  # a date: through that day
    page.click("#call-filters button")
    tab.ready()
    assert _rows(page, "calls-table") == ["moe-a-3", "moe-a-4", "moe-a-5"]
    assert page.input_value("input[name=since]") == "2026-03-02T12:00:10"  # the form keeps what was asked
    page = tab.open("/_ledger/ui/calls?run=dense-b")
    assert len(_rows(page, "calls-table")) == DENSE_CALLS
    assert "4 calls match" in page.inner_text("#calls-total")

    page = tab.open("/_ledger/ui/daily?tz=UTC")
    assert _rows(page, "daily-table") == ["2026-03-02", "2026-03-03"]
    page.fill("#tz", "Asia/Seoul")
    page.click(".filters button")
    tab.ready()
    assert _rows(page, "daily-table") == ["2026-03-02", "2026-03-04"]

    page = tab.open("/_ledger/ui/")
    page.select_option("select[name=label]", "model")
    tab.ready()
    labels = [s["label"] for s in page.evaluate("window.ledgerCharts['runs-throughput'].series")][1:]
    assert labels == ["qwen-moe", "gemma-dense"]
    assert _rows(page, "runs-table") == ["moe-a", "dense-b"]
    page.click("#runs-table th:has-text('Calls')")
    assert _rows(page, "runs-table") == ["dense-b", "moe-a"]  # 4 calls before 6
    page.click("#runs-table th:has-text('Calls')")
    assert _rows(page, "runs-table") == ["moe-a", "dense-b"]
    assert tab.errors == []


def test_the_token_form_opens_the_dashboard_and_the_bodies(
    context: Any, guarded_ui: UiServer, screenshot_dirs: list[Path]
) -> None:
    tab = Tab(context, guarded_ui.base)
    page = tab.open("/_ledger/ui/call?id=moe-a-0")
    assert "/_ledger/ui/login" in page.url
    assert context.request.get(guarded_ui.base + "/_ledger/ui/api/runs").status == 401
    page.fill("input[name=token]", "not-the-token")
    page.click("#login button")
    tab.ready()
    assert page.inner_text("#login-error") == "That is not the admin token."
    assert [e for e in tab.errors if "401" not in e] == []  # the refused form answers 401, which chromium logs
    tab.errors.clear()
    page.fill("input[name=token]", TOKEN)
    page.click("#login button")
    tab.ready()
    assert page.url.endswith("/_ledger/ui/call?id=moe-a-0")  # back to the page first asked for
    (cookie,) = context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
    assert page.inner_text("pre[data-body=request]") == REQUEST_BODY.decode()  # escaped, shown as text
    _shoot(page, "call-with-token", screenshot_dirs)
    assert context.request.get(guarded_ui.base + "/_ledger/ui/api/runs").status == 200
    page = tab.open("/_ledger/ui/call?id=moe-a-1")
    assert "redacted" in page.inner_text("p[data-body=request]")
    page.click("form.logout button")
    tab.ready()
    assert "/_ledger/ui/login" in page.url
    assert context.request.get(guarded_ui.base + "/_ledger/ui/api/runs").status == 401
    assert tab.errors == []


def test_without_a_token_no_body_is_shown(context: Any, open_ui: UiServer) -> None:
    tab = Tab(context, open_ui.base)
    page = tab.open("/_ledger/ui/call?id=moe-a-0")
    assert page.locator("#bodies-hidden").count() == 1
    assert "price of AAPL" not in page.content()
    assert page.locator("#events-table tbody tr").count() == 2


def _live_call(call_id: str, start: datetime, *, end: datetime | None) -> list[Any]:
    body = CallStarted(call_id=call_id, received_at=start, method="POST", path="/v1/chat/completions", run="live")
    events = [new_event(body, stream=f"call-{call_id}", occurred_at=start)]
    if end is not None:
        timings = Timings(received=start, first_token=start, last_token=end, finished=end)
        usage = Usage(prompt_tokens=10, completion_tokens=20, total_tokens=30)
        finish = CallFinished(call_id=call_id, status=200, usage=usage, usage_source="reported", timings=timings)
        events.append(new_event(finish, stream=f"call-{call_id}", occurred_at=end))
    return events


def _append_now(url: str, events: list[Any]) -> None:
    async def run() -> None:
        database = open_database(url, null_pool=True)
        try:
            await append(database, *events)
        finally:
            await database.dispose()

    run_async(run)


def test_a_run_in_progress_updates_while_it_runs(context: Any, tmp_path: Path) -> None:
    url = seeded_ledger(tmp_path / "live.db")
    now = datetime.now(UTC)
    _append_now(url, _live_call("live-0", now - timedelta(seconds=5), end=None))
    process, server = start_ui(url)
    try:
        tab = Tab(context, server.base)
        page = tab.open("/_ledger/ui/run?run=live")
        assert page.is_visible("#live-badge")
        assert page.inner_text("[data-field=calls]") == "1"
        _append_now(url, _live_call("live-1", now - timedelta(seconds=2), end=now))
        page.wait_for_function("document.querySelector('[data-field=calls]').textContent === '2'", timeout=20_000)
        assert tab.points("in-flight") == 3  # two starts and one end
        assert tab.errors == []
    finally:
        stop(process)


# Each axis against the labels it drew. A y axis (uPlot sides 1 and 3) narrower than its tick, gap and
# widest label is cut by the canvas ("40,000" shows as ",000"); labels that repeat ("0 0 0" for ticks
# 0.0005 apart) say nothing.
_CLIPPED_AXES = """() => {
  const measure = document.createElement("canvas").getContext("2d");
  const clipped = [];
  for (const [name, u] of Object.entries(window.ledgerCharts)) {
    u.axes.forEach((axis, i) => {
      const labels = (axis._values || []).filter((v) => v !== null && v !== undefined).map(String);
      if (axis.show === false || labels.length === 0) return;
      if (new Set(labels).size < labels.length) clipped.push(`${name} axis ${i} repeats a label: ${labels.join(" ")}`);
      if (axis.side % 2 === 0) return;
      measure.font = axis.font[0];
      const widest = Math.max(...labels.map((v) => measure.measureText(v).width)) / devicePixelRatio;
      const needed = (axis.ticks.show === false ? 0 : axis.ticks.size) + axis.gap + widest;
      if (axis._size < needed) clipped.push(`${name} axis ${i}: ${axis._size} px for ${labels.join(" ")} (needs ${needed.toFixed(1)})`);
    });
  }
  return clipped;
}"""

# Every positive bar or point of a chart at least 2 px above its zero: a value drawn on another's scale
# (TPOT's 0.002 ms beside TTFT's 250 ms) is not there for the eye.
_FLAT_VALUES = """(name) => {
  const u = window.ledgerCharts[name];
  const flat = [];
  u.series.forEach((s, i) => {
    if (i === 0) return;
    u.data[i].forEach((v, j) => {
      if (v > 0 && u.valToPos(0, s.scale) - u.valToPos(v, s.scale) < 2) flat.push(`${s.label}[${j}] = ${v}`);
    });
  });
  return flat;
}"""

WIDE_PAGES = {
    "wide-runs": "/_ledger/ui/",
    "wide-run": f"/_ledger/ui/run?run={WIDE_RUNS[0]}",
    "wide-eras": "/_ledger/ui/eras?by=hardware",
    "wide-daily": "/_ledger/ui/daily?tz=UTC",
    "wide-compare": f"/_ledger/ui/compare?run={WIDE_RUNS[0]}&run={WIDE_RUNS[1]}",
}


def test_no_chart_cuts_its_axis_labels(context: Any, wide_ui: UiServer, screenshot_dirs: list[Path]) -> None:
    tab = Tab(context, wide_ui.base)
    drawn, clipped = 0, []
    for name, path in WIDE_PAGES.items():
        page = tab.open(path)
        _shoot(page, name, screenshot_dirs)
        clipped += [f"{path}: {problem}" for problem in page.evaluate(_CLIPPED_AXES)]
        drawn += len(page.evaluate("Object.keys(window.ledgerCharts)"))
    assert clipped == []
    assert drawn == 13  # runs 1, run 5 (no server samples), eras 1, daily 2, compare 4: none went unchecked
    for chart in ("compare-throughput", "compare-ttft", "compare-tpot"):
        assert tab.points(chart) > 0
        assert page.evaluate(_FLAT_VALUES, chart) == [], chart
    assert tab.errors == []

"""The Decide page: `ledger decide` for two groups of runs (answers.decide), label distributions as bars,
and the flipped keys, each opening both groups' answers side by side with their differences marked.

Answers are call bodies: shown only to an operator who entered `LEDGER_ADMIN_TOKEN`, as on the call page.
"""

from __future__ import annotations

import difflib
import re

import msgspec
from litestar import Response, get
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromQuery

from usage_ledger.answers import LATENCY_FIGURES, Decision, RunAnswer, decide, key_answers, runs_report, split_runs
from usage_ledger.projections import ProjectionError, parse_as_of
from usage_ledger.ui.auth import UiAuth
from usage_ledger.ui.reader import Reader
from usage_ledger.ui.render import Renderer

__all__ = ("AnswerColumn", "DecideView", "Segment", "decide_handlers", "decide_view", "marked")

_WORDS = re.compile(r"(\s+)")


class DecideView(msgspec.Struct, frozen=True, kw_only=True):
    runs: list[str]
    """Every run in the ledger, to pick from."""
    a: str
    b: str
    scale: str
    as_of: str
    decision: Decision | None
    scale_labels: list[str]
    latency_figures: list[str]


class Segment(msgspec.Struct, frozen=True):
    text: str
    differs: bool


class AnswerColumn(msgspec.Struct, frozen=True, kw_only=True):
    answer: RunAnswer
    segments: list[Segment]


def marked(text: str, other: str | None) -> list[Segment]:
    """`text` in word runs, those not in `other` (difflib over words and spaces) marked as differing."""
    words = _WORDS.split(text)
    if other is None:
        return [Segment(text, False)]
    matcher = difflib.SequenceMatcher(a=words, b=_WORDS.split(other), autojunk=False)
    segments = []
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if i1 < i2:
            segments.append(Segment("".join(words[i1:i2]), tag != "equal"))
    return segments


async def decide_view(reader: Reader, a: str, b: str, scale: str, as_of: str) -> DecideView:
    database = await reader.ready()
    gap = reader.settings.run_gap_s
    names = [row.run for row in await runs_report(database, run_gap_s=gap, refresh=False)]
    decision = None
    labels: list[str] = []
    if a.strip() and b.strip() and scale.strip():
        try:
            when = parse_as_of(as_of)
        except ValueError as exc:
            raise ProjectionError(str(exc)) from exc
        decision = await decide(database, split_runs(a), split_runs(b), scale, as_of=when, run_gap_s=gap, refresh=False)
        labels = [part.strip() for part in scale.split(",")]
    return DecideView(
        runs=names,
        a=a,
        b=b,
        scale=scale,
        as_of=as_of,
        decision=decision,
        scale_labels=labels,
        latency_figures=list(LATENCY_FIGURES),
    )


def _columns(answers: list[RunAnswer], other: RunAnswer | None) -> list[AnswerColumn]:
    against = other.text if other is not None else None
    return [AnswerColumn(answer=ans, segments=marked(ans.text, against) if ans.text else []) for ans in answers]


def decide_handlers(reader: Reader, auth: UiAuth, renderer: Renderer) -> list[HTTPRouteHandler]:
    """`/decide` and `/decide/answers`, for the pages router (its guard and error pages apply)."""

    @get("/decide", include_in_schema=False)
    async def decide_page(
        a: FromQuery[str] = "", b: FromQuery[str] = "", scale: FromQuery[str] = "", as_of: FromQuery[str] = ""
    ) -> Response[str]:
        view = await decide_view(reader, a, b, scale, as_of)
        return renderer.page("decide.html", title="Decide", view=view)

    @get("/decide/answers", include_in_schema=False)
    async def answers_page(key: FromQuery[str], a: FromQuery[str] = "", b: FromQuery[str] = "") -> Response[str]:
        shown = auth.enabled
        first, second = split_runs(a), split_runs(b)
        if not first or not second:
            raise ProjectionError("give both groups' runs: ?key=K&a=R1,R2&b=R3")
        group_a: list[AnswerColumn] = []
        group_b: list[AnswerColumn] = []
        if shown:
            database = await reader.ready()
            gap = reader.settings.run_gap_s
            found_a = await key_answers(database, first, key, run_gap_s=gap)
            found_b = await key_answers(database, second, key, run_gap_s=gap)
            ref_a = next((x for x in found_a if x.text), None)
            ref_b = next((x for x in found_b if x.text), None)
            group_a, group_b = _columns(found_a, ref_b), _columns(found_b, ref_a)
        return renderer.page(
            "decide_answers.html", title=f"Answers for {key}", key=key, shown=shown, group_a=group_a, group_b=group_b
        )

    return [decide_page, answers_page]

"""Chart data from a run's calls: calls in flight, output tokens per second, TTFT and TPOT histograms.

Pure functions over `CallView`s (projections.rows); times are Unix seconds, as uPlot draws them.
Each result carries `source`: where its numbers come from, shown under the chart.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

import msgspec

from usage_ledger.answers import tpot_s
from usage_ledger.ledger import ServerSampled
from usage_ledger.projections import CallView

__all__ = (
    "Histogram",
    "Series",
    "ServerSeries",
    "bucket_width_s",
    "histogram",
    "in_flight_series",
    "nothing_to_draw",
    "output_rate_series",
    "server_series",
    "token_times_source",
    "tpot_values",
    "ttft_values",
)

_BUCKET_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


class Series(msgspec.Struct, frozen=True, kw_only=True):
    x: list[float]
    y: list[float | None]
    source: str


class Histogram(msgspec.Struct, frozen=True, kw_only=True):
    edges: list[float]
    """`len(counts) + 1` bin edges; bin i holds edges[i] <= v < edges[i + 1] (the last bin includes its end)."""
    counts: list[int]
    values: int
    unit: str
    source: str


def in_flight_series(calls: Sequence[CallView]) -> Series:
    """Calls running at each moment a call started or ended (a step chart: the value holds until the next x)."""
    changes: dict[float, int] = {}
    for call in calls:
        start = call.started_at.timestamp()
        changes[start] = changes.get(start, 0) + 1
        if call.ended_at is not None:
            end = call.ended_at.timestamp()
            changes[end] = changes.get(end, 0) - 1
    x: list[float] = []
    y: list[float | None] = []
    running = 0
    for moment in sorted(changes):
        running += changes[moment]
        x.append(moment)
        y.append(float(running))
    return Series(x=x, y=y, source="calls projection: started_at (+1) and ended_at (-1) of the run's calls")


def bucket_width_s(span_s: float, buckets: int = 120) -> int:
    """The smallest round width that cuts `span_s` into at most `buckets` buckets."""
    for step in _BUCKET_STEPS_S:
        if span_s / step <= buckets:
            return step
    return math.ceil(span_s / buckets)


def output_rate_series(calls: Sequence[CallView], buckets: int = 120) -> Series:
    """Output tokens per second per time bucket: each finished call's output tokens spread evenly
    between its first and last token (its start and end when it streamed no token times)."""
    spans: list[tuple[float, float, int]] = []
    for call in calls:
        if call.ended_at is None or call.output_tokens <= 0:
            continue
        begun = (call.first_token_at or call.started_at).timestamp()
        spans.append((begun, max((call.last_token_at or call.ended_at).timestamp(), begun), call.output_tokens))
    if not spans:
        return Series(x=[], y=[], source=nothing_to_draw(calls) or "no finished call has output tokens")
    begin = min(s[0] for s in spans)
    end = max(s[1] for s in spans)
    width = bucket_width_s(end - begin, buckets)
    origin = math.floor(begin / width) * width
    count = int((end - origin) // width) + 1  # the bucket holding `end` included
    tokens = [0.0] * count
    for first, last, out in spans:
        if last == first:
            tokens[min(count - 1, int((first - origin) // width))] += out
            continue
        rate = out / (last - first)
        i = int((first - origin) // width)
        while i < count:
            lo = max(first, origin + i * width)
            hi = min(last, origin + (i + 1) * width)
            if hi <= lo:
                break
            tokens[i] += rate * (hi - lo)
            i += 1
    return Series(
        x=[origin + i * width for i in range(count)],
        y=[t / width for t in tokens],
        source=f"calls projection: output_tokens spread over first_token_at..last_token_at, {width} s buckets",
    )


def nothing_to_draw(calls: Sequence[CallView]) -> str | None:
    """Why the charts of a run's ok calls are empty (every call failed, none finished yet), or None when one is ok:
    an empty chart says why, not "yet" for a run that is over."""
    if not calls:
        return "no calls in this run"
    if any(c.status == "ok" for c in calls):
        return None
    statuses = Counter(c.status for c in calls if c.ended_at is not None)
    open_calls = sum(1 for c in calls if c.ended_at is None)
    parts = [f"{n} {status}" for status, n in sorted(statuses.items())] + (
        [f"{open_calls} still open"] * bool(open_calls)
    )
    return f"no ok call among the run's {len(calls)}: " + ", ".join(parts)


def token_times_source(what: str, values: int, calls: Sequence[CallView]) -> str:
    """The line under a TTFT or TPOT histogram: whose figures these are, and how many of the ok calls have them."""
    ok = sum(1 for c in calls if c.status == "ok")
    if not ok:
        return nothing_to_draw(calls) or ""
    return f"{what}: {values:,} of the {ok:,} ok calls (only a streamed call has token times)"


def ttft_values(calls: Sequence[CallView]) -> list[float]:
    """Seconds to the first token of the ok calls, as `ledger compare` (and `vllm bench serve`) count them."""
    return [c.ttft_s for c in calls if c.status == "ok" and c.ttft_s is not None]


def tpot_values(calls: Sequence[CallView]) -> list[float]:
    """Seconds per output token after the first, of the ok calls: (e2e - TTFT) / (output - 1) (compare_latency)."""
    out = []
    for c in calls:
        if c.status != "ok" or c.ttft_s is None:
            continue
        e2e = (c.last_token_at - c.started_at).total_seconds() if c.last_token_at is not None else c.elapsed_s
        if e2e is not None and (per_token := tpot_s(e2e, c.ttft_s, c.output_tokens)) is not None:
            out.append(per_token)
    return out


def histogram(values: Sequence[float], *, unit: str, source: str, bins: int = 20) -> Histogram:
    """Equal-width bins from the smallest value to the largest."""
    if not values:
        return Histogram(edges=[], counts=[], values=0, unit=unit, source=source)
    low, high = min(values), max(values)
    if high == low:
        return Histogram(edges=[low, low + 1e-9], counts=[len(values)], values=len(values), unit=unit, source=source)
    width = (high - low) / bins
    counts = [0] * bins
    for value in values:
        counts[min(bins - 1, int((value - low) / width))] += 1
    edges = [low + i * width for i in range(bins)] + [high]
    return Histogram(edges=edges, counts=counts, values=len(values), unit=unit, source=source)


class ServerSeries(msgspec.Struct, frozen=True, kw_only=True):
    """The server's gauges at each sample in the run's window, and the draft acceptance between samples."""

    x: list[float]
    kv_cache_usage: list[float | None]
    running: list[float | None]
    waiting: list[float | None]
    acceptance_rate: list[float | None]
    """Accepted ÷ draft tokens between the previous sample and this one (None: no drafts, or a restart)."""
    source: str


_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
_DRAFTED = "vllm:spec_decode_num_draft_tokens_total"


def _acceptance(before: ServerSampled, after: ServerSampled) -> float | None:
    if _ACCEPTED not in after.counters or _DRAFTED not in after.counters:
        return None
    drafted = after.counters[_DRAFTED] - before.counters.get(_DRAFTED, 0.0)
    accepted = after.counters[_ACCEPTED] - before.counters.get(_ACCEPTED, 0.0)
    if drafted <= 0 or accepted < 0:  # none drafted, or the counters went down: the server restarted
        return None
    return accepted / drafted


def server_series(samples: Sequence[ServerSampled]) -> ServerSeries:
    ordered = sorted(samples, key=lambda s: s.sampled_at)
    return ServerSeries(
        x=[s.sampled_at.timestamp() for s in ordered],
        kv_cache_usage=[s.gauges.get("vllm:kv_cache_usage_perc") for s in ordered],
        running=[s.gauges.get("vllm:num_requests_running") for s in ordered],
        waiting=[s.gauges.get("vllm:num_requests_waiting") for s in ordered],
        acceptance_rate=[None, *(_acceptance(a, b) for a, b in itertools.pairwise(ordered))][: len(ordered)],
        source=f"server.sampled events of the run's window ({len(ordered)} samples of the upstream's /metrics)",
    )

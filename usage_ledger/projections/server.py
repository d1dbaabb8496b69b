"""What the server did during a run, from the gateway's `server.sampled` events (docs/server.md)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import ServerSampled, decode_event
from usage_ledger.ledger.schema import events
from usage_ledger.projections.reconcile import Reconciliation, WindowCheck, counter_deltas

__all__ = ("ServerBlock", "SpecBlocks", "load_samples", "samples_of_run", "server_block")

_COUNTER_SOURCE = "vllm counter deltas over the run window ({} samples)"
_RECONCILE_SOURCE = "vllm counter deltas over the reconciliation window, between idle samples ({} samples)"
_GAUGE_SOURCE = "vllm gauges in {} samples inside the run window"
_BLOCKS_SOURCE = "vllm per-request speculative_decoding blocks summed over {} calls"
_SPEC_FIELDS = ("spec_decode_acceptance_rate", "spec_decode_mean_acceptance_length")


class SpecBlocks(msgspec.Struct, frozen=True, kw_only=True):
    """The per-request speculative-decoding counters summed over a run's completed calls, all of which had them."""

    calls: int
    draft_tokens: int
    accepted_tokens: int
    steps: int


class ServerBlock(msgspec.Struct, frozen=True, kw_only=True):
    """Every field is always present in the JSON; None where its source had nothing (`sources` says which)."""

    spec_decode_acceptance_rate: float | None = None
    spec_decode_mean_acceptance_length: float | None = None
    kv_cache_usage_max: float | None = None
    requests_running_mean: float | None = None
    requests_running_max: float | None = None
    requests_waiting_max: float | None = None
    preemptions: int | None = None
    prefix_cache_hit_rate: float | None = None
    server_prompt_tokens: int | None = None
    server_generation_tokens: int | None = None
    server_requests: int | None = None
    reconciled: bool | None = None
    """None when the reconciliation window has no idle sample on one side, or the server restarted inside it."""
    difference: Reconciliation | None = None
    reconciled_with: list[str] = []
    """The other runs in the reconciliation window (sent back to back with this one): checked together."""
    reconcile_note: str | None = None
    """Why `reconciled` is None, when the reconciliation window says."""
    reconcile_window_start: datetime | None = None
    reconcile_window_end: datetime | None = None
    restarts: int = 0
    config: dict[str, str] | None = None
    samples: int = 0
    window_start: datetime | None = None
    window_end: datetime | None = None
    sources: dict[str, str] = {}


async def load_samples(conn: AsyncConnection) -> list[ServerSampled]:
    """Every `server.sampled` event, oldest first (a few thousand a day at the default 10 s)."""
    query = select(events.c.payload).where(events.c.type == "server.sampled").order_by(events.c.position)
    found = [decode_event(payload) for (payload,) in (await conn.execute(query)).all()]
    return sorted((e for e in found if isinstance(e, ServerSampled)), key=lambda e: e.sampled_at)


def samples_of_run(samples: Sequence[ServerSampled], run: str) -> list[ServerSampled]:
    """The samples of the upstream the run went to: the one whose sample its first call triggered
    (or the only upstream sampled); none when that cannot be told."""
    upstreams = {s.upstream for s in samples if s.run == run} or {s.upstream for s in samples}
    if len(upstreams) != 1:
        return []
    (upstream,) = upstreams
    return [s for s in samples if s.upstream == upstream]


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _count(value: float | None) -> int | None:
    return None if value is None else round(value)


def _mean_length(accepted: float | None, drafts: float | None) -> float | None:
    """vLLM's mean acceptance length: the tokens a step yields, its own plus the accepted drafts."""
    return 1 + accepted / drafts if accepted is not None and drafts else None


def _window(
    samples: Sequence[ServerSampled], started_at: datetime | None, ended_at: datetime | None
) -> tuple[list[ServerSampled], list[ServerSampled], bool]:
    """(window, the samples inside it, whether a sample brackets it on both sides); an empty window
    when no sample brackets or falls inside the run."""
    if started_at is None:
        return [], [], False
    end = ended_at or started_at
    before = [s for s in samples if s.sampled_at <= started_at]
    after = [s for s in samples if (s.requested_at or s.sampled_at) >= end]
    inside = [s for s in samples if started_at < s.sampled_at and (s.requested_at or s.sampled_at) < end]
    bracketed = bool(before and after)
    if not inside and not bracketed:
        return [], [], False
    return before[-1:] + inside + after[:1], inside, bracketed


def _blocks_only(spec: SpecBlocks) -> ServerBlock:
    """A run with per-request blocks but no sample around it: their two figures, nothing else."""
    return ServerBlock(
        spec_decode_acceptance_rate=_ratio(spec.accepted_tokens, spec.draft_tokens),
        spec_decode_mean_acceptance_length=_mean_length(spec.accepted_tokens, spec.steps),
        sources=dict.fromkeys(_SPEC_FIELDS, _BLOCKS_SOURCE.format(spec.calls)),
    )


def server_block(
    samples: Sequence[ServerSampled],
    started_at: datetime | None,
    ended_at: datetime | None,
    *,
    check: WindowCheck | None,
    spec_blocks: SpecBlocks | None = None,
) -> ServerBlock | None:
    """The run's block; None when no sample brackets or falls inside its window and no per-request blocks exist.

    `check` is the run's reconciliation window (`ServerTraffic.check`): the server's requests and tokens,
    and whether they equal the ledger's, are its. With `spec_blocks` the two speculative-decoding figures
    are theirs, whatever the samples say.
    """
    window, inside, bracketed = _window(samples, started_at, ended_at)
    if not window:
        return _blocks_only(spec_blocks) if spec_blocks is not None else None
    deltas, restarts = counter_deltas(window) if bracketed else ({}, 0)

    def delta(name: str) -> float | None:
        return deltas.get(name) if bracketed and name in window[-1].counters else None

    drafts = delta("vllm:spec_decode_num_drafts_total")
    draft_tokens = delta("vllm:spec_decode_num_draft_tokens_total")
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    queries = delta("vllm:prefix_cache_queries_total")
    gauges = inside or window
    running = [s.gauges["vllm:num_requests_running"] for s in gauges if "vllm:num_requests_running" in s.gauges]
    kv = [s.gauges["vllm:kv_cache_usage_perc"] for s in gauges if "vllm:kv_cache_usage_perc" in s.gauges]
    waiting = [s.gauges["vllm:num_requests_waiting"] for s in gauges if "vllm:num_requests_waiting" in s.gauges]
    check = check or WindowCheck(problem="no server sample around the run")
    configs = [s.config for s in samples if s.config is not None and s.sampled_at <= window[-1].sampled_at]
    counter_source = _COUNTER_SOURCE.format(len(window))
    reconcile_source = _RECONCILE_SOURCE.format(check.samples)
    gauge_source = _GAUGE_SOURCE.format(len(gauges))
    spec_source = counter_source
    if spec_blocks is not None:
        spec_source = _BLOCKS_SOURCE.format(spec_blocks.calls)
        accepted, draft_tokens, drafts = spec_blocks.accepted_tokens, spec_blocks.draft_tokens, spec_blocks.steps
    return ServerBlock(
        spec_decode_acceptance_rate=_ratio(accepted, draft_tokens),
        spec_decode_mean_acceptance_length=_mean_length(accepted, drafts),
        kv_cache_usage_max=max(kv) if kv else None,
        requests_running_mean=sum(running) / len(running) if running else None,
        requests_running_max=max(running) if running else None,
        requests_waiting_max=max(waiting) if waiting else None,
        preemptions=_count(delta("vllm:num_preemptions_total")),
        prefix_cache_hit_rate=_ratio(delta("vllm:prefix_cache_hits_total"), queries),
        server_prompt_tokens=check.server_prompt_tokens,
        server_generation_tokens=check.server_generation_tokens,
        server_requests=check.server_requests,
        reconciled=check.reconciled,
        difference=check.difference,
        reconciled_with=check.shared_with,
        reconcile_note=check.problem,
        reconcile_window_start=check.window_start,
        reconcile_window_end=check.window_end,
        restarts=restarts,
        config=configs[-1] if configs else None,
        samples=len(window),
        window_start=window[0].sampled_at,
        window_end=window[-1].sampled_at,
        sources={
            "spec_decode_acceptance_rate": spec_source,
            "spec_decode_mean_acceptance_length": spec_source,
            "preemptions": counter_source,
            "prefix_cache_hit_rate": counter_source,
            "server_prompt_tokens": reconcile_source,
            "server_generation_tokens": reconcile_source,
            "server_requests": reconcile_source,
            "kv_cache_usage_max": gauge_source,
            "requests_running_mean": gauge_source,
            "requests_running_max": gauge_source,
            "requests_waiting_max": gauge_source,
            "config": "vllm:cache_config_info labels, last seen by the end of the window",
        },
    )

"""vLLM's per-request `metrics` block (`--enable-per-request-metrics`, `--per-request-spec-decode-metrics`).

Built as vLLM 0.32's `build_per_request_timing_metrics` / `build_spec_decoding_metrics` do; where the block
goes and which keys it has: docs/emulator.md.
"""

from __future__ import annotations

from typing import Any

import msgspec

from usage_ledger.emulator.config import EmulatorConfig
from usage_ledger.emulator.scheduler import Sequence

__all__ = (
    "PerRequestMetrics",
    "SpeculativeDecodingMetrics",
    "exclude_none",
    "per_request_metrics",
    "timing_metrics",
)


class SpeculativeDecodingMetrics(msgspec.Struct, kw_only=True):
    mean_acceptance_length: float
    draft_acceptance_rate: float
    acceptance_histogram: list[int]
    num_spec_steps: int
    num_accepted_draft_tokens: int
    num_draft_tokens: int
    num_spec_tokens: int
    per_step_accepted: list[int] | None = None
    per_step_drafted: list[int] | None = None


class PerRequestMetrics(msgspec.Struct, kw_only=True):
    time_to_first_token_ms: float | None = None
    generation_time_ms: float | None = None
    queue_time_ms: float | None = None
    mean_itl_ms: float | None = None
    tokens_per_second: float | None = None
    speculative_decoding: SpeculativeDecodingMetrics | None = None


def timing_metrics(seq: Sequence) -> PerRequestMetrics:
    """The timing part, from the sequence's emulated timestamps (seconds -> ms)."""
    queued, scheduled, first, last = seq.arrival, seq.scheduled_at, seq.first_token_at, seq.finished_at
    n = seq.generated
    ttft = gen = queue = itl = tps = None
    if scheduled is not None and first is not None:
        ttft = (first - scheduled) * 1000.0
    if first is not None and last is not None:
        gen = (last - first) * 1000.0
        if n > 1:
            itl = (last - first) / (n - 1) * 1000.0
    if scheduled is not None:
        queue = (scheduled - queued) * 1000.0
        if last is not None and last > scheduled:
            tps = n / (last - scheduled)
    return PerRequestMetrics(
        time_to_first_token_ms=ttft, generation_time_ms=gen, queue_time_ms=queue, mean_itl_ms=itl, tokens_per_second=tps
    )


def _spec_decoding(config: EmulatorConfig, seq: Sequence) -> SpeculativeDecodingMetrics | None:
    hist = seq.spec_hist
    if hist is None:
        return None
    steps = sum(hist)
    accepted = sum(j * count for j, count in enumerate(hist))
    return SpeculativeDecodingMetrics(
        mean_acceptance_length=1.0 + accepted / steps if steps else 1.0,
        draft_acceptance_rate=accepted / seq.spec_drafted if seq.spec_drafted else 0.0,
        acceptance_histogram=list(hist),
        num_spec_steps=steps,
        num_accepted_draft_tokens=accepted,
        num_draft_tokens=seq.spec_drafted,
        num_spec_tokens=config.spec_tokens,
        # vLLM's to_dict leaves the arrays out while they are empty (no verify step yet)
        per_step_accepted=list(seq.per_step_accepted) if seq.per_step_accepted else None,
        per_step_drafted=list(seq.per_step_drafted) if seq.per_step_drafted else None,
    )


def per_request_metrics(
    config: EmulatorConfig, seq: Sequence, *, spec_decoding: bool = True
) -> PerRequestMetrics | None:
    """The `metrics` block of a finished sequence, or None when no flag asks for one."""
    metrics = timing_metrics(seq) if config.enable_per_request_metrics else None
    spec = _spec_decoding(config, seq) if spec_decoding else None
    if spec is not None:
        metrics = metrics or PerRequestMetrics()
        metrics.speculative_decoding = spec
    return metrics


def exclude_none(value: Any) -> Any:
    """pydantic's `exclude_none` on builtins: object members that are null are dropped (lists kept)."""
    if isinstance(value, dict):
        return {k: exclude_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [exclude_none(v) for v in value]
    return value

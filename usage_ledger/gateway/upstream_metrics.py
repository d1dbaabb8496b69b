"""Picking what a run report needs out of vLLM's Prometheus `/metrics` text.

Parsed with `prometheus_client`'s parser. Counters are summed over their label sets (engines,
`finished_reason`, …) and kept under their sample names (`vllm:prompt_tokens_total`); the
running and waiting gauges are summed over engines, the KV-cache usage is the fullest engine's.
`vllm:cache_config_info`'s labels are the server's cache config (the first engine's).
"""

from __future__ import annotations

import math

import msgspec
from prometheus_client.parser import text_string_to_metric_families

__all__ = ("COUNTERS", "MetricsUnreadable", "UpstreamMetrics", "parse_metrics")

COUNTERS = (
    "vllm:request_success_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)
_SUMMED_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
_MAX_GAUGES = ("vllm:kv_cache_usage_perc",)
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_CONFIG = "vllm:cache_config_info"
_MAX_POSITIONS = 64  # draft positions kept; vLLM drafts a handful


class MetricsUnreadable(ValueError):
    """The text is not Prometheus exposition format, or has no vLLM metrics at all."""


class UpstreamMetrics(msgspec.Struct, frozen=True, kw_only=True):
    counters: dict[str, float]
    gauges: dict[str, float]
    accepted_per_pos: list[float]
    config: dict[str, str] | None


def parse_metrics(text: str) -> UpstreamMetrics:
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    config: dict[str, str] | None = None
    seen_vllm = False
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name, value = sample.name, float(sample.value)
                seen_vllm = seen_vllm or name.startswith("vllm:")
                if not math.isfinite(value):
                    continue
                if name in COUNTERS:
                    counters[name] = counters.get(name, 0.0) + value
                elif name in _SUMMED_GAUGES:
                    gauges[name] = gauges.get(name, 0.0) + value
                elif name in _MAX_GAUGES:
                    gauges[name] = max(gauges.get(name, value), value)
                elif name == _PER_POS:
                    position = sample.labels.get("position", "")
                    if position.isdigit() and int(position) < _MAX_POSITIONS:
                        per_pos[int(position)] = per_pos.get(int(position), 0.0) + value
                elif name == _CONFIG and config is None and value == 1.0:
                    config = {k: v for k, v in sorted(sample.labels.items()) if k != "engine"}
    except (ValueError, TypeError, IndexError, KeyError) as exc:  # the parser's ways of saying "not Prometheus"
        raise MetricsUnreadable(f"not Prometheus text: {exc}") from exc
    if not seen_vllm:
        raise MetricsUnreadable("no vllm: metrics in the text")
    positions = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return UpstreamMetrics(counters=counters, gauges=gauges, accepted_per_pos=positions, config=config)

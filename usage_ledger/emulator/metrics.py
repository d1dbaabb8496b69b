"""vLLM's Prometheus metrics (names, labels, buckets), rendered as text exposition."""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from usage_ledger.emulator.scheduler import Scheduler

__all__ = ("Histogram", "Metrics")

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip

_WAITING_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
    "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
    "Sum of all reasons equals vllm:num_requests_waiting."
)


class Histogram:
    __slots__ = ("bounds", "counts", "n", "total")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.n += times


def _num(value: float) -> str:
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    """Label pairs in name order, as vLLM 0.32's exposition writes them (`engine`, `le`, `model_name`)."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))


class Metrics:
    """Counters, gauges and histograms, updated by the engine in emulated seconds.

    Rendered as prometheus_client's text format: a counter `x` is `# TYPE x_total counter` with
    `x_total` samples, and every counter and histogram has its `x_created` gauge (start time).
    """

    def __init__(self, model: str, spec_tokens: int, created: float, cache_config: dict[str, str]):
        self.model = model
        self.cache_config = cache_config
        self.created = created
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.spec_tokens = spec_tokens

    def render(self, sched: Scheduler) -> str:
        """The exposition page; queue, KV cache and spec-decode numbers are read off `sched`."""
        base = {"engine": "0", "model_name": self.model}
        labels = _labels(**base)
        created = _num(self.created)
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        def counter(name: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            metric(name + "_total", "counter", help_text)
            out.extend(f"{name}_total{{{lab}}} {_num(value)}" for lab, value in samples)
            metric(name + "_created", "gauge", help_text)
            out.extend(f"{name}_created{{{lab}}} {created}" for lab, _ in samples)

        metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
        out.append(f"vllm:num_requests_running{{{labels}}} {_num(len(sched.running))}")
        metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
        out.append(f"vllm:num_requests_waiting{{{labels}}} {_num(len(sched.waiting))}")
        metric("vllm:num_requests_waiting_by_reason", "gauge", _WAITING_BY_REASON_HELP)
        for reason, count in (("capacity", len(sched.waiting)), ("deferred", 0)):  # nothing defers here
            out.append(f"vllm:num_requests_waiting_by_reason{{{_labels(**base, reason=reason)}}} {_num(count)}")
        metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
        out.append(f"vllm:kv_cache_usage_perc{{{labels}}} {_num(sched.kv.usage)}")
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            [(labels, sched.prefix_cache_queries)],
        )
        counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            [(labels, sched.prefix_cache_hits)],
        )
        counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", [(labels, sched.preemptions)]
        )
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [(labels, self.prompt_tokens)])
        counter("vllm:generation_tokens", "Number of generation tokens processed.", [(labels, self.generation_tokens)])
        counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [(_labels(**base, finished_reason=reason), count) for reason, count in self.success.items()],
        )
        for name, hist, help_text in (
            ("vllm:time_to_first_token_seconds", self.ttft, "Histogram of time to first token in seconds."),
            ("vllm:inter_token_latency_seconds", self.itl, "Histogram of inter-token latency in seconds."),
            ("vllm:e2e_request_latency_seconds", self.e2e, "Histogram of e2e request latency in seconds."),
        ):
            metric(name, "histogram", help_text)
            cumulative = 0
            for bound, count in zip(hist.bounds, hist.counts, strict=False):
                cumulative += count
                out.append(f"{name}_bucket{{{_labels(**base, le=str(bound))}}} {_num(cumulative)}")
            out.append(f"{name}_bucket{{{_labels(**base, le='+Inf')}}} {_num(hist.n)}")
            out.append(f"{name}_count{{{labels}}} {_num(hist.n)}")
            out.append(f"{name}_sum{{{labels}}} {_num(hist.total)}")
            metric(name + "_created", "gauge", help_text)
            out.append(f"{name}_created{{{labels}}} {created}")
        if self.spec_tokens:
            counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [(labels, sched.drafts)])
            counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [(labels, sched.draft_tokens)])
            counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", [(labels, sched.accepted_tokens)]
            )
            counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                [(_labels(**base, position=str(pos)), count) for pos, count in enumerate(sched.accepted_per_pos)],
            )
        metric("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
        # vLLM labels it with the engine only, no model_name
        out.append(f"vllm:cache_config_info{{{_labels(**self.cache_config, engine='0')}}} 1.0")
        return "\n".join(out) + "\n"

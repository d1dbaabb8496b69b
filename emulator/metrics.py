"""vLLM's Prometheus metrics (names, labels, buckets), rendered as text exposition."""

from __future__ import annotations

from bisect import bisect_left

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


class Metrics:
    """Counters, gauges and histograms, updated by the engine in emulated seconds."""

    def __init__(self, model: str, spec_tokens: int):
        self.model = model
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.spec_tokens = spec_tokens

    def render(
        self, *, running: int, waiting: int, drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]
    ) -> str:
        labels = f'engine="0",model_name="{self.model}"'
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
        out.append(f"vllm:num_requests_running{{{labels}}} {_num(running)}")
        metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
        out.append(f"vllm:num_requests_waiting{{{labels}}} {_num(waiting)}")
        metric("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.")
        out.append(f"vllm:prompt_tokens_total{{{labels}}} {_num(self.prompt_tokens)}")
        metric("vllm:generation_tokens", "counter", "Number of generation tokens processed.")
        out.append(f"vllm:generation_tokens_total{{{labels}}} {_num(self.generation_tokens)}")
        metric("vllm:request_success", "counter", "Count of successfully processed requests.")
        for reason, count in self.success.items():
            out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {_num(count)}')
        for name, hist, help_text in (
            ("vllm:time_to_first_token_seconds", self.ttft, "Histogram of time to first token in seconds."),
            ("vllm:inter_token_latency_seconds", self.itl, "Histogram of inter-token latency in seconds."),
            ("vllm:e2e_request_latency_seconds", self.e2e, "Histogram of e2e request latency in seconds."),
        ):
            metric(name, "histogram", help_text)
            cumulative = 0
            for bound, count in zip(hist.bounds, hist.counts, strict=False):
                cumulative += count
                out.append(f'{name}_bucket{{{labels},le="{bound}"}} {_num(cumulative)}')
            out.append(f'{name}_bucket{{{labels},le="+Inf"}} {_num(hist.n)}')
            out.append(f"{name}_count{{{labels}}} {_num(hist.n)}")
            out.append(f"{name}_sum{{{labels}}} {_num(hist.total)}")
        if self.spec_tokens:
            metric("vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts.")
            out.append(f"vllm:spec_decode_num_drafts_total{{{labels}}} {_num(drafts)}")
            metric("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens.")
            out.append(f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {_num(draft_tokens)}")
            metric("vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.")
            out.append(f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {_num(accepted)}")
            metric("vllm:spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted tokens per draft position.")
            for pos, count in enumerate(per_pos):
                out.append(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{pos}"}} {_num(count)}'
                )
        return "\n".join(out) + "\n"

"""The continuous-batching timing model: a pure, synchronous scheduler (no clock, no I/O).

Each step: decoding sequences first (1 + spec_tokens budget tokens each), then chunks of
partially prefilled prompts, then waiting requests admitted while fewer than `max_num_seqs`
run and the token budget lasts. A sequence whose prefill completes in a step emits its first
token at the end of that step; a decoding sequence emits 1 + accepted draft tokens, where each
draft position is accepted with probability `r` given the previous one was (so the overall
acceptance per drafted token equals `acceptance_rate`). A pooling sequence (embeddings: no
output tokens) is done when its prefill completes and emits no token.

KV cache (`emulator.kv_cache`): every planned sequence first reserves its step's blocks; when the pool is
short it preempts as vLLM's recompute mode does (docs/emulator.md, `vllm:num_preemptions_total`).
Per-request spec-decode counters only count: the draws and the timing are the same with them on or off.
"""

from __future__ import annotations

import contextlib
import random
from collections import deque
from typing import Any

from usage_ledger.emulator.config import EmulatorConfig
from usage_ledger.emulator.kv_cache import KVBlockPool

__all__ = ("Scheduler", "Sequence", "StepPlan", "conditional_acceptance")


class Sequence:
    """One request inside the engine. Times are emulated epoch seconds."""

    __slots__ = (
        "aborted",
        "arrival",
        "blocks",
        "computed",
        "done",
        "finish_reason",
        "finished_at",
        "first_token_at",
        "generated",
        "output_tokens",
        "pending",
        "per_step_accepted",
        "per_step_drafted",
        "preemptions",
        "prefill_len",
        "prompt_tokens",
        "request_id",
        "scheduled_at",
        "skip_prefix_cache",
        "spec_drafted",
        "spec_hist",
        "waiter",
    )

    def __init__(
        self,
        request_id: str,
        prompt_tokens: int,
        output_tokens: int,
        finish_reason: str,
        arrival: float,
        *,
        skip_prefix_cache: bool = False,
    ):
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.finish_reason = finish_reason
        self.arrival = arrival
        self.computed = 0  # tokens prefilled since (re)admission
        self.prefill_len = prompt_tokens  # after a preemption: prompt + the tokens generated so far
        self.generated = 0
        self.skip_prefix_cache = skip_prefix_cache  # vLLM skips the lookup for prompt logprobs
        self.blocks = 0  # KV blocks held
        self.preemptions = 0
        self.scheduled_at: float | None = None  # start of the first step that computed it
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.done = False
        self.aborted = False
        self.pending: list[int] = []  # tokens emitted per step, not yet delivered to the client
        self.waiter: Any = None  # the asyncio future the request handler sleeps on
        # per-request spec-decode counters (None unless per_request_spec_decode_metrics is on)
        self.spec_hist: list[int] | None = None  # verify steps by accepted drafts, len spec_tokens + 1
        self.spec_drafted = 0
        self.per_step_accepted: list[int] | None = None  # `detailed` only
        self.per_step_drafted: list[int] | None = None


class StepPlan:
    """What one step computes and how long it takes (emulated seconds)."""

    __slots__ = ("decodes", "dt", "prefills")

    def __init__(self, dt: float, decodes: list[Sequence], prefills: list[tuple[Sequence, int]]):
        self.dt = dt
        self.decodes = decodes
        self.prefills = prefills


def conditional_acceptance(rate: float, k: int) -> float:
    """Per-position conditional acceptance r with (r + r^2 + ... + r^k) / k == rate."""
    if k <= 0 or rate <= 0.0:
        return 0.0
    if rate >= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, k + 1)) / k < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class Scheduler:
    """Waiting queue + running batch; `schedule()` plans a step, `complete()` applies it."""

    def __init__(self, config: EmulatorConfig):
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._r = conditional_acceptance(config.acceptance_rate, config.spec_tokens)
        self._rng = random.Random(config.seed)
        # Speculative-decoding counters (vLLM's spec_decode_* metrics).
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_per_pos = [0] * config.spec_tokens
        self.kv = KVBlockPool(config.num_gpu_blocks, config.kv_block_size)
        self.preemptions = 0
        self.prefix_cache_queries = 0  # prompt tokens looked up (prefix caching on only)
        self.prefix_cache_hits = 0  # the emulator never finds a cached prefix
        level = config.per_request_spec_decode_metrics
        self._track_spec = level != "none" and config.spec_tokens > 0
        self._track_steps = self._track_spec and level == "detailed"

    def add(self, seq: Sequence) -> None:
        if self._track_spec and seq.output_tokens:
            seq.spec_hist = [0] * (self.config.spec_tokens + 1)
            if self._track_steps:
                seq.per_step_accepted = []
                seq.per_step_drafted = []
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop `seq` and free its slot (a no-op when it already finished)."""
        if seq.done:
            return
        seq.aborted = True
        seq.done = True
        if seq in self.running:
            self.running.remove(seq)
            self.kv.release(seq)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def schedule(self) -> StepPlan | None:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        k = cfg.spec_tokens
        per_decode = 1 + k
        decodes: list[Sequence] = []
        prefills: list[tuple[Sequence, int]] = []
        planned: set[Sequence] = set()
        preemptions = self.preemptions
        ctx = 0
        partial: list[Sequence] = []
        for seq in list(self.running):
            if seq not in self.running:
                continue  # preempted for an older sequence's blocks
            if seq.computed >= seq.prefill_len:
                # slots for the step's 1 + k tokens, never past the tokens it will have
                slots = min(seq.prompt_tokens + seq.generated + k, seq.prompt_tokens + seq.output_tokens)
                if budget >= per_decode and self._reserve(seq, slots, planned):
                    decodes.append(seq)
                    planned.add(seq)
                    budget -= per_decode
                    ctx += seq.prompt_tokens + seq.generated
            else:
                partial.append(seq)
        for seq in partial:
            if budget <= 0:
                break
            if seq not in self.running:
                continue
            chunk = min(seq.prefill_len - seq.computed, budget)
            if self._reserve(seq, seq.computed + chunk, planned):
                prefills.append((seq, chunk))
                planned.add(seq)
                budget -= chunk
        if self.preemptions == preemptions or not planned:
            self._admit(budget, prefills)
        if not decodes and not prefills:
            return None
        prefill_tokens = sum(chunk for _, chunk in prefills)
        dt = (
            cfg.step_base_s
            + cfg.step_per_seq_s * len(decodes)
            + cfg.step_per_ctx_token_s * ctx
            + cfg.prefill_per_token_s * prefill_tokens
        )
        return StepPlan(dt, decodes, prefills)

    def _reserve(self, seq: Sequence, tokens: int, planned: set[Sequence]) -> bool:
        """Blocks for `seq` to hold `tokens`, preempting the youngest unplanned sequences as needed."""
        while not self.kv.reserve(seq, tokens):
            victim = next(s for s in reversed(self.running) if s not in planned)  # `seq` itself at worst
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.release(seq)
        seq.computed = 0
        seq.prefill_len = seq.prompt_tokens + seq.generated
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def _admit(self, budget: int, prefills: list[tuple[Sequence, int]]) -> None:
        """Waiting sequences in order while a slot, token budget and blocks for the first chunk last."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            chunk = min(seq.prefill_len, budget)
            if not self.kv.reserve(seq, chunk):
                break  # vLLM's admission stops at the first request that does not fit
            self.waiting.popleft()
            self.running.append(seq)
            if self.config.enable_prefix_caching and not seq.skip_prefix_cache and not seq.preemptions:
                self.prefix_cache_queries += seq.prompt_tokens  # vLLM counts a resumed request's apart
            prefills.append((seq, chunk))
            budget -= chunk

    def complete(self, plan: StepPlan, t_end: float) -> list[Sequence]:
        """Apply `plan` at emulated time `t_end`; returns the sequences that emitted tokens."""
        touched: list[Sequence] = []
        t_start = t_end - plan.dt
        for seq, chunk in plan.prefills:
            if seq.aborted:
                continue
            if seq.scheduled_at is None:
                seq.scheduled_at = t_start
            seq.computed += chunk
            if seq.computed >= seq.prefill_len:
                if seq.first_token_at is None:
                    seq.first_token_at = t_end
                self._emit(seq, 1, t_end)  # a pooling sequence emits none
                touched.append(seq)
        k = self.config.spec_tokens
        r = self._r
        rand = self._rng.random
        per_pos = self.accepted_per_pos
        accepted_total = 0
        n_drafted = 0
        for seq in plan.decodes:
            if seq.aborted:
                continue
            accepted = 0
            while accepted < k and rand() < r:
                per_pos[accepted] += 1
                accepted += 1
            accepted_total += accepted
            n_drafted += 1
            hist = seq.spec_hist
            if hist is not None:
                hist[accepted] += 1
                seq.spec_drafted += k
                if seq.per_step_accepted is not None and seq.per_step_drafted is not None:
                    seq.per_step_accepted.append(accepted)
                    seq.per_step_drafted.append(k)
            self._emit(seq, 1 + accepted, t_end)
            touched.append(seq)
        if k:
            self.drafts += n_drafted
            self.draft_tokens += n_drafted * k
            self.accepted_tokens += accepted_total
        return touched

    def _emit(self, seq: Sequence, n: int, t_end: float) -> None:
        n = min(n, seq.output_tokens - seq.generated)
        seq.generated += n
        seq.pending.append(n)
        if seq.generated >= seq.output_tokens:
            seq.done = True
            seq.finished_at = t_end
            self.running.remove(seq)
            self.kv.release(seq)

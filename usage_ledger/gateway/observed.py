"""What a call's response said, noted as it passes: tokens and their moments, usage, finish reasons, metrics.

`Observed` is the one place that decides a call's usage and its provenance (`usage_and_source`),
for finished and failed calls alike, and that edits a stream the gateway asked usage of so the
client sees what it would have seen directly (`SseRelay.edits`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from usage_ledger.gateway.encoding import BodyDecoder, UnreadableBody
from usage_ledger.gateway.inspect import fingerprint_restorer
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.relay import SseRelay, cut_event
from usage_ledger.gateway.sse import SseEvent
from usage_ledger.gateway.usage import TOKEN_CHUNK, inspect_chunk, inspect_response
from usage_ledger.ledger import Usage, UsageSource, blob_hash, encode_chunk_gaps, usage_problem

__all__ = ("MAX_CHUNK_GAPS", "Observed")

_DONE = b"[DONE]"
MAX_CHUNK_GAPS = 65_536
"""The most inter-chunk gaps a call records (`CallFinished.chunk_gaps_blob`): at worst a blob of ≈ 400 KB (160 stored)."""


class Observed:
    """The response side of one call. `injected`: the gateway asked the upstream for usage."""

    def __init__(self, metrics: Metrics, *, injected: bool, on_forced_usage: Callable[[], bool]) -> None:
        self.metrics = metrics
        self.injected = injected
        self.on_forced_usage = on_forced_usage
        """Called when a stream shows the upstream forces usage; returns whether to believe it."""
        self.relay: SseRelay | None = None
        """The relay whose stream is edited, when the client must not see the usage chunk."""
        self.first_token_us: int | None = None
        self.last_token_us = 0
        """When the first and the last content chunk arrived, in integer microseconds since the epoch
        (the gaps are taken from them); `first_token` / `last_token` give them in seconds."""
        self.chunk_gaps_us: list[int] = []
        """Microseconds between successive content chunks' arrivals (the blob `CallFinished.chunk_gaps_blob` names)."""
        self.usage: Usage | None = None
        self.usage_final = False
        """The usage is the call's total (a body's, the usage-only chunk's, `response.completed`'s)."""
        self.usage_problem = ""
        self.usage_forced = False
        """The upstream sent usage unasked (it would have without the gateway's request too)."""
        self.deltas = 0
        """Content deltas seen (choices with generated text): the count of last resort."""
        self.reasons: list[str] = []
        self.reason_choices: list[int | None] = []
        """The choice index of each of `reasons`."""
        self.chunk_count = 0
        self.stream_error = False
        self.request_metrics: dict[str, Any] | None = None
        self.system_fingerprint: str | None = None
        self.request_id: str | None = None
        self.terminal_chunks: list[tuple[int, int]] = []
        """Spans of chunks with a finish reason, held while the usage chunk the gateway asked for may follow."""

    def usage_and_source(self, *, complete: bool, problem: str = "") -> tuple[Usage | None, UsageSource, str]:
        """The call's usage, where it came from and why; `complete`: the response ended normally.

        Usage with a count outside the plausibility rule (`ledger.counts`) is kept as received, as `implausible`.
        """
        usage, source, detail = self._usage_and_source(complete=complete, problem=problem)
        if usage is not None and (implausible := usage_problem(usage)):
            return usage, "implausible", f"{implausible} (usage {source}, kept as received)"
        return usage, source, detail

    def _usage_and_source(self, *, complete: bool, problem: str) -> tuple[Usage | None, UsageSource, str]:
        problem = self.usage_problem or problem
        if self.usage is not None and (complete or self.usage_final):
            return self.usage, "injected" if self.injected and not self.usage_forced else "reported", ""
        if self.usage is not None:
            return self.usage, "partial", "the stream ended early: usage as of the last chunk that carried it"
        if problem:
            return None, "unreadable", problem
        if not complete and self.deltas:
            counted = Usage(prompt_tokens=0, completion_tokens=self.deltas, total_tokens=self.deltas)
            return counted, "counted", "the stream ended early without usage: content deltas counted"
        return None, "absent", ""

    @property
    def first_token(self) -> float | None:
        """When the first content chunk arrived (epoch seconds); None before one did."""
        return None if self.first_token_us is None else self.first_token_us / 1_000_000

    @property
    def last_token(self) -> float | None:
        """When the last content chunk so far arrived (epoch seconds); None before one did."""
        return None if self.first_token_us is None else self.last_token_us / 1_000_000

    def gaps_blob(self) -> tuple[str | None, bytes | None]:
        """The chunk gaps as a blob: its hash and bytes, stored with the final event; (None, None) when
        there are none (fewer than two content chunks)."""
        if not self.chunk_gaps_us:
            return None, None
        data = encode_chunk_gaps(self.chunk_gaps_us)
        return blob_hash(data), data

    def body(self, body: bytes, decoder: BodyDecoder | None) -> None:
        """A whole (non-SSE) response body: usage, finish reasons, metrics; decoded first if compressed."""
        if decoder is not None:
            try:
                body = decoder.feed(body)
            except UnreadableBody as exc:
                self.usage_problem = str(exc)
                return
        described = inspect_response(body)
        self.usage = described.usage
        self.usage_final = described.usage is not None
        self.usage_problem = described.usage_problem
        self.reasons = list(described.finish_reasons)
        self.reason_choices = list(described.finish_choices)
        self.request_metrics = described.metrics
        self.system_fingerprint = described.system_fingerprint
        self.request_id = described.request_id

    def events(self, events: list[SseEvent]) -> int | None:
        """Note what one read's events say; returns the stream offset of the end marker among them.

        One clock reading per read: tokens that arrive together share a moment, so a stream that came
        in one read has no decode interval (and no made-up rate). The reading is taken in whole
        microseconds, so the chunk gaps add up exactly to `last_token - first_token` as recorded.
        """
        done: int | None = None
        now_us = time.time_ns() // 1000
        relay = self.relay
        gaps = self.chunk_gaps_us
        for event in events:
            data = event.data
            if data is None:
                continue
            if data == _DONE:
                if done is None:
                    done = event.start
                continue
            info = inspect_chunk(data)
            if info is TOKEN_CHUNK:  # nearly every event: one token, nothing else to note
                self.chunk_count += 1
                self.deltas += 1
                if self.first_token_us is None:
                    self.first_token_us = now_us
                elif len(gaps) < MAX_CHUNK_GAPS:
                    gaps.append(now_us - self.last_token_us)
                self.last_token_us = now_us
                continue
            cut = False
            if relay is not None and relay.cutting:
                if info.per_choice_usage and self.injected:
                    self._forced(relay)
                elif info.usage_only:
                    self._cut_usage_chunk(relay, event, info.system_fingerprint)
                    cut = True
                elif info.finish_reasons:
                    if relay.hold_from is None:  # until the usage chunk says what to put back
                        relay.hold_from = event.start
                    self.terminal_chunks.append((event.start, event.end))
            if not cut:
                self.chunk_count += 1
            if info.tokens:
                self.deltas += info.tokens
                if self.first_token_us is None:
                    self.first_token_us = now_us
                elif len(gaps) < MAX_CHUNK_GAPS:
                    gaps.append(now_us - self.last_token_us)
                self.last_token_us = now_us
            if info.usage is not None:
                self.usage = info.usage
                self.usage_final = info.usage_final
                self.usage_problem = ""
            elif info.usage_problem:
                self.usage_problem = info.usage_problem
            if info.finish_reasons:
                self.reasons.extend(info.finish_reasons)
                self.reason_choices.extend(info.finish_choices)
            if info.error:
                self.stream_error = True
            if info.metrics is not None:
                self.request_metrics = info.metrics
            if info.system_fingerprint is not None:
                self.system_fingerprint = info.system_fingerprint
            if info.terminal and done is None:
                done = event.start
        self.metrics.chunks += len(events)
        return done

    def _cut_usage_chunk(self, relay: SseRelay, event: SseEvent, fingerprint: str | None) -> None:
        """Leave out the usage chunk the client did not ask for, and put back what asking moved."""
        if fingerprint is not None:
            restore = fingerprint_restorer(fingerprint)
            relay.edits.extend((start, end, restore) for start, end in self.terminal_chunks)
        relay.edits.append((event.start, event.end, cut_event))
        self.terminal_chunks.clear()
        relay.hold_from = None

    def _forced(self, relay: SseRelay) -> None:
        """Usage on every chunk, unasked: the upstream forces usage (vLLM `--enable-force-include-usage`).

        The client would have received the usage chunk directly, so nothing is cut or held.
        """
        if not self.on_forced_usage():
            return
        self.usage_forced = True
        relay.cutting = False
        relay.hold_from = None
        self.terminal_chunks.clear()

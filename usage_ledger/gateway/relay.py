"""How upstream body bytes go to the client: as they come, edited only where needed, with the end held back.

    PlainRelay   any body: forwarded one chunk behind, so the last chunk waits for the call's record
    SseRelay     an SSE stream: forwarded as it comes; held from the stream's end marker on
                 (`data: [DONE]`, or the Responses API's closing event) until the call is recorded
                 (a stream framed by Content-Length: also its last byte, marker or not);
                 with `cutting`, whole events only, and edited: the usage-only chunk the gateway asked
                 for cut out, and what asking changed in other chunks put back (`gateway.observed`)

Both keep every upstream chunk in `raw` (the response blob). `feed` returns the bytes to send
now, `close` the bytes that wait for the record. A relay never reads the clock or the events'
meaning: `observe` (`gateway.observed.Observed.events`) does, and returns where the stream's end
marker starts. `plan_relay` picks the relay from the response headers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from usage_ledger.gateway.encoding import BodyDecoder, UnreadableBody
from usage_ledger.gateway.headers import Header, response_headers
from usage_ledger.gateway.sse import SseEvent, SseScanner

__all__ = ("Edit", "Observe", "PlainRelay", "RelayPlan", "SseRelay", "SseWatcher", "cut_event", "plan_relay")

Observe = Callable[[list[SseEvent]], int | None]
"""Note what the events say (and edit the relay's stream); return the stream offset of the end marker, if among them."""
Edit = tuple[int, int, Callable[[bytes], bytes]]
"""An event's span in the stream and how its bytes are rewritten on the way out."""


def cut_event(_event: bytes) -> bytes:
    """The rewrite that leaves an event out."""
    return b""


class PlainRelay:
    """A body forwarded one chunk behind. `watch`, if given, sees every chunk as it arrives."""

    __slots__ = ("held", "raw", "watch")

    def __init__(self, raw: list[bytes], watch: Callable[[bytes], None] | None = None) -> None:
        self.raw = raw
        self.held = b""
        self.watch = watch

    def feed(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        self.raw.append(chunk)
        if self.watch is not None:
            self.watch(chunk)
        out, self.held = self.held, chunk
        return out

    def close(self) -> bytes:
        return self.held


class SseWatcher:
    """An encoded stream's decoded copy, scanned for what it says (the bytes themselves go out as sent)."""

    __slots__ = ("decoder", "observe", "problem", "scanner")

    def __init__(self, decoder: BodyDecoder, observe: Observe) -> None:
        self.decoder = decoder
        self.observe = observe
        self.scanner = SseScanner()
        self.problem = ""

    def __call__(self, chunk: bytes) -> None:
        if self.problem:
            return
        try:
            data = self.decoder.feed(chunk)
        except UnreadableBody as exc:
            self.problem = str(exc)
            return
        events = self.scanner.feed(data)
        if events:
            self.observe(events)


class SseRelay:
    """SSE bytes forwarded as they come; held from the end marker on; edits applied (cuts and patches).

    With a `decoder` the relay works on the decoded stream (and sends it decoded): only used when a
    cut is needed in a compressed stream, where compressed bytes cannot be cut.
    """

    __slots__ = (
        "cutting",
        "decoder",
        "done_at",
        "edits",
        "hold_from",
        "last_byte",
        "observe",
        "pending",
        "problem",
        "raw",
        "scanner",
        "sent",
        "total",
    )

    def __init__(
        self,
        raw: list[bytes],
        observe: Observe,
        *,
        cutting: bool,
        decoder: BodyDecoder | None = None,
        length: int | None = None,
    ) -> None:
        self.raw = raw
        self.last_byte = None if length is None else max(length - 1, 0)
        """The stream offset of a Content-Length body's last byte: held, so the client cannot take the body
        for whole before the record, even without an end marker (garbage typed as an event stream)."""
        self.observe = observe
        self.cutting = cutting
        """Edit the stream (the usage-only chunk the client did not ask for); forward whole events only."""
        self.decoder = decoder
        self.problem = ""
        self.scanner = SseScanner()
        self.pending = b""  # stream bytes not yet sent, starting at stream offset `sent`
        self.sent = 0
        self.total = 0
        self.done_at: int | None = None
        self.hold_from: int | None = None
        """Hold bytes from this stream offset on until the observer releases them (sets None)."""
        self.edits: list[Edit] = []
        """Whole events rewritten, in stream order: (start, end, rewrite of the event's bytes)."""

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to send now."""
        if not chunk:
            return b""
        self.raw.append(chunk)
        if self.decoder is not None:
            try:
                chunk = self.decoder.feed(chunk)
            except UnreadableBody as exc:
                self.problem = str(exc)
                raise
            if not chunk:
                return b""
        self.total += len(chunk)
        events = self.scanner.feed(chunk)
        if events:
            done = self.observe(events)
            if done is not None and self.done_at is None:
                self.done_at = done
        limit = self.scanner.consumed if self.cutting else self.total
        if self.hold_from is not None:
            limit = min(limit, self.hold_from)
        if self.done_at is not None:
            limit = min(limit, self.done_at)
        if self.last_byte is not None:
            limit = min(limit, self.last_byte)
        edits = self.edits
        if not self.pending and limit == self.total and (not edits or edits[-1][1] <= self.sent):
            self.sent = self.total  # whole events, nothing held or edited: the chunk as it came
            return chunk
        self.pending += chunk
        if limit <= self.sent:
            return b""
        out = _edited(self.pending, self.sent, limit, edits)
        self.pending = self.pending[limit - self.sent :]
        self.sent = limit
        return out

    def close(self) -> bytes:
        """End of the upstream body: what is left to send (from the end marker on), edited."""
        closing = self.scanner.close()
        if closing:
            self.observe(closing)
        return _edited(self.pending, self.sent, self.total, self.edits)


def _edited(pending: bytes, start: int, stop: int, edits: list[Edit]) -> bytes:
    """Bytes [start, stop) of the stream (pending begins at `start`), with the edits inside it applied."""
    if not edits:
        return pending[: stop - start]
    out: list[bytes] = []
    pos = start
    for edit_start, edit_end, rewrite in edits:
        if edit_end <= pos or edit_start >= stop:
            continue
        if edit_start > pos:
            out.append(pending[pos - start : edit_start - start])
        out.append(rewrite(pending[edit_start - start : edit_end - start]))
        pos = max(pos, edit_end)
    if pos < stop:
        out.append(pending[pos - start : stop - start])
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class RelayPlan:
    relay: PlainRelay | SseRelay
    headers: list[Header]
    """The response headers for the client (hop-by-hop ones and what the relay changes left out)."""
    sse: SseRelay | None = None
    watcher: SseWatcher | None = None
    decoder: BodyDecoder | None = None
    unreadable: str = ""
    """Why nothing of the body can be read (an encoding that cannot be undone)."""
    request_id: str | None = None

    @property
    def stream(self) -> bool:
        """An SSE response (scanned as it passes, decoded or not)."""
        return self.sse is not None or self.watcher is not None

    @property
    def readable_body(self) -> bool:
        """A whole body to read once it has all arrived (not a stream, not an encoding that cannot be undone)."""
        return not self.stream and not self.unreadable

    @property
    def problem(self) -> str:
        """Why what the response says could not be read, if it could not."""
        return (
            self.unreadable or (self.watcher.problem if self.watcher else "") or (self.sse.problem if self.sse else "")
        )


def plan_relay(headers: Sequence[Header], raw: list[bytes], observe: Observe, *, inspect: bool, cut: bool) -> RelayPlan:
    """How a response goes to the client, from its headers. `inspect`: decode a compressed copy to read it;
    `cut`: the gateway asked this stream for usage, so the stream may need edits."""
    sse = False
    encoding = b""
    request_id = None
    length: int | None = None
    for name, value in headers:
        if name == b"content-type" and value.startswith(b"text/event-stream"):
            sse = True
        elif name == b"content-encoding":
            encoding = value
        elif name == b"x-request-id":
            request_id = value.decode("latin-1")
        elif name == b"content-length" and value.isdigit():
            length = int(value)
    decoder: BodyDecoder | None = None
    if inspect and encoding:
        try:
            decoder = BodyDecoder.for_encoding(encoding)
        except UnreadableBody as exc:  # nothing can be read: the bytes as they come
            return RelayPlan(PlainRelay(raw), response_headers(headers), unreadable=str(exc), request_id=request_id)
    if not sse:
        return RelayPlan(PlainRelay(raw), response_headers(headers), decoder=decoder, request_id=request_id)
    if decoder is None:
        relay = SseRelay(raw, observe, cutting=cut, length=None if cut else length)  # cut: the length is dropped
        kept = response_headers(headers, drop=[b"content-length"] if cut else [])
        return RelayPlan(relay, kept, sse=relay, request_id=request_id)
    if cut:
        # Compressed bytes cannot be cut: the client gets the decoded stream (its HTTP library would
        # have decoded it anyway), without the usage chunk it did not ask for.
        relay = SseRelay(raw, observe, cutting=True, decoder=decoder)
        kept = response_headers(headers, drop=[b"content-length", b"content-encoding"])
        return RelayPlan(relay, kept, sse=relay, decoder=decoder, request_id=request_id)
    watcher = SseWatcher(decoder, observe)
    return RelayPlan(PlainRelay(raw, watcher), response_headers(headers), watcher=watcher, request_id=request_id)

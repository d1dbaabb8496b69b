"""An incremental Server-Sent Events scanner: pure, no I/O, any split of the bytes gives the same events.

    scanner = SseScanner()
    for chunk in stream:
        for event in scanner.feed(chunk):   # complete events, with their byte span in the stream
            ...
    scanner.close()                         # a final event cut short is not dispatched (as browsers do)

Lines end with CRLF, LF or CR (the SSE grammar); an event ends at a blank line. Each event carries
`start`/`end` offsets into the whole stream, so a caller forwarding raw bytes can cut exactly one
event out (the injected usage chunk) or hold exactly one back (`data: [DONE]`).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ("SseEvent", "SseScanner")


class SseEvent(NamedTuple):
    """One dispatched event: `data` is its data lines joined by LF (None when it had no data field)."""

    start: int
    end: int
    data: bytes | None


_new_event = tuple.__new__  # builds an SseEvent without its Python-level __new__ (one frame less per event)


class SseScanner:
    __slots__ = ("_buf", "_buf_offset", "_data", "_event_start", "_pos")

    def __init__(self) -> None:
        self._buf = b""
        self._buf_offset = 0  # stream offset of _buf[0]
        self._pos = 0  # scan position within _buf (start of the next unread line)
        self._event_start = 0  # stream offset where the current event began
        self._data: list[bytes] | None = None

    @property
    def consumed(self) -> int:
        """Stream offset up to which every byte belongs to a dispatched (or skipped) event."""
        return self._event_start

    def feed(self, chunk: bytes) -> list[SseEvent]:
        events: list[SseEvent] = []
        if self._pos >= len(self._buf) and self._data is None:
            # Fast path, nearly every chunk of an LLM stream: whole one-line `data: ...` events with
            # nothing pending. One memchr for the line's end, one for a CR in it (a CR ends a line too).
            offset = self._buf_offset + len(self._buf)
            pos = 0
            n = len(chunk)
            while pos < n:
                lf = chunk.find(b"\n", pos)
                if (
                    lf < 0
                    or lf + 1 >= n
                    or chunk[lf + 1] != 0x0A
                    or not chunk.startswith(b"data: ", pos)
                    or chunk.find(b"\r", pos, lf) >= 0
                ):
                    break  # an incomplete event, another field, several lines, a CR: the general scan below
                stop = offset + lf + 2
                events.append(_new_event(SseEvent, (self._event_start, stop, chunk[pos + 6 : lf])))
                self._event_start = stop
                pos = lf + 2
            self._buf = b""
            self._buf_offset = offset + pos
            self._pos = 0
            if pos == n:
                return events
            if pos:
                chunk = chunk[pos:]
        buf = self._buf[self._pos :] + chunk if self._pos else self._buf + chunk
        self._buf_offset += self._pos
        self._pos = 0
        pos = 0
        n = len(buf)
        has_cr = b"\r" in buf
        while pos < n:
            if has_cr:
                lf = buf.find(b"\n", pos)
                cr = buf.find(b"\r", pos)
                if cr == -1 or (lf != -1 and lf < cr):
                    if lf == -1:
                        break
                    line_end, next_pos = lf, lf + 1
                else:
                    if cr + 1 >= n:
                        break  # a CR at the very end: wait to see whether LF follows
                    line_end = cr
                    next_pos = cr + 2 if buf[cr + 1] == 0x0A else cr + 1
            else:
                lf = buf.find(b"\n", pos)
                if lf == -1:
                    break
                line_end, next_pos = lf, lf + 1
            self._line(buf, pos, line_end, next_pos, events)
            pos = next_pos
        self._buf = buf
        self._pos = pos
        return events

    def close(self) -> list[SseEvent]:
        """End of stream: a trailing CR ends its line; an event without its blank line is dropped."""
        events: list[SseEvent] = []
        buf, pos = self._buf, self._pos
        if pos < len(buf) and buf.endswith(b"\r"):
            self._line(buf, pos, len(buf) - 1, len(buf), events)
            self._pos = len(buf)
        return events

    def _line(self, buf: bytes, start: int, end: int, next_pos: int, events: list[SseEvent]) -> None:
        if start == end:  # blank line: dispatch
            stop = self._buf_offset + next_pos
            data = self._data
            events.append(SseEvent(self._event_start, stop, None if data is None else b"\n".join(data)))
            self._event_start = stop
            self._data = None
            return
        if buf.startswith(b"data", start):
            after = start + 4
            if after == end:
                value = b""
            elif buf[after] == 0x3A:  # ':'
                value_start = after + 2 if after + 1 < end and buf[after + 1] == 0x20 else after + 1
                value = buf[value_start:end]
            else:
                return  # a field named e.g. "dataX": ignored
            if self._data is None:
                self._data = [value]
            else:
                self._data.append(value)

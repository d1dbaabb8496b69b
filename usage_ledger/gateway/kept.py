"""A response's bytes kept for its blob, within a per-call cap and a budget shared by all calls.

The client always receives every byte; what a body over the cap or the budget records is in docs/configuration.md
(`LEDGER_MAX_STORED_BODY_BYTES`). Of such a body only the last `TAIL_BYTES` are kept (decoded if it was
compressed), to read the usage a whole JSON body carries at its end; a stream's is read as it passes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import msgspec

from usage_ledger.gateway.encoding import BodyDecoder, UnreadableBody
from usage_ledger.gateway.headers import Header
from usage_ledger.gateway.limits import ByteBudget
from usage_ledger.gateway.usage import read_usage
from usage_ledger.ledger import Usage

__all__ = ("BUDGET_STEP", "TAIL_BYTES", "KeptBody", "usage_from_tail")

TAIL_BYTES = 64 * 1024
"""Of a body not stored, the last bytes kept to read its usage from."""
BUDGET_STEP = 64 * 1024
"""The shared budget is taken in steps of this size, not per chunk."""

OMITTED_TOO_LARGE = "too_large"
OMITTED_BUDGET_FULL = "budget_full"

_USAGE_KEY = re.compile(rb'"usage"\s*:\s*')


class KeptBody(list[bytes]):
    """The response chunks kept for the blob (a list, as the relays append to it), with what was dropped."""

    __slots__ = ("_tail_decoder", "budget", "cap", "held", "omitted", "size", "tail", "wants_tail")

    def __init__(self, budget: ByteBudget, cap: int) -> None:
        super().__init__()
        self.budget = budget
        self.cap = cap
        self.size = 0
        """Every body byte seen, kept or not."""
        self.held = 0
        """Bytes of `budget` held by this body."""
        self.omitted = ""
        """Why the body is not kept (`response_blob_omitted`); empty while it is."""
        self.wants_tail = False
        self.tail = b""
        self._tail_decoder: BodyDecoder | None = None

    def expect(self, headers: Sequence[Header], *, whole_json: bool, encoding: BodyDecoder | None) -> None:
        """The response's headers arrived: drop the body now if its length is over the cap; keep a tail of a
        whole body (`whole_json`) once dropped, decoded with a fresh copy of `encoding`'s decoder."""
        self.wants_tail = whole_json
        if whole_json and encoding is not None:
            self._tail_decoder = BodyDecoder.for_encoding(encoding.name.encode("latin-1"))
        for name, value in headers:
            if name == b"content-length" and value.isdigit() and int(value) > self.cap:
                self._omit(OMITTED_TOO_LARGE)

    def append(self, chunk: bytes) -> None:
        size = self.size = self.size + len(chunk)
        if not self.omitted and size > self.held:
            if size > self.cap:
                self._omit(OMITTED_TOO_LARGE)
            else:
                step = max(BUDGET_STEP, size - self.held)
                if self.budget.take(step):
                    self.held += step
                else:
                    self._omit(OMITTED_BUDGET_FULL)
        if self.omitted:
            if self.wants_tail:
                self._keep_tail(chunk)
            return
        super().append(chunk)

    def whole(self) -> bytes | None:
        """The kept body as one bytes object (joined once, then kept joined); None if empty or not kept."""
        if self.omitted or not self:
            return None
        if len(self) > 1:
            joined = b"".join(self)
            self.clear()
            super().append(joined)
        return self[0]

    def release(self) -> None:
        """The call is recorded: its share of the budget goes back (the bytes go with the call)."""
        if self.held:
            self.budget.give_back(self.held)
            self.held = 0

    def _omit(self, reason: str) -> None:
        self.omitted = reason
        kept = b"".join(self) if self.wants_tail else b""
        self.clear()
        self.release()
        if kept:
            self._keep_tail(kept)

    def _keep_tail(self, data: bytes) -> None:
        decoder = self._tail_decoder
        if decoder is not None:
            try:
                data = decoder.feed(data)
            except UnreadableBody:
                self._tail_decoder = None
                self.wants_tail = False  # the usage reader says the tail is missing
                self.tail = b""
                return
        tail = self.tail + data if len(data) < TAIL_BYTES else data
        self.tail = tail[-TAIL_BYTES:]


def usage_from_tail(tail: bytes) -> tuple[Usage | None, str]:
    """The usage of a whole JSON body from its last bytes: the value of its last `"usage"` member.

    Outside strings a `"` is never escaped, so a `"usage":` whose quote has no odd run of backslashes
    before it is a member name, not text (OpenAI and vLLM bodies end with their usage member).
    """
    found: re.Match[bytes] | None = None
    for match in _USAGE_KEY.finditer(tail):
        start = match.start()
        slashes = len(tail[:start]) - len(tail[:start].rstrip(b"\\"))
        if slashes % 2 == 0:
            found = match
    where = f"the body was not stored (over the stored-body limit); its last {len(tail)} bytes were read"
    if found is None:
        return None, f"{where} and hold no usage"
    try:
        value, _end = json.JSONDecoder().raw_decode(tail[found.end() :].decode("utf-8", "replace"))
    except ValueError:
        return None, f"{where} and their usage is not valid JSON"
    usage, problem = read_usage(msgspec.Raw(msgspec.json.encode(value)))
    return usage, f"{where}: {problem}" if problem else ""

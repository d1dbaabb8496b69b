"""The soak's clients: plain and streamed calls, upstream faults asked for per request, trickling and
disconnecting clients, header lines that never end, calls to encoded or ambiguous spellings of an inference path
(tests.gateway.spellings, sent byte for byte), and tricklers that reconnect whenever cut. Each call leaves a `Call`:
what its client saw, and when; each request carries an `x-soak-call` marker so the relay can say it saw it.

Upstream faults ride on request headers the gateway forwards: `X-Emulator-Fault` (the emulator's own
switches) and `x-soak-upstream` (tests.soak.relay).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import msgspec

from tests.gateway.spellings import SPELLINGS
from tests.reliability.helpers import Outcome, chat_body, raw_call
from tests.reliability.slow_clients import header_bomb, reopening_trickler

__all__ = ("RUN", "Call", "ClientMix", "reported_usage")

RUN = "soak"

# (kind, weight): what one client call does
_KINDS = (
    ("plain", 28),
    ("stream", 40),
    ("upstream", 17),
    ("disconnect", 8),
    ("trickle", 5),
    ("head-bomb", 2),
    ("spelling", 4),
    ("reopen-trickle", 1),
)
_REOPENING_S = (11.0, 14.0)  # reopening tricklers' span: past the 10 s grace of the minimum body rate
_REOPENING = 3  # tricklers at a time in one such call
# upstream faults: (name, header, value, streamed?)
_UPSTREAM = (
    ("error-mid-stream", "X-Emulator-Fault", "error-mid-stream={n}", True),
    ("reset-mid-stream", "X-Emulator-Fault", "drop-mid-stream={n}", True),
    ("reset-mid-body", "X-Emulator-Fault", "drop-mid-stream", False),
    ("status-5xx", "X-Emulator-Fault", "status={status}", None),
    ("hang-before-headers", "X-Emulator-Fault", "slow-headers={hang}", None),
    ("garbage-head", "x-soak-upstream", "garbage-head", False),
    ("garbage-body", "x-soak-upstream", "garbage-body", False),
    ("reset-before-headers", "x-soak-upstream", "reset", None),
    ("hang-mid-stream", "x-soak-upstream", "hang-mid", True),
    ("endless-head", "x-soak-upstream", "endless-head", None),
)


@dataclass
class Call:
    kind: str
    outcome: Outcome
    began: float  # time.time() at the request
    ended: float
    spelling: str | None = None  # a spelled call's `x-soak-call` marker


def reported_usage(body: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens the upstream reported in a body the client got whole, if any."""
    try:
        if body.lstrip().startswith(b"{"):
            usage = msgspec.json.decode(body).get("usage")
        else:
            usage = None
            for line in body.split(b"\n"):
                if line.startswith(b"data: {"):
                    usage = msgspec.json.decode(line[6:]).get("usage") or usage
    except (msgspec.DecodeError, AttributeError):
        return None
    if not isinstance(usage, dict):
        return None
    return int(usage["prompt_tokens"]), int(usage["completion_tokens"])


async def _trickled(body: bytes, rng: random.Random) -> AsyncIterator[bytes]:
    step = max(1, len(body) // rng.randint(5, 30))
    for start in range(0, len(body), step):
        yield body[start : start + step]
        await asyncio.sleep(rng.uniform(0.02, 0.2))


class ClientMix:
    """Draws each call's kind from a seeded RNG and runs it against `url`."""

    def __init__(self, url: str, upstream_hang_s: float) -> None:
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        self.upstream_hang_s = upstream_hang_s

    async def call(self, http: httpx.AsyncClient, rng: random.Random, n: int) -> Call:
        kind = rng.choices([k for k, _ in _KINDS], [w for _, w in _KINDS])[0]
        began = time.time()
        headers = {"X-Ledger-Run": RUN, "x-soak-call": f"call-{n}"}  # the relay notes each call that reaches it
        if kind in ("plain", "stream"):
            body = chat_body(f"soak {n}", max_tokens=rng.randint(1, 150), stream=kind == "stream")
            outcome = await raw_call(http, self.url, body, {**headers, "X-Ledger-Ticker": kind})
        elif kind == "upstream":
            kind, outcome = await self._upstream(http, rng, n, headers)
        elif kind == "disconnect":
            outcome = await self._disconnect(http, rng, n, headers)
        elif kind == "head-bomb":
            outcome = await self._head_bomb()
        elif kind == "spelling":
            marker = f"spelled-{n}"  # its own head: `_spelled` sends it as `x-soak-call`
            outcome = await self._spelled(rng, marker)
            return Call(kind=kind, outcome=outcome, began=began, ended=time.time(), spelling=marker)
        elif kind == "reopen-trickle":
            outcome = await self._reopening(rng)
        else:
            outcome = await self._trickle(http, rng, n, headers)
        return Call(kind=kind, outcome=outcome, began=began, ended=time.time())

    async def _upstream(
        self, http: httpx.AsyncClient, rng: random.Random, n: int, headers: dict[str, str]
    ) -> tuple[str, Outcome]:
        name, header, value, streamed = rng.choice(_UPSTREAM)
        stream = rng.random() < 0.5 if streamed is None else streamed
        value = value.format(n=rng.randint(0, 8), status=rng.choice([500, 502, 503]), hang=self.upstream_hang_s)
        body = chat_body(f"soak {n} {name}", max_tokens=rng.randint(10, 60), stream=stream)
        outcome = await raw_call(http, self.url, body, {**headers, "X-Ledger-Ticker": name, header: value})
        return f"upstream:{name}", outcome

    async def _disconnect(
        self, http: httpx.AsyncClient, rng: random.Random, n: int, headers: dict[str, str]
    ) -> Outcome:
        """A stream the client walks away from after a few reads (0: right after the headers)."""
        body = chat_body(f"soak {n} leaves", max_tokens=2000, stream=True, min_tokens=2000)
        reads = rng.randint(0, 20)
        outcome = Outcome(error="disconnected by the client")
        try:
            async with http.stream(
                "POST", self.url + "/v1/chat/completions", content=body, headers={**headers, "X-Ledger-Ticker": "leave"}
            ) as response:
                outcome.status = response.status_code
                outcome.call_id = response.headers.get("x-ledger-call-id")
                async for chunk in response.aiter_raw():
                    outcome.body += chunk
                    reads -= 1
                    if reads < 0:
                        break
        except httpx.HTTPError as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"
        return outcome

    async def _head_bomb(self) -> Outcome:
        """A request head with one header line that never ends, on a raw socket: answered 431 at the head cap."""
        try:
            answer = await header_bomb(self.port, give_up_s=60)
        except OSError as exc:  # the gateway is restarting
            return Outcome(error=f"{type(exc).__name__}: {exc}")
        if answer == "open":  # never answered: a stuck client (`invariants`)
            return Outcome(error="ReadTimeout: a head that never ends was not answered in 60 s")
        return Outcome(status=int(answer) if answer.isdigit() else None, complete=answer.isdigit())

    async def _spelled(self, rng: random.Random, marker: str) -> Outcome:
        """A POST to one spelling of an inference path, the request target sent as is (httpx would normalise it)."""
        target = rng.choice(SPELLINGS)
        body = chat_body(f"soak {marker} {target.decode()}", max_tokens=rng.randint(1, 40), stream=False)
        head = (
            b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"x-ledger-run: %s\r\nx-ledger-ticker: spelling\r\nx-soak-call: %s\r\nconnection: close\r\n\r\n"
        ) % (target, len(body), RUN.encode(), marker.encode())
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError as exc:  # the gateway is restarting
            return Outcome(error=f"{type(exc).__name__}: {exc}")
        try:
            writer.write(head + body)
            async with asyncio.timeout(60):
                answer = await reader.read(-1)
        except TimeoutError:
            return Outcome(error=f"ReadTimeout: {target!r} was not answered in 60 s")
        except ConnectionError as exc:
            return Outcome(error=f"{type(exc).__name__}: {exc}")
        finally:
            writer.close()
        return _parsed(answer)

    async def _reopening(self, rng: random.Random) -> Outcome:
        """A few bodies trickled a byte every half second, each again on a new connection whenever the gateway cuts
        it (the minimum body rate, or room made at the connection cap)."""
        until = asyncio.get_running_loop().time() + rng.uniform(*_REOPENING_S)
        ends = sum(
            await asyncio.gather(*(reopening_trickler(self.port, 0.5, until) for _ in range(_REOPENING))), Counter()
        )
        return Outcome(body=msgspec.json.encode(dict(sorted(ends.items()))))

    async def _trickle(self, http: httpx.AsyncClient, rng: random.Random, n: int, headers: dict[str, str]) -> Outcome:
        """A request body sent in small pieces, and the response read slowly, in small reads."""
        stream = rng.random() < 0.5
        body = chat_body(
            f"soak {n} trickles " + "x" * rng.randint(0, 800), max_tokens=rng.randint(1, 80), stream=stream
        )
        sent = {**headers, "X-Ledger-Ticker": "trickle", "content-type": "application/json"}
        if rng.random() < 0.5:
            sent["content-length"] = str(len(body))  # else chunked
        outcome = Outcome()
        try:
            async with http.stream(
                "POST", self.url + "/v1/chat/completions", content=_trickled(body, rng), headers=sent
            ) as response:
                outcome.status = response.status_code
                outcome.call_id = response.headers.get("x-ledger-call-id")
                async for chunk in response.aiter_raw(chunk_size=512):
                    outcome.body += chunk
                    await asyncio.sleep(rng.uniform(0, 0.03))
            outcome.complete = outcome.body.rstrip().endswith(b"data: [DONE]") if stream else True
        except httpx.HTTPError as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"
        return outcome


def _parsed(answer: bytes) -> Outcome:
    """A whole HTTP/1.1 response read up to the close (Content-Length or chunked)."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if not sep or not lines[0].startswith(b"HTTP/1.") or len(parts) < 2 or not parts[1].isdigit():
        return Outcome(error="the answer was cut before its head ended" if answer else "closed without an answer")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    outcome = Outcome(status=int(parts[1]), call_id=(headers.get(b"x-ledger-call-id") or b"").decode() or None)
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        pieces, rest = [], body
        while True:
            size_line, sep, rest = rest.partition(b"\r\n")
            if not sep:
                outcome.error = "the chunked body was cut"
                return outcome
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            pieces.append(rest[:size])
            rest = rest[size + 2 :]
        body = b"".join(pieces)
    elif (length := headers.get(b"content-length")) is not None and len(body) != int(length):
        outcome.error = f"{len(body)} of {int(length)} body bytes"
        return outcome
    outcome.body = body
    outcome.complete = True
    return outcome

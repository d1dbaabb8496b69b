"""Slowing down admin-token guesses, one rule for every door (the dashboard's login form, `Authorization: Bearer`
on its JSON endpoints and on the gateway's admin API): per client, the first `FREE_GUESSES` wrong tokens cost
nothing, then each further one shuts the door to that client for twice as long as the one before (1 s, 2 s,
4 s … at most `MAX_LOCK_S`). While it is shut, a guess is answered 429 with `Retry-After` and the token is not
even compared, so a right guess cannot be told from a wrong one. A right token clears the client's count; a
client that stops guessing for `FORGET_S` is forgotten (300 guesses: about a day, docs/RELIABILITY.md).

A client is its address as the server sees it: behind a reverse proxy every browser is the proxy, and one
guesser slows logins for all. Each door keeps its own count (the dashboard's and the admin API's).
In `ledger` because both the gateway and the dashboard use it, and both may import only `ledger` in common.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ("FREE_GUESSES", "MAX_LOCK_S", "DoorShut", "GuessLimiter")

FREE_GUESSES = 5
MAX_LOCK_S = 300.0
FORGET_S = 3600.0
_MAX_CLIENTS = 10_000  # the oldest guesser is forgotten first: many addresses cannot grow memory


class _Guesses:
    __slots__ = ("failed", "last", "locked_until")

    def __init__(self) -> None:
        self.failed = 0
        self.last = 0.0
        self.locked_until = 0.0


class DoorShut(Exception):
    """A guess while the door is shut to its client: answer 429 with `Retry-After: retry_after`."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(f"too many wrong tokens from this address: try again in {math.ceil(wait_s)} s")
        self.retry_after = str(math.ceil(wait_s))


class GuessLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._clients: dict[str, _Guesses] = {}  # insertion order = order of first guess

    def wait_s(self, client: str) -> float:
        """Seconds until `client` may try a token again (0: now)."""
        guesses = self._clients.get(client)
        return 0.0 if guesses is None else max(0.0, guesses.locked_until - self._clock())

    def failed(self, client: str) -> None:
        now = self._clock()
        guesses = self._clients.get(client)
        if guesses is None or now - guesses.last > FORGET_S:
            self._clients.pop(client, None)
            while len(self._clients) >= _MAX_CLIENTS:
                del self._clients[next(iter(self._clients))]
            guesses = self._clients[client] = _Guesses()
        guesses.failed += 1
        guesses.last = now
        over = guesses.failed - FREE_GUESSES
        if over > 0:
            guesses.locked_until = now + min(MAX_LOCK_S, 2.0 ** min(over - 1, 32))

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)

    def judge(self, client: str, is_right: Callable[[], bool]) -> bool:
        """Whether `client`'s token is right (counted either way); `DoorShut` without comparing while it is shut."""
        wait_s = self.wait_s(client)
        if wait_s > 0:
            raise DoorShut(wait_s)
        right = is_right()
        if right:
            self.succeeded(client)
        else:
            self.failed(client)
        return right

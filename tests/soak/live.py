"""The soak's checks while faults run: every 200 received in full is in the ledger whenever the spool is
empty (the gateway's health says so), duplicates are told at once, the chain verifies now and then."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter

import httpx

from tests.reliability.helpers import verify_fast
from tests.soak.clients import Call
from tests.soak.invariants import LedgerScan, whole_200

__all__ = ("Live",)


class Live:
    """The checks made while faults run; counts what it checked and keeps what it found."""

    def __init__(
        self, db_url: str, url: str, calls: list[Call], scan: LedgerScan, *, check_every_s: float, verify_every_s: float
    ) -> None:
        self.db_url, self.url, self.calls, self.scan = db_url, url, calls, scan
        self.check_every_s, self.verify_every_s = check_every_s, verify_every_s
        self.violations: list[str] = []
        self.checked_calls: set[str] = set()
        self.rounds = Counter[str]()
        self.duplicates_seen = 0

    async def run(self, stop: asyncio.Event) -> None:
        last_verify = time.monotonic()
        async with httpx.AsyncClient(timeout=5) as http:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.check_every_s)
                await self.check(http)
                if time.monotonic() - last_verify > self.verify_every_s:
                    last_verify = time.monotonic()
                    await self.verify()

    async def check(self, http: httpx.AsyncClient) -> None:
        moment = time.time()
        try:
            health = (await http.get(self.url + "/_ledger/health")).json()
        except (httpx.HTTPError, ValueError):
            self.rounds["gateway_away"] += 1
            return
        if health["spooling"] or health["spool_bytes"]:
            self.rounds["spooling"] += 1  # the spool holds events not yet in the database: nothing to compare
            return
        try:
            await self.scan.advance(self.db_url)
        except Exception:  # the database went away since the health check
            self.rounds["database_away"] += 1
            return
        self.rounds["checked"] += 1
        for call in list(self.calls):
            call_id = call.outcome.call_id
            if call.ended < moment and whole_200(call) and call_id not in self.checked_calls:
                self.checked_calls.add(call_id)  # type: ignore[arg-type]
                if call_id not in self.scan.finished and call_id not in self.scan.failed:
                    found = f"live: {call.kind} 200 {call_id} not in the ledger with an empty spool"
                    print(f"soak: {found}", file=sys.stderr)
                    self.violations.append(found)
        for found in self.scan.duplicated[self.duplicates_seen :]:  # judged at the end; told now
            print(f"soak: live: duplicated: {found}", file=sys.stderr)
        self.duplicates_seen = len(self.scan.duplicated)

    async def verify(self) -> None:
        try:
            await verify_fast(self.db_url)
        except AssertionError as exc:
            self.violations.append(f"live: the chain does not verify: {exc}")
        except Exception as exc:  # the database is down at this moment (the summary says what was raised)
            first_line = (str(exc).splitlines() or [""])[0][:120]
            self.rounds[f"verify_skipped ({type(exc).__name__}: {first_line})"] += 1
            return
        self.rounds["verified"] += 1

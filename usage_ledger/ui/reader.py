"""How the dashboard reads: the database, the report settings and the admin token, and whether it brings the
projections up to date (`ledger ui` does, at most once per `refresh_every_s`; inside `ledger serve` the
follower does, since a catch-up on the gateway's loop stalls the proxy)."""

from __future__ import annotations

import asyncio
import time

from usage_ledger.ledger import Database
from usage_ledger.projections import ReportSettings, catch_up_all

__all__ = ("Reader",)


class Reader:
    def __init__(
        self,
        database: Database,
        settings: ReportSettings,
        *,
        admin_token: str | None = None,
        refresh: bool = False,
        refresh_every_s: float = 2.0,
    ) -> None:
        self.database = database
        self.settings = settings
        self.admin_token = admin_token
        """The gateway's token (`LEDGER_ADMIN_TOKEN`): the dashboard asks for it when set."""
        self.refresh = refresh
        self.refresh_every_s = refresh_every_s
        self._lock = asyncio.Lock()
        self._last = float("-inf")

    async def ready(self) -> Database:
        """The database, its projections caught up when this reader refreshes."""
        if self.refresh:
            async with self._lock:
                if time.monotonic() - self._last >= self.refresh_every_s:
                    await catch_up_all(self.database)
                    self._last = time.monotonic()
        return self.database

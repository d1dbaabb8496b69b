"""The dashboard: server-rendered pages and JSON endpoints under `/_ledger/ui/` (docs/dashboard.md).

Imports `projections` and `ledger`, never `gateway`: `ledger serve` gets these routers from the
composition root (usage_ledger.cli), and `ledger ui` serves them alone.
"""

from __future__ import annotations

__all__ = ()

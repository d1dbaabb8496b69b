"""The dashboard: server-rendered pages and JSON endpoints under `/_ledger/ui/` (docs/dashboard.md).

Imports `projections` and `ledger`, never `gateway`: `ledger serve` gets these routers from the
composition root (usage_ledger.cli), and `ledger ui` serves them alone.
"""

from __future__ import annotations

from usage_ledger.ui.routers import build_ui_routers, create_ui_app

__all__ = (
    "build_ui_routers",
    "create_ui_app",
)

"""OpenTelemetry export of recorded calls: one span per committed call, GenAI semantic conventions.

A follower of the ledger (like a projection): it reads committed events only, so it never reports a
call the ledger does not hold, and runs outside the gateway's loop.
"""

from __future__ import annotations

from usage_ledger.otel.export import export_once, follow_export, open_exporters
from usage_ledger.otel.settings import OtelSettings

__all__ = (
    "OtelSettings",
    "export_once",
    "follow_export",
    "open_exporters",
)

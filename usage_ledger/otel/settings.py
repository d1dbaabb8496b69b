"""The OpenTelemetry export's settings (`LEDGER_<FIELD>`); the exporter itself reads the SDK's `OTEL_*`."""

from __future__ import annotations

import msgspec

__all__ = ("OtelSettings",)


class OtelSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    otel_export: bool = False
    """`ledger serve` also runs `ledger otel export --follow` (docs/otel.md)."""

"""OpenTelemetry export errors.

LedgerError
└── OtelError
    ├── OtelMissing     the `otel` extra is not installed
    └── ExportFailed    the receiver refused a page or was unreachable (checkpoint not advanced)
"""

from __future__ import annotations

from usage_ledger.ledger import LedgerError

__all__ = ("ExportFailed", "OtelError", "OtelMissing")


class OtelError(LedgerError):
    pass


class OtelMissing(OtelError):
    pass


class ExportFailed(OtelError):
    pass

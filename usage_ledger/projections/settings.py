"""The reports' settings (`LEDGER_<FIELD>`; see `ledger.settings` for the convention)."""

from __future__ import annotations

import msgspec

__all__ = ("ReportSettings",)


class ReportSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    run_gap_s: float = 900.0
    """Untagged calls further apart than this start a new (`auto-…`) run."""
    tz: str = "UTC"
    """The zone of daily totals and eras' days (an IANA name)."""

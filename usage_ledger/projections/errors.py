"""Errors raised by the projections package.

LedgerError (ledger.errors)
└── ProjectionError          a projection, formula, run or report request is wrong (exit code 2)
    ├── UnknownProjection    `ledger rebuild NAME` with a name that is not registered
    ├── UnknownFormula       `--formula NAME` that is not registered
    ├── NotFound             a call or run that the projections do not know
    └── ImportFailed         an import file has bad rows; carries every `file:line: reason`
"""

from __future__ import annotations

from usage_ledger.ledger import LedgerError

__all__ = ("ImportFailed", "NotFound", "ProjectionError", "UnknownFormula", "UnknownProjection")


class ProjectionError(LedgerError):
    """Base class for projection errors."""


class UnknownProjection(ProjectionError):
    """No projection is registered under that name."""


class UnknownFormula(ProjectionError):
    """No throughput formula is registered under that name."""


class NotFound(ProjectionError):
    """The call or run is not in the projections."""


class ImportFailed(ProjectionError):
    """An import file had invalid rows (nothing of it was imported)."""

    def __init__(self, errors: list[str], hint: str = " (fix them or pass --skip-invalid)") -> None:
        self.errors = errors
        shown = "\n".join(errors[:20])
        more = f"\n... and {len(errors) - 20} more" if len(errors) > 20 else ""
        super().__init__(f"{len(errors)} invalid row(s), nothing imported{hint}:\n{shown}{more}")

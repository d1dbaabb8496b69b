"""Errors raised by the ledger package.

    LedgerError                  base of everything below
    ├── ConfigError              a setting or URL is wrong (exit code 2)
    ├── DatabaseUnavailable      the database cannot be reached (driver error translated once, here)
    ├── SchemaError              the schema is missing or not at the expected revision
    ├── SpoolCorrupt             a spool record failed its checksum (reported, skipped)
    ├── SpoolWriteFailed         a spool write failed or came up short: those events are not durable
    └── BlobNotFound             a body referenced by an event is absent or was redacted

Driver exceptions are translated at the ledger boundary (`raise ... from exc`), so callers never
import SQLAlchemy or driver exception types.
"""

from __future__ import annotations

__all__ = (
    "BlobNotFound",
    "ConfigError",
    "DatabaseUnavailable",
    "LedgerError",
    "SchemaError",
    "SpoolCorrupt",
    "SpoolWriteFailed",
    "first_line",
)


class LedgerError(Exception):
    """Base class for every error the ledger raises on purpose."""


class ConfigError(LedgerError):
    """A setting, flag or database URL is invalid; the message says which and what to do."""


class DatabaseUnavailable(LedgerError):
    """The database could not be reached or refused the connection."""


class SchemaError(LedgerError):
    """The ledger tables are missing or outdated: run `ledger db upgrade`."""


class SpoolCorrupt(LedgerError):
    """A spool record is damaged (bad length or checksum)."""


class BlobNotFound(LedgerError):
    """A blob referenced by hash is not stored, or its content was redacted."""


class SpoolWriteFailed(LedgerError):
    """A spool write failed or came up short (e.g. ENOSPC); it was cut back and its events are not durable."""


def first_line(exc: BaseException) -> str:
    """The first line of a driver's message (the part a translated error repeats), or the exception's name."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

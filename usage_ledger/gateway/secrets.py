"""Which names hold secrets, and the stored form of a query string (secret values fingerprinted).

One rule for header names and query parameter names (`SECRET_WORDS`, `SECRET_NAME_PARTS`); it errs towards
hiding. Only what is stored changes: the request goes upstream byte for byte. The rule and the stored form:
docs/configuration.md, "Security: secrets and the fingerprint key".
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, unquote_to_bytes

from usage_ledger.gateway.fingerprint_key import FingerprintKey

__all__ = ("SECRET_NAME_PARTS", "SECRET_WORDS", "is_secret_name", "recorded_query")

SECRET_WORDS = ("auth", "token", "secret", "key", "password", "passwd", "cookie", "session", "signature")
SECRET_NAME_PARTS = frozenset({"sig", "pwd"})
_NAME_PARTS = re.compile(r"[^a-z0-9]+")
_SEPARATOR = re.compile(r"([&;])")
"""`&`, and `;` (still a separator to some servers): a value behind either is found."""


def is_secret_name(name: str) -> bool:
    """Whether a header or (decoded) query parameter of this name holds a credential."""
    lowered = name.lower()
    return any(word in lowered for word in SECRET_WORDS) or not SECRET_NAME_PARTS.isdisjoint(_NAME_PARTS.split(lowered))


def recorded_query(query: str, key: FingerprintKey) -> str:
    """The query string as stored in `call.started` (`query` is the raw query, latin-1 decoded)."""
    if "=" not in query:
        return query
    parts = _SEPARATOR.split(query)  # [param, sep, param, sep, …]: separators at odd indexes
    changed = False
    for i in range(0, len(parts), 2):
        name, _, value = parts[i].partition("=")
        if value and is_secret_name(_decoded_name(name)):
            parts[i] = f"{name}={key.fingerprint(_decoded_value(value))}"
            changed = True
    return "".join(parts) if changed else query


def _decoded_name(raw: str) -> str:
    return unquote_plus(raw, errors="replace") if "%" in raw or "+" in raw else raw


def _decoded_value(raw: str) -> bytes:
    return unquote_to_bytes(raw.encode("latin-1").replace(b"+", b" "))

"""The one rule for client text in projection rows: U+0000 is shown as U+FFFD, on every backend.

The ledger keeps every event's exact bytes (a NUL travels as the JSON escape `\\u0000` inside
the payload text). PostgreSQL's `text` cannot hold U+0000 and its JSON functions refuse to turn
that escape into text, so a read-model column fed from a client string (run, ticker, tags, model,
source, annotation labels) holds U+FFFD (REPLACEMENT CHARACTER) where the client sent NUL. The
same on SQLite, so rows, digests and reports do not depend on the backend. No other character
needs the rule: the gateway stores paths, queries and header values as latin-1 (each byte one
character), tag values must be valid UTF-8 without control characters, and JSON bodies with lone
surrogates or invalid UTF-8 are not decoded (the model is then unknown, the body blob exact).

Call ids are not rewritten (two ids must never merge into one row); PostgreSQL's ledger cannot
hold a call id with NUL at all (its stream column refuses it), so a look-up of one finds nothing.
"""

from __future__ import annotations

__all__ = ("NUL_SHOWN_AS", "projection_tags", "projection_text", "projection_text_or_none")

NUL_SHOWN_AS = "\ufffd"


def projection_text(value: str) -> str:
    """`value` as a projection column stores it (and as a filter on such a column must be given)."""
    return value.replace("\x00", NUL_SHOWN_AS) if "\x00" in value else value


def projection_text_or_none(value: str | None) -> str | None:
    return None if value is None else projection_text(value)


def projection_tags(tags: dict[str, str]) -> dict[str, str]:
    """Tag names and values under the rule (a name that only differed by NUL from another merges with it)."""
    if not any("\x00" in name or "\x00" in value for name, value in tags.items()):
        return tags
    return {projection_text(name): projection_text(value) for name, value in tags.items()}

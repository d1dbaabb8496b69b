"""The one rule for client text in projection rows: U+0000 is shown as U+FFFD, on every backend.

Why, and which columns: docs/auditing.md (Unusual text). Call ids are never rewritten."""

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

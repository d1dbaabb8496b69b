"""`ledger show call`'s bodies made readable: JSON pretty-printed, a stream one event a line, and (unless
`--full`) each line clipped to the terminal and each body to its first lines, saying how much was left out.
"""

from __future__ import annotations

import json

from rich.cells import cell_len, set_cell_size

__all__ = ("MAX_LINES", "body_lines")

MAX_LINES = 40
"""Lines of one body shown without `--full` (a stream has one per event, a long run of them)."""


def body_lines(text: str, *, width: int, full: bool) -> list[str]:
    """`text` (a stored request or response body) as lines to print."""
    lines = _readable(text)
    if full:
        return lines
    shown = [_clip(line, width) for line in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        shown.append(f"… {len(lines) - MAX_LINES:,} more lines (--full shows everything)")
    return shown


def _readable(text: str) -> list[str]:
    """A JSON body indented; anything else (an SSE stream, plain text) as its own lines, blank ones dropped."""
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False).splitlines()
        except ValueError:
            pass  # not JSON after all: shown as it is
    return [line for line in text.splitlines() if line.strip()]


def _clip(line: str, width: int) -> str:
    """`line` in `width` cells; a longer one ends with how many characters were left out."""
    if cell_len(line) <= width:
        return line
    for keep in range(max(width - 24, 8), 0, -8):  # the note's length depends on the count it prints
        head = set_cell_size(line, keep).rstrip()
        clipped = f"{head} … (+{len(line) - len(head):,} characters)"
        if cell_len(clipped) <= width:
            return clipped
    return set_cell_size(line, width)

"""Fitting a table of text cells into a terminal's width: which columns stay, and how far cells shorten.

Shared by `ledger report …` (commands.output) and the demo's tables. Each column has a priority; what a narrow
terminal costs, in order:

1. long text cells are shortened with `…` (never below `MIN_TEXT` or the header; the first column, the row's
   name, not below `MIN_KEY`);
2. a column with nothing to say (only zeros and dashes) is left out;
3. columns of negative priority (the optional ones) are left out, lowest first (rightmost first among equals);
4. the first column shortens in the middle (`moe-2026-1…T02-55-00`: both ends of a run name tell runs apart) down
   to `MIN_KEY_SHORT`, unless it must stay whole (a call id to copy);
5. the other columns are left out, lowest priority first. A column marked `keep` (the row's name, the figure the
   table exists for: throughput) never is.

The caller names the columns left out (`FittedTable.hidden`), so nothing disappears silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len, set_cell_size
from rich.table import Table
from rich.text import Text

__all__ = ("MIN_KEY", "Column", "FittedTable", "clip", "clip_middle", "fit_table")

MIN_TEXT = 12
"""A text column is never ellipsised below this (nor below its header)."""
MIN_KEY = 36
"""Nor the first column below this before columns with something to say go: a UUID call id or an `auto-…` run."""
MIN_KEY_SHORT = 16
"""The first column shortened in the middle, before figures go."""
_EMPTY = frozenset({"", "0", "-", "—", "0.0", "0.00"})


@dataclass(frozen=True)
class Column:
    header: str
    numeric: bool = False  # right-aligned, never shortened
    priority: float = 0.0  # higher stays longer
    keep: bool = False  # never left out
    whole: bool = False  # the first column: never shortened in the middle (an id to copy)


@dataclass(frozen=True)
class FittedTable:
    table: Table
    shown: tuple[int, ...]  # indices of the columns kept
    hidden: tuple[str, ...]  # headers of the columns left out, in table order
    width: int  # the width the table needs (≤ the width asked, unless one column alone is wider)


def clip(text: str, limit: int) -> str:
    """`text` in at most `limit` terminal cells, ending in `…` when shortened."""
    if cell_len(text) <= limit:
        return text
    return set_cell_size(text, max(limit - 1, 0)).rstrip() + "…"


def clip_middle(text: str, limit: int) -> str:
    """`text` in at most `limit` cells, its middle replaced by `…` when shortened (both ends stay readable)."""
    if cell_len(text) <= limit:
        return text
    if limit < 3:
        return clip(text, limit)
    head = (limit - 1 + 1) // 2
    tail = limit - 1 - head
    end = ""
    for char in reversed(text):
        if cell_len(char + end) > tail:
            break
        end = char + end
    return set_cell_size(text, head).rstrip() + "…" + end


def overhead(count: int) -> int:
    """Characters a SIMPLE_HEAD table without edges adds to its columns' contents: padding and separators."""
    return 3 * count - 1


def _widths(kept: list[int], natural: list[int], columns: Sequence[Column], key_floor: int, budget: int) -> list[int]:
    """Each kept column's width: text columns share one cap, lowered until the row fits or every one is at its floor."""

    def floor(i: int) -> int:
        header = cell_len(columns[i].header)
        base = key_floor if i == 0 else MIN_TEXT
        return min(natural[i], max(base, header))

    def at(cap: int) -> list[int]:
        return [natural[i] if columns[i].numeric else max(min(natural[i], cap), floor(i)) for i in kept]

    cap = max(natural)
    while cap > 1 and sum(at(cap)) > budget:
        cap -= 1
    return at(cap)


def fit_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> FittedTable:
    """The table of `rows` (cells as text, one per column) that fits `width` (see the module docstring)."""
    natural = [max([cell_len(c.header), *(cell_len(row[i]) for row in rows)]) for i, c in enumerate(columns)]
    kept = list(range(len(columns)))
    key_whole = columns[0].whole if columns else True

    def fits(key_floor: int) -> list[int] | None:
        sizes = _widths(kept, natural, columns, key_floor, width - overhead(len(kept)))
        return sizes if sum(sizes) + overhead(len(kept)) <= width or len(kept) == 1 else None

    def droppable(stage: str) -> list[int]:
        candidates = [
            i
            for i in kept
            if i != 0
            and not columns[i].keep
            and (stage != "empty" or all(row[i].strip() in _EMPTY for row in rows))
            and (stage != "optional" or columns[i].priority < 0)
        ]
        return sorted(candidates, key=lambda i: (columns[i].priority, -i))

    key_floor = MIN_KEY
    sizes = fits(key_floor)
    for stage in ("empty", "optional", "key", "priority"):
        if sizes is not None:
            break
        if stage == "key":
            if not key_whole:
                key_floor = MIN_KEY_SHORT
                sizes = fits(key_floor)
            continue
        for i in droppable(stage):
            kept.remove(i)
            sizes = fits(key_floor)
            if sizes is not None:
                break
    if sizes is None:  # only columns that must stay: as narrow as they go
        sizes = _widths(kept, natural, columns, key_floor, width - overhead(len(kept)))
    if len(kept) == 1 and not columns[kept[0]].numeric:
        sizes = [min(natural[kept[0]], max(width - overhead(1), 1))]

    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for i in kept:
        column = columns[i]
        table.add_column(column.header, justify="right" if column.numeric else "left", no_wrap=True)
    for row in rows:
        cells = []
        for i, size in zip(kept, sizes, strict=True):
            text = row[i]
            if not columns[i].numeric:
                text = clip_middle(text, size) if i == 0 and not key_whole else clip(text, size)
            cells.append(Text(text))
        table.add_row(*cells)
    hidden = tuple(columns[i].header for i in range(len(columns)) if i not in kept)
    return FittedTable(table=table, shown=tuple(kept), hidden=hidden, width=sum(sizes) + overhead(len(kept)))

"""`ledger labels import` and `ledger returns import`: labels and realized returns as events (DESIGN §6).

- One event per file (`labels.recorded`, `returns.recorded`), or per extraction over a run's stored
  answers (`labels import --run R --extract RE`, read as `ledger agreement --extract` reads them).
- Atomic per file: a bad row is reported `file:line: reason` and nothing of the file is appended.
- The latest import counts, and nothing is appended only when the import is already the current state:
  every row's value equals what the ledger holds now for its (run, key) (labels) or (key, as_of)
  (returns). Anything else is appended, even content equal to an earlier import's (a bad extraction
  undone by re-importing the right file), and supersedes per (run, key) / (key, as_of); earlier events
  stay. The event id is a UUIDv5 over the sorted rows (not the file name, order or lines) and the id of
  the stream's latest event, so two processes importing the same file at once append it once.
- Labels: `run,key,label` (other columns ignored). An empty label records that the run has no label
  for the key. A (run, key) twice in one file, or a run the ledger does not have, is a bad row.
- Returns: `key,return[,as_of]`; `return` a finite number, `as_of` an ISO date (YYYY-MM-DD). A
  (key, as_of) twice in one file is a bad row.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Iterator, Sequence
from datetime import date
from pathlib import Path

import msgspec
from sqlalchemy import select

from usage_ledger.answers import labels_from_ledger, live_versions, parse_where, regex_extractor, run_filter
from usage_ledger.imports._rows import csv_records, line_of
from usage_ledger.ledger import (
    Database,
    LabelsRecorded,
    RecordedLabel,
    RecordedReturn,
    ReturnsRecorded,
    append_events,
    new_event,
    translate_db_error,
)
from usage_ledger.ledger.schema import events
from usage_ledger.projections import (
    ImportFailed,
    ProjectionError,
    parse_as_of,
    recorded_labels,
    recorded_return_values,
)

__all__ = (
    "LABELS_STREAM",
    "RETURNS_STREAM",
    "Recorded",
    "extract_labels",
    "import_labels",
    "import_returns",
)

LABELS_STREAM = "labels"
RETURNS_STREAM = "returns"
_NAMESPACE = uuid.UUID("5f0c1b8e-2d47-5a61-9c3e-7b1d0e4a6f21")
"""Of every labels/returns event id (never change it: ids already stored were made with it)."""
_MAX_TEXT = 255
_canonical = msgspec.json.Encoder(order="sorted")


class Recorded(msgspec.Struct, frozen=True, kw_only=True):
    """What one import did: `appended` False when its rows were already the ledger's current values
    (`event_id` is then the stream's latest event, under which they are current)."""

    source: str
    rows: int
    appended: bool
    position: int | None
    event_id: str
    warnings: list[str] = []


def _content_id(kind: str, rows: Sequence[msgspec.Struct], after: str | None) -> uuid.UUID:
    # lines are where a row was, not what it says: a reordered file is the same content
    plain = sorted(_canonical.encode(msgspec.structs.replace(row, line=0)) for row in rows)
    head = kind if after is None else f"{kind} after {after}"  # the first import's id is as it always was
    return uuid.uuid5(_NAMESPACE, head + "\n" + "\n".join(item.decode() for item in plain))


async def _latest_event_id(database: Database, stream: str) -> str | None:
    query = select(events.c.event_id).where(events.c.stream == stream).order_by(events.c.position.desc()).limit(1)
    async with database.engine.connect() as conn:
        found = (await conn.execute(query)).scalar_one_or_none()
    return None if found is None else str(found)


async def _labels_current(database: Database, labels: Sequence[RecordedLabel]) -> bool:
    # an empty label and no label are the same state: the key has none
    current = await recorded_labels(database, sorted({item.run for item in labels}))
    return all(current[item.run].get(item.key, "") == item.label for item in labels)


async def _returns_current(database: Database, returns: Sequence[RecordedReturn]) -> bool:
    current = await recorded_return_values(database)
    return all(current.get((item.key, item.as_of)) == item.value for item in returns)


async def _record(
    database: Database, body: LabelsRecorded | ReturnsRecorded, rows: int, current: bool, warnings: list[str]
) -> Recorded:
    """Append `body` unless its rows are the current state already (`current`)."""
    stream, kind = (LABELS_STREAM, "labels") if isinstance(body, LabelsRecorded) else (RETURNS_STREAM, "returns")
    after = await _latest_event_id(database, stream)
    if current and after is not None:
        return Recorded(source=body.source, rows=rows, appended=False, position=None, event_id=after, warnings=warnings)
    items = body.labels if isinstance(body, LabelsRecorded) else body.returns
    event = new_event(body, stream=stream, event_id=_content_id(kind, items, after))
    try:
        result = await append_events(database, [event])
    except Exception as exc:
        raise translate_db_error(exc, database) from exc
    appended = result.appended > 0
    return Recorded(
        source=body.source,
        rows=rows,
        appended=appended,
        position=result.last_position if appended else None,
        event_id=str(event.event_id),
        warnings=warnings,
    )


def _rows(path: Path, required: Sequence[str], errors: list[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, stripped cells by column) per good row; a bad row's `file:line: reason` goes to `errors`, and a
    header missing a column ends the file with one error."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ProjectionError(f"{path}: {exc.strerror or exc}") from exc
    with handle, contextlib.closing(csv_records(handle)) as records:
        _, _, header = next(records, (1, 0, f"empty file (expected the header {','.join(required)})"))
        if isinstance(header, str):
            errors.append(f"{path}:1: {header}")
            return
        missing = [name for name in required if name not in header]
        if missing:
            errors.append(f"{path}:1: no column {', '.join(missing)} in the header (it has {', '.join(header)})")
            return
        for line, _, cells in records:
            if isinstance(cells, str):
                errors.append(f"{path}:{line}: {cells}")
            else:
                yield line, dict(zip(header, (cell.strip() for cell in cells), strict=True))


def _text(value: str, field: str, *, empty: bool = False) -> str:
    if (not value and not empty) or len(value) > _MAX_TEXT or any(ord(ch) < 32 for ch in value):
        raise ValueError(f"{field}: must be 1-{_MAX_TEXT} characters without control characters, got {value!r}")
    return value


async def _unknown_runs(database: Database, runs: Sequence[str], run_gap_s: float) -> set[str]:
    version, _, _ = await live_versions(database)
    async with database.engine.connect() as conn:
        return {run for run in runs if await run_filter(conn, version, run, run_gap_s) is None}


async def import_labels(database: Database, path: str | Path, *, run_gap_s: float = 900.0) -> Recorded:
    """One `labels.recorded` for the file; `ImportFailed` (nothing appended) when a row is bad."""
    path = Path(path)
    errors: list[str] = []
    labels: list[RecordedLabel] = []
    first: dict[tuple[str, str], int] = {}
    run_lines: dict[str, int] = {}
    for line, row in _rows(path, ("run", "key", "label"), errors):
        try:
            label = RecordedLabel(
                run=_text(row["run"], "run"),
                key=_text(row["key"], "key"),
                label=_text(row["label"], "label", empty=True),
                line=line,
            )
        except ValueError as exc:
            errors.append(f"{path}:{line}: {exc}")
            continue
        if (seen := first.setdefault((label.run, label.key), line)) != line:
            errors.append(
                f"{path}:{line}: a second label for run {label.run!r}, key {label.key!r} (first: line {seen})"
            )
            continue
        run_lines.setdefault(label.run, line)
        labels.append(label)
    for run in sorted(await _unknown_runs(database, list(run_lines), run_gap_s)):
        errors.append(f"{path}:{run_lines[run]}: no run {run!r} in the ledger (see `ledger report runs`)")
    _refuse_if_bad(path, errors, len(labels), "labels")
    body = LabelsRecorded(source=path.name, labels=labels)
    return await _record(database, body, len(labels), await _labels_current(database, labels), [])


async def extract_labels(
    database: Database,
    run: str,
    pattern: str,
    *,
    key: str = "ticker",
    where: Sequence[str] = (),
    run_gap_s: float = 900.0,
) -> Recorded:
    """One `labels.recorded` with the labels `pattern` finds in the run's stored answers (as `ledger agreement
    --extract`: one label per key, each answer searched for at most `EXTRACT_TIMEOUT_S`). A key whose answers
    were all read and hold no label is recorded with an empty one, withdrawing what an earlier extraction or
    file said; a pattern that finds no label at all records nothing (most likely the pattern is wrong)."""
    extractor = regex_extractor(pattern)
    (found,) = await labels_from_ledger(
        database, [run], extractor, key=key, where=parse_where(where), run_gap_s=run_gap_s
    )
    labels = [RecordedLabel(run=run, key=name, label=label) for name, label in sorted(found.labels.items())]
    warnings = [f"{run}: {n} {key}(s) without a label: {why}" for why, n in sorted(found.unlabelled.items())]
    warnings += [f"{run}: {n} answer(s) {when}" for when, n in sorted(found.erased.items())]
    if labels and found.unmatched:
        # read, and no label in them: an earlier label of these keys no longer holds (an empty label withdraws it)
        labels = sorted(
            [*labels, *(RecordedLabel(run=run, key=name, label="") for name in found.unmatched)],
            key=lambda item: item.key,
        )
        warnings.append(f"{run}: {len(found.unmatched)} {key}(s) recorded without a label (any earlier one withdrawn)")
    if found.timed_out:
        warnings.append(
            f"{run}: the pattern was stopped on {len(found.timed_out)} answer(s): {', '.join(found.timed_out)}"
        )
    if not labels:
        raise ProjectionError(
            f"--extract {pattern!r} found no label in run {run!r}"
            + (f" ({'; '.join(warnings)})" if warnings else "")
            + ": check it against `ledger show call`"
        )
    body = LabelsRecorded(source=f"run {run}", labels=labels, extract=pattern)
    return await _record(database, body, len(labels), await _labels_current(database, labels), warnings)


def _return(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"return: expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"return: {text!r} is not a finite number")
    return value


async def import_returns(database: Database, path: str | Path) -> Recorded:
    """One `returns.recorded` for the file; `ImportFailed` (nothing appended) when a row is bad."""
    path = Path(path)
    errors: list[str] = []
    returns: list[RecordedReturn] = []
    first: dict[tuple[str, date | None], int] = {}
    for line, row in _rows(path, ("key", "return"), errors):
        try:
            item = RecordedReturn(
                key=_text(row["key"], "key"),
                value=_return(row["return"]),
                as_of=parse_as_of(row.get("as_of", "")),
                line=line,
            )
        except ValueError as exc:
            errors.append(f"{path}:{line}: {exc}")
            continue
        if (seen := first.setdefault((item.key, item.as_of), line)) != line:
            when = f" as of {item.as_of}" if item.as_of else ""
            errors.append(f"{path}:{line}: a second return for key {item.key!r}{when} (first: line {seen})")
            continue
        returns.append(item)
    _refuse_if_bad(path, errors, len(returns), "returns")
    body = ReturnsRecorded(source=path.name, returns=returns)
    return await _record(database, body, len(returns), await _returns_current(database, returns), [])


def _refuse_if_bad(path: Path, errors: list[str], rows: int, what: str) -> None:
    """`ImportFailed` (nothing appended) when the file has a bad row, or no row of `what` at all."""
    if not rows and not errors:
        errors.append(f"{path}:1: no {what} in the file")
    if errors:
        raise ImportFailed(sorted(errors, key=line_of), hint="")

"""Labels of `ledger agreement`: one per (run, key), read from the ledger's stored responses or from a CSV.

A key's label comes from the last of its `ok` calls whose stored response gives one; a key without one says
why (docs/decide.md). Labels are never guessed."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.answers.agreement_text import LabelExtractor, assistant_text, decoded_body
from usage_ledger.answers.filters import calls_where
from usage_ledger.answers.reports import live_versions
from usage_ledger.ledger import BlobNotFound, Database, blob_erasures, blob_redacted_at, call_stream, read_blob
from usage_ledger.ledger.schema import events
from usage_ledger.projections import NotFound, ProjectionError
from usage_ledger.projections.tables import calls

__all__ = (
    "NO_BODY",
    "TIMED_OUT",
    "RunCall",
    "RunLabels",
    "answer_text",
    "labels_from_csv",
    "labels_from_ledger",
    "read_outcomes",
    "run_calls",
)

TIMED_OUT = "timed out"
"""The reason of a key whose answers the extractor gave up on (`agreement_text.EXTRACT_TIMEOUT_S`)."""

NO_BODY = ("imported", "redacted", "omitted", "not stored")
"""The reasons that mean a run's calls have no stored response body to read a label from."""

_tags = msgspec.json.Decoder(dict[str, str])


class RunLabels(msgspec.Struct, frozen=True, kw_only=True):
    """A run's labels by key, and why the keys without one have none (reason → how many keys)."""

    run: str
    labels: dict[str, str]
    unlabelled: dict[str, int] = {}
    calls_without_key: int = 0
    timed_out: list[str] = []
    """The answers the extractor gave up on, as `key (call id)`."""
    unmatched: list[str] = []
    """The keys whose answers were all read and none holds a label (`no match`): they have none now."""
    erased: dict[str, int] = {}
    """When keys are `redacted`: the run's erased answers by when and why (`erased on DATE (REASON)`)."""

    @property
    def keys(self) -> int:
        return len(self.labels) + sum(self.unlabelled.values())


class _Finished(msgspec.Struct, frozen=True):
    response_headers: list[tuple[str, str]] = []
    response_blob_omitted: str = ""


_finished = msgspec.json.Decoder(_Finished)


async def _finished_event(conn: AsyncConnection, call_id: str) -> _Finished:
    payload = (
        await conn.execute(
            select(events.c.payload)
            .where(events.c.stream == call_stream(call_id), events.c.type == "call.finished")
            .order_by(events.c.position.desc())
            .limit(1)
        )
    ).scalar_one_or_none()
    return _finished.decode(payload) if payload is not None else _Finished()


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((value for key, value in headers if key.lower() == name), None)


async def answer_text(conn: AsyncConnection, call_id: str, origin: str, blob: str | None) -> tuple[str | None, str]:
    """(the assistant text of the call's stored response, "") or (None, why there is none)."""
    if origin == "import":
        return None, "imported"
    finished = await _finished_event(conn, call_id)
    if blob is None:
        return None, "omitted" if finished.response_blob_omitted else "not stored"
    try:
        data = await read_blob(conn, blob)
    except BlobNotFound:
        try:
            redacted = await blob_redacted_at(conn, blob) is not None
        except BlobNotFound:
            redacted = False
        return None, "redacted" if redacted else "not stored"
    headers = finished.response_headers
    try:
        body = decoded_body(data, _header(headers, "content-encoding"))
    except ValueError:
        return None, "unreadable"
    text = assistant_text(body, _header(headers, "content-type"))
    return (text, "") if text is not None else (None, "unreadable")


async def _call_label(
    conn: AsyncConnection, call_id: str, origin: str, blob: str | None, extract: LabelExtractor
) -> tuple[str | None, str]:
    """(label, "") or (None, why there is none) for one completed call."""
    text, why = await answer_text(conn, call_id, origin, blob)
    if text is None:
        return None, why
    try:
        label = extract(text)
    except TimeoutError:
        return None, TIMED_OUT
    return (label, "") if label is not None else (None, "no match")


async def _key_label(
    conn: AsyncConnection, rows: list[tuple[str, str, str, str | None]], extract: LabelExtractor, timed_out: list[str]
) -> tuple[str | None, str]:
    """The key's label, or why it has none; the calls whose answer the extractor gave up on go to `timed_out`."""
    reasons: list[str] = []
    for call_id, status, origin, blob in reversed(rows):
        if status != "ok" and origin != "import":
            continue
        label, why = await _call_label(conn, call_id, origin, blob, extract)
        if label is not None:
            return label, ""
        if why == TIMED_OUT:
            timed_out.append(call_id)
        reasons.append(why)
    if not reasons:
        return None, "not ok"
    # a body that was read says more than a later one that was not stored
    return None, next((r for r in reasons if r in ("no match", TIMED_OUT, "unreadable")), reasons[0])


class RunCall(NamedTuple):
    call_id: str
    tags: dict[str, str]
    status: str
    origin: str
    response_blob: str | None


async def run_calls(conn: AsyncConnection, version: int, run: str, run_gap_s: float) -> list[RunCall]:
    """The run's calls in start order (what a label is read from); NotFound when there is no such run."""
    c = calls.c
    result = await conn.execute(
        select(c.call_id, c.tags, c.status, c.origin, c.response_blob)
        .where(*await calls_where(conn, version, run, run_gap_s))
        .order_by(c.started_at, c.call_id)
    )
    return [RunCall(call_id, _tags.decode(tags), *rest) for call_id, tags, *rest in result.all()]


async def _run_labels(
    conn: AsyncConnection,
    version: int,
    run: str,
    extract: LabelExtractor,
    key: str,
    where: Sequence[tuple[str, str]],
    run_gap_s: float,
) -> RunLabels:
    by_key: dict[str, list[tuple[str, str, str, str | None]]] = {}
    without_key = 0
    for call_id, tags, status, origin, blob in await run_calls(conn, version, run, run_gap_s):
        if any(tags.get(name) != value for name, value in where):
            continue
        value = tags.get(key)
        if value is None:
            without_key += 1
            continue
        by_key.setdefault(value, []).append((call_id, status, origin, blob))
    labels: dict[str, str] = {}
    unlabelled: dict[str, int] = {}
    timed_out: list[str] = []
    unmatched: list[str] = []
    for value, rows in sorted(by_key.items()):
        given_up: list[str] = []
        label, why = await _key_label(conn, rows, extract, given_up)
        timed_out += [f"{value} ({call_id})" for call_id in given_up]
        if label is not None:
            labels[value] = label
        else:
            unlabelled[why] = unlabelled.get(why, 0) + 1
            if why == "no match" and not given_up:
                unmatched.append(value)
    erased: dict[str, int] = {}
    if "redacted" in unlabelled:
        answers = sorted({blob for rows in by_key.values() for *_, blob in rows if blob is not None})
        for start in range(0, len(answers), 500):
            for erasure in (await blob_erasures(conn, answers[start : start + 500])).values():
                when = f"erased on {erasure.recorded_at.date().isoformat()} ({erasure.reason})"
                erased[when] = erased.get(when, 0) + 1
    return RunLabels(
        run=run,
        labels=labels,
        unlabelled=unlabelled,
        calls_without_key=without_key,
        timed_out=timed_out,
        unmatched=unmatched,
        erased=erased,
    )


async def labels_from_ledger(
    database: Database,
    runs: Sequence[str],
    extract: LabelExtractor,
    *,
    key: str = "ticker",
    where: Sequence[tuple[str, str]] = (),
    run_gap_s: float = 900.0,
) -> list[RunLabels]:
    """Each run's labels from its stored responses; NotFound for a run the ledger does not have."""
    version, _, _ = await live_versions(database)
    async with database.engine.connect() as conn:
        return [await _run_labels(conn, version, run, extract, key, where, run_gap_s) for run in runs]


def _read_csv(path: Path, what: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            rows = [(reader.line_num, row) for row in reader]
            return list(reader.fieldnames or []), rows
    except OSError as exc:
        raise ProjectionError(f"{what} {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ProjectionError(f"{what} {path}: not a UTF-8 CSV file ({exc})") from exc


def _require(path: Path, header: list[str], *names: str) -> None:
    missing = [name for name in names if name not in header]
    if missing:
        raise ProjectionError(
            f"{path}:1: no column {', '.join(map(repr, missing))} in the header (it has {', '.join(header) or 'nothing'})"
        )


def labels_from_csv(path: Path, runs: Sequence[str]) -> list[RunLabels]:
    """Labels from a CSV with the columns `run,key,label` (others ignored); an empty label counts as missing."""
    header, rows = _read_csv(path, "--labels")
    _require(path, header, "run", "key", "label")
    seen: dict[tuple[str, str], int] = {}
    by_run: dict[str, dict[str, str]] = {}
    empty: dict[str, int] = {}
    for line, row in rows:
        run, key, label = (row.get(name) or "" for name in ("run", "key", "label"))
        if (run, key) in seen:
            raise ProjectionError(
                f"{path}:{line}: a second label for run {run!r}, key {key!r} (first: line {seen[run, key]})"
            )
        seen[run, key] = line
        if label.strip():
            by_run.setdefault(run, {})[key] = label.strip()
        else:
            empty[run] = empty.get(run, 0) + 1
    known = sorted(set(by_run) | set(empty))
    for run in runs:
        if run not in known:
            raise NotFound(f"no labels for run {run!r} in {path} (its runs: {', '.join(known) or 'none'})")
    return [
        RunLabels(run=run, labels=by_run.get(run, {}), unlabelled={"empty label": empty[run]} if run in empty else {})
        for run in runs
    ]


def read_outcomes(path: Path, key: str, column: str) -> dict[str, float]:
    """Outcome per key from a CSV with a `key` column and `column`; an empty cell is a key without an outcome."""
    header, rows = _read_csv(path, "--outcomes")
    _require(path, header, key, column)
    outcomes: dict[str, float] = {}
    lines: dict[str, int] = {}
    for line, row in rows:
        name, cell = (row.get(key) or "").strip(), (row.get(column) or "").strip()
        if not cell:
            continue
        if name in lines:
            raise ProjectionError(f"{path}:{line}: a second outcome for {key} {name!r} (first: line {lines[name]})")
        try:
            value = float(cell)
        except ValueError:
            value = float("nan")
        if value != value or value in (float("inf"), float("-inf")):
            raise ProjectionError(f"{path}:{line}: {column} {cell!r} is not a finite number")
        outcomes[name] = value
        lines[name] = line
    return outcomes

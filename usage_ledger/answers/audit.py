"""`ledger audit RUN [--against RUN2]`: what makes a run's numbers incomparable; the findings: docs/server.md."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.answers.filters import calls_where
from usage_ledger.answers.reports import runs_report
from usage_ledger.ledger import CallFinished, CallStarted, Database, ServerSampled, call_stream, decode_event
from usage_ledger.ledger.schema import events
from usage_ledger.projections import RunRow, live_version, load_samples, samples_of_run
from usage_ledger.projections.tables import calls

__all__ = ("AuditReport", "Finding", "audit_run")

_CHUNK = 500  # streams per query


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    detail: str


class AuditReport(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    against: str | None
    findings: list[Finding]


class _RunFacts(msgspec.Struct, kw_only=True):
    values: dict[str, Counter[str]]
    """Per parameter (sampling fields and `model`), how many calls sent each value."""
    config: dict[str, str] | None
    fingerprints: Counter[str]
    """How many calls' responses carried each `system_fingerprint`."""


def _shown(value: object) -> str:
    return "(not sent)" if value is None else msgspec.json.encode(value).decode()


def _listed(values: list[str]) -> str:
    """The values a run sent, as its findings show them (`"qwen3", "qwen3-moe"`), not a Python list."""
    return ", ".join(values) or "(none)"


async def _call_events(conn: AsyncConnection, call_ids: Sequence[str]) -> list[CallStarted | CallFinished]:
    """The calls' `call.started` and `call.finished` events."""
    found: list[CallStarted | CallFinished] = []
    for i in range(0, len(call_ids), _CHUNK):
        streams = [call_stream(c) for c in call_ids[i : i + _CHUNK]]
        query = select(events.c.payload).where(
            events.c.stream.in_(streams), events.c.type.in_(("call.started", "call.finished"))
        )
        for (payload,) in (await conn.execute(query)).all():
            if isinstance(event := decode_event(payload), CallStarted | CallFinished):
                found.append(event)
    return found


async def _facts(
    database: Database, row: RunRow, run_gap_s: float, samples: list[ServerSampled]
) -> tuple[_RunFacts, list[Finding]]:
    run = row.run
    async with database.engine.connect() as conn:
        version, _ = await live_version(conn, "calls")
        where = await calls_where(conn, version, run, run_gap_s)
        ids = [r[0] for r in await conn.execute(select(calls.c.call_id).where(*where))]
        found = await _call_events(conn, ids)
    values: dict[str, Counter[str]] = {}
    fingerprints = Counter(e.system_fingerprint for e in found if isinstance(e, CallFinished) and e.system_fingerprint)
    for event in (e for e in found if isinstance(e, CallStarted)):
        fields = {name: getattr(event.sampling, name) for name in event.sampling.__struct_fields__}
        for name, value in {**fields, "model": event.model}.items():
            values.setdefault(name, Counter())[_shown(value)] += 1
    findings = [
        Finding(
            kind="model_varies" if name == "model" else "sampling_varies",
            detail=f"{name}: " + ", ".join(f"{v} ({n} calls)" for v, n in seen.most_common()),
        )
        for name, seen in values.items()
        if len(seen) > 1
    ]
    if len(fingerprints) > 1:
        seen_text = ", ".join(f"{v} ({n} calls)" for v, n in fingerprints.most_common())
        findings.append(Finding(kind="server_fingerprint_changed", detail=f"system_fingerprint: {seen_text}"))
    server = row.server
    if server is not None and server.restarts:
        findings.append(Finding(kind="server_restarted", detail=f"{server.restarts}× (its counters went down)"))
    if server is not None and server.window_start is not None and server.window_end is not None:
        findings += _changes(samples_of_run(samples, run), server.window_start, server.window_end)
    config = server.config if server is not None else None
    return _RunFacts(values=values, config=config, fingerprints=fingerprints), findings


def _changes(samples: Sequence[ServerSampled], start: datetime, end: datetime) -> list[Finding]:
    """Config and served models that change inside [start, end] (against what was in effect before)."""
    found: list[Finding] = []
    config: dict[str, str] | None = None
    models: list[str] | None = None
    for sample in (s for s in samples if s.sampled_at <= end):
        inside = sample.sampled_at >= start
        when = sample.sampled_at.isoformat()
        if sample.config is not None:
            if inside and config is not None and sample.config != config:
                changed = sorted(k for k in {*config, *sample.config} if config.get(k) != sample.config.get(k))
                detail = ", ".join(f"{k}: {config.get(k)} → {sample.config.get(k)}" for k in changed)
                found.append(Finding(kind="server_config_changed", detail=f"at {when}: {detail}"))
            config = sample.config
        if sample.models is not None:
            names = [f"{m.id} (max_model_len {m.max_model_len})" for m in sample.models]
            if inside and models is not None and names != models:
                found.append(Finding(kind="server_models_changed", detail=f"at {when}: {models} → {names}"))
            models = names
    return found


def _differences(run: str, mine: _RunFacts, other_run: str, other: _RunFacts) -> list[Finding]:
    details: list[str] = []
    for name in sorted({*mine.values, *other.values}):
        a = sorted(mine.values.get(name, Counter()))
        b = sorted(other.values.get(name, Counter()))
        if a != b:
            details.append(f"{name}: {run} {_listed(a)} vs {other_run} {_listed(b)}")
    if mine.config is not None and other.config is not None:
        for key in sorted({*mine.config, *other.config}):
            if mine.config.get(key) != other.config.get(key):
                details.append(f"server {key}: {run} {mine.config.get(key)} vs {other_run} {other.config.get(key)}")
    elif (mine.config is None) != (other.config is None):
        details.append(f"server config: {run if mine.config is None else other_run} was not sampled")
    if mine.fingerprints and other.fingerprints and set(mine.fingerprints) != set(other.fingerprints):
        mine_text, other_text = _listed(sorted(mine.fingerprints)), _listed(sorted(other.fingerprints))
        details.append(f"system_fingerprint: {run} {mine_text} vs {other_run} {other_text}")
    return [Finding(kind="differs_from_other_run", detail=detail) for detail in details]


async def audit_run(
    database: Database, run: str, *, against: str | None = None, run_gap_s: float = 900.0, refresh: bool = True
) -> AuditReport:
    """`refresh`: catch the projections up first (False where a follower does, or the caller just did)."""
    (row,) = await runs_report(database, run=run, run_gap_s=run_gap_s, refresh=refresh)  # NotFound if no run
    async with database.engine.connect() as conn:
        samples = await load_samples(conn)
    facts, findings = await _facts(database, row, run_gap_s, samples)
    if against is not None:
        (other_row,) = await runs_report(database, run=against, run_gap_s=run_gap_s, refresh=False)
        other, _ = await _facts(database, other_row, run_gap_s, samples)
        findings += _differences(run, facts, against, other)
    return AuditReport(run=run, against=against, findings=findings)

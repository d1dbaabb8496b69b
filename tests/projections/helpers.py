"""Building gateway-shaped events directly (projections never import the gateway)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallFailed, CallFinished, CallStarted, NewEvent, Timings, Usage, new_event
from usage_ledger.ledger.read import head_position
from usage_ledger.ledger.schema import checkpoints
from usage_ledger.projections.engine import PROJECTIONS, live_version

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def started(call_id: str, t: float, *, run: str | None = None, ticker: str | None = None, model: str = "m") -> NewEvent:
    tags = {"ticker": ticker} if ticker else {}
    body = CallStarted(
        call_id=call_id, received_at=at(t), method="POST", path="/v1/chat/completions", run=run, tags=tags, model=model
    )
    return new_event(body, stream=f"call-{call_id}", occurred_at=at(t))


def finished(
    call_id: str,
    t0: float,
    t1: float,
    *,
    prompt: int = 1000,
    completion: int = 101,
    status: int = 200,
    ttft: float = 0.5,
    request_metrics: dict[str, Any] | None = None,
    reasons: tuple[str, ...] = (),
    choices: tuple[int | None, ...] = (),
) -> NewEvent:
    timings = Timings(
        received=at(t0),
        upstream_headers=at(t0 + 0.1),
        first_token=at(t0 + ttft),
        last_token=at(t1 - 0.1),
        finished=at(t1),
    )
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    body = CallFinished(
        call_id=call_id,
        status=status,
        usage=usage,
        usage_source="reported",
        timings=timings,
        request_metrics=request_metrics,
        finish_reasons=list(reasons),
        finish_choices=list(choices),
    )
    return new_event(body, stream=f"call-{call_id}", occurred_at=at(t1))


def failed(call_id: str, t0: float, t1: float) -> NewEvent:
    body = CallFailed(
        call_id=call_id,
        phase="connect",
        reason="upstream_unreachable",
        client_status=502,
        timings=Timings(received=at(t0), finished=at(t1)),
    )
    return new_event(body, stream=f"call-{call_id}", occurred_at=at(t1))


def spec_metrics(draft: int, accepted: int, steps: int) -> dict[str, Any]:
    """A `request_metrics` with vLLM's per-request speculative-decoding block (as 0.32 sends it)."""
    block = {
        "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / draft if draft else 0.0,
        "acceptance_histogram": [steps - min(steps, accepted), min(steps, accepted)],
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": draft,
        "num_spec_tokens": 2,
    }
    return {"time_to_first_token_ms": 12.5, "speculative_decoding": block}


async def append(database: Database, *events: NewEvent) -> None:
    await append_events(database, list(events))


async def append_plain_calls(database: Database, count: int, *, batch: int = 500) -> None:
    """`count` plain calls (`c00000`…, each started at second i and finished at i + 1), `batch` calls an append."""
    for first in range(0, count, batch):
        calls = range(first, min(first + batch, count))
        await append(
            database, *(started(f"c{i:05d}", i) for i in calls), *(finished(f"c{i:05d}", i, i + 1) for i in calls)
        )


async def projection_lag(database: Database) -> tuple[int, dict[str, int]]:
    """The head position and each live projection's checkpoint."""
    out = {}
    async with database.engine.connect() as conn:
        head = await head_position(conn)
        for name in PROJECTIONS:
            version, _ = await live_version(conn, name)
            found = await conn.execute(
                select(checkpoints.c.position).where(checkpoints.c.projection == name, checkpoints.c.version == version)
            )
            out[name] = found.scalar_one_or_none() or 0
    return head, out


async def assert_projections_at_head(database: Database) -> int:
    """Every live projection's checkpoint is the head; returns the head."""
    head, at_ = await projection_lag(database)
    assert at_ == dict.fromkeys(PROJECTIONS, head), (head, at_)
    return head


async def projection_digests(database: Database) -> dict[str, str]:
    """Each live projection's digest of its rows (equal digests: equal read models)."""
    out = {}
    async with database.engine.connect() as conn:
        for name, projection in PROJECTIONS.items():
            version, _ = await live_version(conn, name)
            out[name] = await projection.digest(conn, version)
    return out

"""`ledger verify --read-models` (issue #52, 8): a stored read model edited behind the ledger's back is found and
its rows named; an intact one passes; nothing is left behind. On both backends.

Before: `projection_calls.output_tokens × 1000` with half its rows deleted passed `ledger verify` and
`projections status`, and reports showed the forged numbers."""

from __future__ import annotations

import asyncio
import json

from sqlalchemy import literal, select

from tests.ledger.helpers import build_ledger, migrated
from tests.ledger.test_bad_input import ledger_cli
from tests.projections.helpers import append, append_plain_calls, projection_digests, started
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.schema import checkpoints
from usage_ledger.projections import catch_up_all, live_version, verify_read_models
from usage_ledger.projections.tables import calls

CALLS = 40


async def _seed(database: Database) -> None:
    await append_plain_calls(database, CALLS, batch=10)
    await append(database, started("unfinished", 100))  # a row the fold makes from one event
    await catch_up_all(database)


async def _versions(database: Database) -> set[tuple[str, int]]:
    async with database.engine.connect() as conn:
        return {tuple(r) for r in await conn.execute(select(checkpoints.c.projection, checkpoints.c.version))}


async def test_an_intact_read_model_passes_and_leaves_nothing_behind(database: Database) -> None:
    await _seed(database)
    before, digests = await _versions(database), await projection_digests(database)
    checks = await verify_read_models(database)
    assert {c.name for c in checks} == {"calls", "annotations"}
    assert all(c.ok and c.stored_digest == c.folded_digest and c.differing_rows == 0 for c in checks), checks
    assert await _versions(database) == before and await projection_digests(database) == digests


async def test_an_edited_read_model_is_found_and_its_rows_named(database: Database) -> None:
    await _seed(database)
    async with database.engine.begin() as conn:
        version, _ = await live_version(conn, "calls")
        live = calls.c.version == version
        await conn.execute(calls.update().where(live).values(output_tokens=calls.c.output_tokens * 1000))
        await conn.execute(calls.delete().where(live, calls.c.call_id < "c00020"))
    (checked,) = await verify_read_models(database, ["calls"])
    assert not checked.ok and checked.stored_digest != checked.folded_digest
    assert checked.differing_rows == CALLS  # 20 deleted, 20 forged (the unfinished call has no tokens to forge)
    assert [r.key for r in checked.rows] == [f"c{i:05d}" for i in range(20)]
    assert {r.problem for r in checked.rows} == {"missing"}


async def test_a_forged_row_says_which_columns_differ_and_an_inserted_one_is_extra(database: Database) -> None:
    await _seed(database)
    async with database.engine.begin() as conn:
        version, _ = await live_version(conn, "calls")
        await conn.execute(
            calls.update()
            .where(calls.c.version == version, calls.c.call_id == "c00007")
            .values(output_tokens=calls.c.output_tokens * 1000)
        )
        forged = [literal("zz-forged").label("call_id") if c.name == "call_id" else c for c in calls.c]
        await conn.execute(
            calls.insert().from_select(
                list(calls.c.keys()), select(*forged).where(calls.c.version == version, calls.c.call_id == "c00001")
            )
        )
    (checked,) = await verify_read_models(database, ["calls"])
    assert not checked.ok and checked.differing_rows == 2
    assert [(r.key, r.problem) for r in checked.rows] == [("c00007", "differs: output_tokens"), ("zz-forged", "extra")]


def test_the_command_exits_1_and_names_the_rows(backend_url: str) -> None:
    asyncio.run(build_ledger(backend_url, _seed))
    intact = ledger_cli("verify", "--db", backend_url, "--read-models")
    assert intact.returncode == 0, intact.stdout + intact.stderr
    assert "read model calls (version 1, up to position 81): equal to the events folded again" in intact.stdout

    async def forge() -> None:
        async with migrated(backend_url) as database, database.engine.begin() as conn:
            await conn.execute(calls.update().values(output_tokens=calls.c.output_tokens * 1000))
            await conn.execute(calls.delete().where(calls.c.call_id >= "c00030"))  # and "unfinished"

    asyncio.run(forge())
    plain = ledger_cli("verify", "--db", backend_url)
    assert plain.returncode == 0  # the chain is intact: without --read-models nothing is compared
    result = ledger_cli("verify", "--db", backend_url, "--read-models")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "read model calls (version 1, up to position 81) DIFFERS: 41 row(s)" in result.stdout
    assert "  c00000: differs: output_tokens" in result.stdout and "... and 21 more" in result.stdout
    report = json.loads(ledger_cli("verify", "--db", backend_url, "--read-models", "--format", "json").stdout)
    (model,) = [m for m in report["read_models"] if m["name"] == "calls"]
    assert model["ok"] is False and model["differing_rows"] == 41 and len(model["rows"]) == 20
    assert {r["problem"] for r in model["rows"]} == {"differs: output_tokens"}
    assert report["chain_ok"] is True

"""Two appenders in two processes on one database produce one valid chain with no gaps."""

from __future__ import annotations

import asyncio
import sys
import textwrap

from usage_ledger.ledger.db import Database
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.verify import verify_chain

APPENDER = textwrap.dedent(
    """
    import asyncio, sys
    from usage_ledger.ledger.append import append_events
    from usage_ledger.ledger.db import open_database
    from tests.ledger.helpers import call_events

    async def main(url: str, worker: int) -> None:
        database = open_database(url)
        for batch in range(40):
            await append_events(database, call_events(worker * 10_000 + batch) * 1)
        await database.dispose()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


async def test_two_processes_append_one_chain(database: Database) -> None:
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", APPENDER, database.url, str(worker), stderr=asyncio.subprocess.PIPE
        )
        for worker in (1, 2)
    ]
    for worker in workers:
        _, stderr = await asyncio.wait_for(worker.communicate(), 120)
        assert worker.returncode == 0, stderr.decode()
    report = await verify_chain(database)
    assert report.ok, report
    assert report.checked == report.head_position == 2 * 40 * 2
    calls = [e.stream async for e in iter_events(database)]
    assert len(set(calls)) == 80  # every call of both workers, none lost

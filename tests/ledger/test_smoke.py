from __future__ import annotations

from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallStarted, new_event, utc_now
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.verify import verify_chain


async def test_append_read_verify(database: Database) -> None:
    batch = [
        new_event(CallStarted(call_id=f"c{i}", received_at=utc_now(), method="POST", path="/v1/x"), stream=f"call-c{i}")
        for i in range(5)
    ]
    result = await append_events(database, batch)
    assert (result.appended, result.last_position) == (5, 5)
    again = await append_events(database, batch)
    assert (again.appended, again.duplicates) == (0, 5)
    stored = [e async for e in iter_events(database)]
    assert [e.position for e in stored] == [1, 2, 3, 4, 5]
    assert [e.body() for e in stored] == [n.body for n in batch]
    report = await verify_chain(database)
    assert report.ok and report.checked == 5

"""`wait_up_to`: a time limit that never drops a cancel (the followers and shutdowns wait with it)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from usage_ledger.ledger.waiting import wait_up_to

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("usage_ledger",)  # every layer lives under it


async def test_it_says_whether_the_awaitable_finished_in_time() -> None:
    done = asyncio.Event()
    done.set()
    assert await wait_up_to(done.wait(), 5.0) is True
    never = asyncio.Event()
    waiter = asyncio.ensure_future(never.wait())
    assert await wait_up_to(waiter, 0.01) is False
    assert waiter.cancelled()


@pytest.mark.parametrize("turns", range(8))
async def test_a_cancel_is_kept_however_close_it_comes_to_the_event(turns: int) -> None:
    """A follower's loop, woken by an event set before it waits and cancelled `turns` loop turns
    later. `asyncio.wait_for` on Python 3.11 returns the event's result when the cancel lands
    between the event's waiter finishing and its own resumption (turns 1-3 here), and the loop
    runs on."""
    wake = asyncio.Event()
    wake.set()
    rounds = 0

    async def follower() -> None:
        nonlocal rounds
        while rounds < 3:
            await wait_up_to(wake.wait(), 0.5)
            wake.clear()
            rounds += 1

    task = asyncio.create_task(follower())
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rounds <= 1


def _calls_wait_for(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "wait_for":
            return True
        if isinstance(node, ast.ImportFrom) and any(alias.name == "wait_for" for alias in node.names):
            return True
    return False


def test_no_product_code_waits_with_asyncio_wait_for() -> None:
    modules = [p for package in PRODUCT for p in sorted((ROOT / package).rglob("*.py"))]
    assert [str(p.relative_to(ROOT)) for p in modules if _calls_wait_for(p)] == []


def test_the_wait_for_check_sees_a_call(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import asyncio\nasync def f(e):\n    await asyncio.wait_for(e.wait(), 1)\n")
    assert _calls_wait_for(module)

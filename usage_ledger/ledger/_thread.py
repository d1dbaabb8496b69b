"""A `sqlite3` connection on its own thread, fed through a queue, and lent whole to one caller at a time.

`ThreadConnection` runs each job it is given in order; `lend` hands the thread to one caller until
`Loan.end`: the loan's steps run there and nothing else does (other jobs wait in the queue behind
it). A write transaction that spans several of the caller's steps (`SqliteAppender.stream`) needs
that: a job of another caller run in between would land inside the transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar, cast

__all__ = ("Loan", "ThreadConnection", "settle")

T = TypeVar("T")
_Job = tuple[
    Callable[..., Any], tuple[Any, ...], "asyncio.AbstractEventLoop | None", "asyncio.Future[Any] | Future[Any]"
]
_Jobs = queue.SimpleQueue["_Job | None"]


class ThreadConnection:
    """One `sqlite3` connection, opened lazily and used only on this object's own thread.

    Work reaches the thread through a plain queue and its result comes back to the event loop with
    one `call_soon_threadsafe`. `run_in_executor` on a `ThreadPoolExecutor` chained a
    `concurrent.futures.Future` to an asyncio one through a condition variable and callbacks on
    both sides: ≈ 8% of the gateway's CPU per non-stream call, which appends twice (an estimate
    from a throwaway driver, not a project command: docs/BENCHMARKS.md, Gateway, fifth session).
    """

    def __init__(self, path: str, synchronous: str, thread_name: str) -> None:
        self.path = path
        self.synchronous = synchronous
        self._conn: sqlite3.Connection | None = None
        self._jobs: _Jobs = queue.SimpleQueue()
        self._closed = False
        # a daemon: a database never disposed must not keep the interpreter from exiting
        self._thread = threading.Thread(target=_run_all, args=(self._jobs,), name=thread_name, daemon=True)
        self._thread.start()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the thread. Cancelling the caller does not stop the work, queued or started:
        an append the caller gave up on may still commit, as one already running always could."""
        return await _ask(self._open_jobs(), fn, args)

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """`fn(*args)` on the thread, from any thread (no event loop needed)."""
        future: Future[T] = Future()
        self._open_jobs().put((fn, args, None, future))
        return future

    def lend(self, finish: Callable[[], object]) -> Loan:
        """The thread for one caller alone, from when the jobs queued before it are done until `Loan.end`,
        which runs `finish` there last (whatever the loan's steps did or failed to do)."""
        loan = Loan(finish)
        self._open_jobs().put((loan.serve, (), None, Future()))
        return loan

    def _open_jobs(self) -> _Jobs:
        if self._closed:
            raise RuntimeError(f"{self._thread.name} is closed")
        return self._jobs

    def close(self) -> None:
        """Close the connection on its thread, then end the thread."""
        if self._closed:
            return
        self._submit(self._reset).result()
        self._closed = True
        self._jobs.put(None)
        self._thread.join()

    def _reset(self) -> None:
        """Forget the connection (on its thread); the next use reconnects."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class Loan:
    """A `ThreadConnection`'s thread lent to one caller: `call` runs a step there; `end` gives the thread back."""

    def __init__(self, finish: Callable[[], object]) -> None:
        self._steps: _Jobs = queue.SimpleQueue()
        self._finish = finish
        self._ended = False

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the lent thread, after the loan's earlier steps (cancelling does not stop it)."""
        if self._ended:
            raise RuntimeError("the loan of the appender's thread has ended")
        return await _ask(self._steps, fn, args)

    def end(self) -> None:
        """Run `finish` on the thread after the steps queued, then let it serve everyone again (no waiting:
        whatever is queued on the thread next runs after `finish`)."""
        if self._ended:
            return
        self._ended = True
        self._steps.put((self._finish, (), None, Future()))
        self._steps.put(None)

    def serve(self) -> None:
        """On the thread: the loan's steps until `end`."""
        _run_all(self._steps)


async def _ask(jobs: _Jobs, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    jobs.put((fn, args, loop, future))
    return await future


def _run_all(jobs: _Jobs) -> None:
    while (job := jobs.get()) is not None:
        fn, args, loop, future = job
        if loop is None and not cast("Future[Any]", future).set_running_or_notify_cancel():
            continue  # a `_submit` future cancelled while queued: skipped, as an executor would
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # handed to the caller, as an executor would
            result, error = None, exc
        if loop is None:
            settle(cast("Future[Any]", future), result, error)
        else:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                loop.call_soon_threadsafe(settle, future, result, error)


def settle(future: asyncio.Future[Any] | Future[Any], result: Any, error: BaseException | None) -> None:
    """Give `future` its outcome unless its caller already gave up on it (cancelled)."""
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)

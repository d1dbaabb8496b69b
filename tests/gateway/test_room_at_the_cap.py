"""Which connection `ServerState.make_room` closes at the cap: a property test of its lazy heap of bodies.

Bodies begin, read more (their pace only moves later), end and begin again in any order, the clock moves,
and at any moment the connection closed for room is one furthest behind the minimum rate — or none, when
no body is behind — as a scan of every connection would choose; waiting connections compete by how long
they have waited.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import make_settings
from usage_ledger.gateway._http.state import ServerState
from usage_ledger.gateway.limits import ServerLimits
from usage_ledger.gateway.metrics import Metrics

CONNECTIONS = 6


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def time(self) -> float:
        return self.now


class Conn:
    """What `make_room` sees of a connection: its pace while a body is under way, its ticket, `shed`."""

    def __init__(self) -> None:
        self.body_ticket: int | None = None
        self.body_pace: float | None = None
        self.shed_count = 0

    @property
    def idle(self) -> bool:
        return False

    def pace(self, now: float) -> float | None:
        return self.body_pace

    def shed(self) -> None:
        self.shed_count += 1
        self.body_pace = None  # a shed body is cut: it has no pace any more

    def close(self) -> None: ...

    def abort(self) -> None: ...


async def _handler(request: Any, exchange: Any) -> None: ...


operations = st.lists(
    st.tuples(
        st.sampled_from(["begin", "read", "end", "tick", "room", "wait", "busy"]),
        st.integers(0, CONNECTIONS - 1),
        st.floats(0, 5, allow_nan=False),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations)
async def test_make_room_closes_the_longest_waiting_or_the_body_furthest_behind(
    ops: list[tuple[str, int, float]],
) -> None:
    state = ServerState(_handler, ServerLimits.from_settings(make_settings()), Metrics())
    clock = Clock()
    state.loop = clock  # type: ignore[assignment]
    conns = [Conn() for _ in range(CONNECTIONS)]
    for conn in conns:
        state.connections.add(conn)
    for op, index, amount in ops:
        conn = conns[index]
        if op == "begin" and conn.body_pace is None and conn not in state.waiting:
            conn.body_ticket = None  # as `on_headers_complete`: a new body
            conn.body_pace = clock.now + amount - 2.5  # begun behind or ahead
            state.body_begun(conn, conn.body_pace)
        elif op == "read" and conn.body_pace is not None:
            conn.body_pace += amount
        elif op in ("end", "busy"):
            conn.body_pace = None
            state.waiting.pop(conn, None)
        elif op == "wait" and conn.body_pace is None and conn not in state.waiting:
            state.waiting[conn] = clock.now
        elif op == "tick":
            clock.now += amount
        elif op == "room":
            waited = [clock.now - since for since in state.waiting.values()]
            behind = [clock.now - c.body_pace for c in conns if c.body_pace is not None]
            most_behind = max(behind, default=0.0)
            longest = max(waited, default=-1.0)
            shed_before = [c.shed_count for c in conns]
            lateness = {id(c): clock.now - c.body_pace for c in conns if c.body_pace is not None}
            waiting_for = {id(c): clock.now - since for c, since in state.waiting.items()}
            made = state.make_room()
            shed = [c for c, before in zip(conns, shed_before, strict=True) if c.shed_count > before]
            if most_behind > 0 and most_behind > longest:
                assert made and len(shed) == 1 and lateness[id(shed[0])] == most_behind
            elif longest >= 0:
                assert made and len(shed) == 1 and waiting_for[id(shed[0])] == longest
            else:
                assert not made and not shed
            for victim in shed:  # its slot went to a newcomer; the test's connection comes back as a new one
                state.connections.add(victim)
    assert len(state.bodies) <= 2 * len(state.connections) + 64 + 1

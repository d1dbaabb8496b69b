"""Token guesses at the dashboard's login are slowed down per client (#52 point 9): 300 wrong tokens took
2.3 s; now after `FREE_GUESSES` each wrong one shuts the door for twice as long, answered 429 with Retry-After,
the token not even compared while it is shut."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient

from usage_ledger.ledger.db import Database
from usage_ledger.ledger.guesses import FORGET_S, FREE_GUESSES, MAX_LOCK_S, GuessLimiter
from usage_ledger.projections.settings import ReportSettings
from usage_ledger.ui.auth import COOKIE
from usage_ledger.ui.routers import create_ui_app

TOKEN = "t0ken"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_door_shuts_for_twice_as_long_after_each_wrong_guess_past_the_free_ones() -> None:
    clock = Clock()
    limiter = GuessLimiter(clock)
    for _ in range(FREE_GUESSES):
        assert limiter.wait_s("a") == 0
        limiter.failed("a")
    assert limiter.wait_s("a") == 0
    waits = []
    for _ in range(12):
        limiter.failed("a")
        waits.append(limiter.wait_s("a"))
        clock.now += waits[-1]  # the guesser waits exactly as long as told
        assert limiter.wait_s("a") == 0
    assert waits == [1, 2, 4, 8, 16, 32, 64, 128, 256, MAX_LOCK_S, MAX_LOCK_S, MAX_LOCK_S]
    assert limiter.wait_s("b") == 0  # per client
    limiter.succeeded("a")
    limiter.failed("a")
    assert limiter.wait_s("a") == 0  # a right token cleared the count


def test_a_client_that_stops_guessing_is_forgotten() -> None:
    clock = Clock()
    limiter = GuessLimiter(clock)
    for _ in range(FREE_GUESSES + 3):
        limiter.failed("a")
    clock.now += FORGET_S + 1
    limiter.failed("a")
    assert limiter.wait_s("a") == 0


@given(st.lists(st.sampled_from(["fail", "ok", "wait"]), max_size=60))
def test_the_wait_is_never_negative_nor_past_the_cap(steps: list[str]) -> None:
    clock = Clock()
    limiter = GuessLimiter(clock)
    for step in steps:
        if step == "fail":
            limiter.failed("a")
        elif step == "ok":
            limiter.succeeded("a")
        else:
            clock.now += 7.5
        assert 0 <= limiter.wait_s("a") <= MAX_LOCK_S


async def test_the_login_form_answers_429_past_the_free_guesses_even_for_the_right_token(database: Database) -> None:
    app = create_ui_app(database, ReportSettings(), admin_token=TOKEN, refresh=False)
    async with AsyncTestClient(app) as client:
        form = {"next": "/_ledger/ui/"}
        for _ in range(FREE_GUESSES):
            wrong = await client.post("/_ledger/ui/login", data={**form, "token": "guess"})
            assert wrong.status_code == 401
        shut = await client.post("/_ledger/ui/login", data={**form, "token": "guess"})
        assert shut.status_code == 401  # this wrong guess shuts the door
        for token in ("guess", TOKEN):
            refused = await client.post("/_ledger/ui/login", data={**form, "token": token}, follow_redirects=False)
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1, token
            assert "Too many wrong tokens" in refused.text and COOKIE not in refused.cookies


async def test_bearer_guesses_at_the_json_endpoints_are_slowed_down_as_the_forms(database: Database) -> None:
    """Before, `Authorization: Bearer` guesses at `/_ledger/ui/api/*` were unlimited (only the form was slowed)."""
    app = create_ui_app(database, ReportSettings(), admin_token=TOKEN, refresh=False)
    async with AsyncTestClient(app) as client:
        for _ in range(FREE_GUESSES + 1):  # the last shuts the door
            wrong = await client.get("/_ledger/ui/api/daily", headers={"authorization": "Bearer guess"})
            assert wrong.status_code == 401
        for token in ("guess", TOKEN):
            refused = await client.get("/_ledger/ui/api/daily", headers={"authorization": f"Bearer {token}"})
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1, token
        # the form counts the same guesses: its door is shut too
        shut = await client.post("/_ledger/ui/login", data={"next": "/_ledger/ui/", "token": TOKEN})
        assert shut.status_code == 429

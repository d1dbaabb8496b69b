"""A facility a test needs but this machine does not give (a tmpfs mount, `chattr +i`): the test skips on a
developer's machine and fails in CI (`CI=true`), like the PostgreSQL, vLLM and browser tiers
(`LEDGER_TEST_REQUIRE_PG` in tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import NoReturn

import pytest

__all__ = ("in_ci", "required", "unavailable")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def unavailable(why: str) -> NoReturn:
    """Skip with `why`; in CI, fail with it instead (a test CI must run never passes by skipping)."""
    if in_ci():
        pytest.fail(f"{why} (CI=true: this test must run in CI)", pytrace=False)
    pytest.skip(why)


@contextlib.contextmanager
def required() -> Iterator[None]:
    """Around a helper that skips when it cannot get its facility (`tests.reliability.helpers.tmpfs`):
    its skip becomes `unavailable`, a failure in CI."""
    try:
        yield
    except pytest.skip.Exception as exc:
        unavailable(str(exc.msg))

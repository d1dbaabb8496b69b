"""`tests._required`: a facility a test cannot get skips it on a developer's machine and fails it in CI."""

from __future__ import annotations

import pytest

from tests._required import unavailable


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_missing_facility_fails_in_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="no chattr"):
        unavailable("no chattr")
    with pytest.raises(pytest.fail.Exception, match="no chdb"):
        unavailable("no chdb", required=True)

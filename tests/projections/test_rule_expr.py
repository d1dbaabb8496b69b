"""Each rule `call_rules` writes once as an expression gives in Python (`python`, what the fold runs) exactly what
SQLite and PostgreSQL compute for its SQL (`sql`, what the bulk rebuild splices in), NULLs included."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from usage_ledger.ledger.db import Database
from usage_ledger.projections.call_rules import (
    DECODE_TPS,
    ENDED_AT,
    FINISHED_STATUS,
    PREFILL_TPS,
    decode_tps,
    finished_status,
    prefill_tps,
)
from usage_ledger.projections.rule_expr import Expr, all_of, case, coalesce, differs, value

_INTEGERS = st.none() | st.integers(-(10**12), 10**12) | st.sampled_from([-1, 0, 1, 2, 199, 200, 399, 400])
_SECONDS = st.none() | st.floats(1e-6, 1e6) | st.floats(-1e6, -1e-6) | st.sampled_from([0.0, -0.0, 1e-6, 0.5])
"""Values as the bulk SQL's columns hold them (integers for tokens and statuses, floats for seconds: a
duration is whole microseconds, so none is subnormal and no rate overflows a double);
moments stand in as integers (the rule only orders its choice, `coalesce`)."""

RULES: dict[str, tuple[Expr, dict[str, tuple[str, st.SearchStrategy[Any]]]]] = {
    "finished_status": (FINISHED_STATUS, {"http_status": ("BIGINT", _INTEGERS)}),
    "ended_at": (ENDED_AT, {name: ("BIGINT", _INTEGERS) for name in ("finished", "last_token", "headers", "received")}),
    "prefill_tps": (PREFILL_TPS, {"input_tokens": ("BIGINT", _INTEGERS), "ttft_s": ("DOUBLE PRECISION", _SECONDS)}),
    "decode_tps": (DECODE_TPS, {"output_tokens": ("BIGINT", _INTEGERS), "decode_s": ("DOUBLE PRECISION", _SECONDS)}),
}

_x, _y = value("x"), value("y")
_SEMANTICS = case(
    (all_of(_x > 1, differs(_y, 0)), _x * 2 + _y),
    (all_of(_x <= 1, _y >= 0), coalesce(value("z"), _y - _x)),
    (_y - _x < 0, coalesce(_y * _x, value("z") * -1)),
    otherwise=-7,
)
"""Every node and operator of `rule_expr` in one expression (beyond what the rules above use)."""
_SMALL = st.none() | st.integers(-(10**6), 10**6) | st.sampled_from([-1, 0, 1, 2])
"""Its values: small enough that no product overflows PostgreSQL's BIGINT."""


async def _sql_values(database: Database, rule: Expr, types: dict[str, str], rows: list[dict[str, Any]]) -> list[Any]:
    names = {name: f"CAST(:{name} AS {sql_type})" for name, sql_type in types.items()}
    statement = text(f"SELECT {rule.sql(**names)}")
    async with database.engine.connect() as conn:
        return [(await conn.execute(statement, row)).scalar_one() for row in rows]


@pytest.mark.parametrize("name", RULES)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
async def test_a_rule_runs_in_python_as_its_sql_computes(database: Database, name: str, data: st.DataObject) -> None:
    rule, inputs = RULES[name]
    row = st.fixed_dictionaries({key: strategy for key, (_, strategy) in inputs.items()})
    rows = data.draw(st.lists(row, min_size=1, max_size=25))
    expected = await _sql_values(database, rule, {key: sql_type for key, (sql_type, _) in inputs.items()}, rows)
    function = rule.python(*inputs)
    assert [function(**row) for row in rows] == expected


_TRUTH = all_of(_x > 1, _y < 0, differs(value("z"), 0))
"""`all_of` and comparisons as values, not `case` conditions: SQL's three-valued logic (SQLite answers 0 / 1)."""


@pytest.mark.parametrize("expression", [_SEMANTICS, _TRUTH], ids=["every node", "conditions as values"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.fixed_dictionaries({"x": _SMALL, "y": _SMALL, "z": _SMALL}), min_size=1, max_size=25))
@example(rows=[{"x": None, "y": 0, "z": 1}, {"x": 2, "y": None, "z": None}, {"x": 0, "y": 3, "z": None}])
@example(rows=[{"x": None, "y": -1, "z": 1}, {"x": None, "y": 1, "z": 1}, {"x": 2, "y": -1, "z": 3}])
async def test_every_node_keeps_sqls_null_rules(
    database: Database, expression: Expr, rows: list[dict[str, Any]]
) -> None:
    cast = {key: "BIGINT" for key in ("x", "y", "z")}
    function = expression.python("x", "y", "z")
    assert [function(**row) for row in rows] == await _sql_values(database, expression, cast, rows)


def test_the_sql_is_what_the_rebuild_splices_in() -> None:
    assert PREFILL_TPS.sql() == "CASE WHEN ttft_s > 0 AND input_tokens <> 0 THEN input_tokens / ttft_s END"
    assert DECODE_TPS.sql() == "CASE WHEN decode_s > 0 AND output_tokens > 1 THEN (output_tokens - 1) / decode_s END"
    assert FINISHED_STATUS.sql(http_status="e.http_status") == (
        "CASE WHEN e.http_status >= 200 AND e.http_status < 400 THEN 'ok' ELSE 'error' END"
    )
    assert case((value("a") > 0, "it's")).sql() == "CASE WHEN a > 0 THEN 'it''s' END"


def test_a_boolean_literal_is_refused() -> None:
    with pytest.raises(TypeError, match="boolean"):
        case((value("a") > 0, True))


@pytest.mark.parametrize(
    ("http_status", "status"), [(199, "error"), (200, "ok"), (302, "ok"), (399, "ok"), (400, "error")]
)
def test_an_answered_call_is_ok_for_2xx_and_3xx(http_status: int, status: str) -> None:
    assert finished_status(http_status) == status


def test_the_rates_divide_only_by_an_interval() -> None:
    assert prefill_tps(100, 0.5) == 200.0
    assert prefill_tps(100, 0.0) is None and prefill_tps(100, None) is None and prefill_tps(0, 0.5) is None
    assert decode_tps(11, 2.0) == 5.0
    assert decode_tps(1, 2.0) is None and decode_tps(11, 0.0) is None and decode_tps(11, None) is None


def test_a_function_takes_exactly_the_values_its_expression_reads() -> None:
    with pytest.raises(ValueError, match=r"reads \['decode_s', 'output_tokens'\]"):
        DECODE_TPS.python("output_tokens")
    with pytest.raises(ValueError, match="identifier"):
        value("e.http_status")

"""Answers: what reads the read models to answer a question (reports, eras, compare, agreement, decide,
audit, exports, the JSON API); none appends an event or writes a read model. Imports `projections` and `ledger` only."""

from __future__ import annotations

from usage_ledger.answers._aggregate import run_filter
from usage_ledger.answers.agreement import Agreement, agreement_report, parse_where
from usage_ledger.answers.agreement_labels import labels_from_ledger
from usage_ledger.answers.agreement_text import regex_extractor
from usage_ledger.answers.api import build_api_routers, error_response, split_runs
from usage_ledger.answers.audit import audit_run
from usage_ledger.answers.bootstrap import Evidence
from usage_ledger.answers.callviews import calls_page, get_call, iter_calls
from usage_ledger.answers.clickhouse_sink import DEFAULT_TABLE, clickhouse_schema
from usage_ledger.answers.compare import compare_runs, render_comparison
from usage_ledger.answers.compare_latency import tpot_s
from usage_ledger.answers.comparison import Comparison, metric_values
from usage_ledger.answers.csv_cells import csv_cell
from usage_ledger.answers.decide import LATENCY_FIGURES, Decision, GroupFigures, decide
from usage_ledger.answers.decide_answers import RunAnswer, key_answers
from usage_ledger.answers.decide_evidence import ICSeries
from usage_ledger.answers.eras import EraRow, era_of, eras_report, group_of
from usage_ledger.answers.export import Body, export_calls, show_call, show_run
from usage_ledger.answers.filters import (
    NO_FILTER,
    STATUS_PATTERN,
    WHEN_SCHEMA,
    ZONE_NAMES,
    CallFilter,
    filter_clauses,
    parse_filter,
)
from usage_ledger.answers.reports import (
    daily_report,
    live_versions,
    recompute_report,
    runs_report,
    tickers_report,
    weekday_mean,
)
from usage_ledger.answers.retention import BodySelection, ErasurePlan, plan_erasure
from usage_ledger.answers.zones import in_zone, parse_zone

__all__ = (
    "DEFAULT_TABLE",
    "LATENCY_FIGURES",
    "NO_FILTER",
    "STATUS_PATTERN",
    "WHEN_SCHEMA",
    "ZONE_NAMES",
    "Agreement",
    "Body",
    "BodySelection",
    "CallFilter",
    "Comparison",
    "Decision",
    "EraRow",
    "ErasurePlan",
    "Evidence",
    "GroupFigures",
    "ICSeries",
    "RunAnswer",
    "agreement_report",
    "audit_run",
    "build_api_routers",
    "calls_page",
    "clickhouse_schema",
    "compare_runs",
    "csv_cell",
    "daily_report",
    "decide",
    "era_of",
    "eras_report",
    "error_response",
    "export_calls",
    "filter_clauses",
    "get_call",
    "group_of",
    "in_zone",
    "iter_calls",
    "key_answers",
    "labels_from_ledger",
    "live_versions",
    "metric_values",
    "parse_filter",
    "parse_where",
    "parse_zone",
    "plan_erasure",
    "recompute_report",
    "regex_extractor",
    "render_comparison",
    "run_filter",
    "runs_report",
    "show_call",
    "show_run",
    "split_runs",
    "tickers_report",
    "tpot_s",
    "weekday_mean",
)

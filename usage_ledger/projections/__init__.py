"""Projections: the read-model engine. The events the ledger holds, folded into tables that can always be
rebuilt from them. Imports `ledger` only; what answers questions from these tables is `usage_ledger.answers`."""

from __future__ import annotations

from usage_ledger.projections.annotations import REPLAY_LABEL, labels_for_run, load_annotations
from usage_ledger.projections.call_fold import CallRow, decode_calls, fold_calls
from usage_ledger.projections.call_rules import (
    CALL_STATUSES,
    FAILED_STATUSES,
    NO_END_STATUS,
    NO_USAGE,
    TRUNCATED_REASONS,
    decode_rate_note,
)
from usage_ledger.projections.cost import (
    CURRENCY_LABEL,
    PRICE_LABEL,
    CostMeans,
    RunCost,
    cost_means,
    parse_price,
    run_cost,
)
from usage_ledger.projections.engine import (
    PROJECTIONS,
    catch_up_all,
    follow_projections,
    live_version,
    projection_named,
    projection_status,
    read_checkpoint,
    write_checkpoint,
)
from usage_ledger.projections.errors import ImportFailed, NotFound, ProjectionError
from usage_ledger.projections.formulas import FORMULAS, RunStats, get_formula
from usage_ledger.projections.rebuild import rebuild_projection, set_formula
from usage_ledger.projections.reconcile import RunSpan, ServerTraffic
from usage_ledger.projections.recorded import (
    Returns,
    parse_as_of,
    recorded_labels,
    recorded_return_values,
    recorded_returns,
)
from usage_ledger.projections.rows import (
    CallsPage,
    CallsPerTicker,
    CallView,
    DailyRow,
    RecomputeRow,
    RunRow,
    TickerRow,
    WeekdayRow,
)
from usage_ledger.projections.server import ServerBlock, SpecBlocks, load_samples, samples_of_run, server_block
from usage_ledger.projections.settings import ReportSettings
from usage_ledger.projections.text import projection_text, projection_text_or_none
from usage_ledger.projections.verify import ReadModelCheck, RowDifference, verify_read_models

__all__ = (
    "CALL_STATUSES",
    "CURRENCY_LABEL",
    "FAILED_STATUSES",
    "FORMULAS",
    "NO_END_STATUS",
    "NO_USAGE",
    "PRICE_LABEL",
    "PROJECTIONS",
    "REPLAY_LABEL",
    "TRUNCATED_REASONS",
    "CallRow",
    "CallView",
    "CallsPage",
    "CallsPerTicker",
    "CostMeans",
    "DailyRow",
    "ImportFailed",
    "NotFound",
    "ProjectionError",
    "ReadModelCheck",
    "RecomputeRow",
    "ReportSettings",
    "Returns",
    "RowDifference",
    "RunCost",
    "RunRow",
    "RunSpan",
    "RunStats",
    "ServerBlock",
    "ServerTraffic",
    "SpecBlocks",
    "TickerRow",
    "WeekdayRow",
    "catch_up_all",
    "cost_means",
    "decode_calls",
    "decode_rate_note",
    "fold_calls",
    "follow_projections",
    "get_formula",
    "labels_for_run",
    "live_version",
    "load_annotations",
    "load_samples",
    "parse_as_of",
    "parse_price",
    "projection_named",
    "projection_status",
    "projection_text",
    "projection_text_or_none",
    "read_checkpoint",
    "rebuild_projection",
    "recorded_labels",
    "recorded_return_values",
    "recorded_returns",
    "run_cost",
    "samples_of_run",
    "server_block",
    "set_formula",
    "verify_read_models",
    "write_checkpoint",
)

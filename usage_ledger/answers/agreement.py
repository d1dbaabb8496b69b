"""`ledger agreement`: how far repeated runs agree on a label per key, and how well each run's labels rank an
outcome (docs/decide.md). Labels come from `agreement_labels`, the statistics from `agreement_stats`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import msgspec

from usage_ledger.answers.agreement_labels import (
    NO_BODY,
    RunLabels,
    labels_from_csv,
    labels_from_ledger,
    read_outcomes,
)
from usage_ledger.answers.agreement_stats import check_scale, default_scale, quadratic_weighted_kappa, spearman
from usage_ledger.answers.agreement_text import (
    EXTRACT_TIMEOUT_S,
    LabelExtractor,
    pointer_extractor,
    regex_extractor,
)
from usage_ledger.ledger import Database
from usage_ledger.projections import ProjectionError

__all__ = (
    "Agreement",
    "AgreementPair",
    "AgreementReport",
    "agreement_report",
    "compute_agreement",
    "parse_scale",
    "parse_where",
)


class AgreementPair(msgspec.Struct, frozen=True, kw_only=True):
    a: str
    b: str
    n: int
    """Keys both runs labelled."""
    qwk: float | None
    raw_agree: int
    raw_total: int


class AgreementReport(msgspec.Struct, frozen=True, kw_only=True):
    """What `--format json` prints, exactly these four fields."""

    pairs: list[AgreementPair]
    mean_qwk: float | None
    distribution: dict[str, dict[str, int]]
    """run → label → how many keys, labels in scale order (zero counts included)."""
    rank_ic: dict[str, float | None]
    """run → Spearman's rho against the outcome; empty without outcomes."""


class Agreement(msgspec.Struct, frozen=True, kw_only=True):
    report: AgreementReport
    scale: list[str]
    runs: list[RunLabels]
    rank_ic_n: dict[str, int]
    """run → keys with both a label and an outcome."""
    notes: list[str]
    """Why a value is null, and runs whose keys have no stored body."""


def parse_scale(text: str) -> list[str]:
    """`--scale A,B,C` as its labels, lowest first; ProjectionError for an empty entry."""
    scale = [part.strip() for part in text.split(",")]
    if any(not part for part in scale):
        raise ProjectionError(f"--scale {text!r} has an empty label: give labels separated by commas, lowest first")
    return scale


def _coverage_note(run: RunLabels) -> str | None:
    missing = {why: n for why, n in run.unlabelled.items() if why in NO_BODY}
    if not missing:
        return None
    counts = ", ".join(f"{why} {n}" for why, n in sorted(missing.items()))
    return (
        f"{run.run}: {sum(missing.values())} of {run.keys} keys have no stored response body ({counts}); "
        "no label is read or guessed for them"
    )


def compute_agreement(
    runs: Sequence[RunLabels], *, scale: Sequence[str] | None = None, outcomes: dict[str, float] | None = None
) -> Agreement:
    """The report from labels already read; ProjectionError for labels outside an explicit scale."""
    every = [label for run in runs for label in run.labels.values()]
    if scale is None:
        ordered = default_scale(every)
    else:
        ordered = list(scale)
        check_scale(ordered, every)
    position = {label: i for i, label in enumerate(ordered)}
    notes = [note for run in runs if (note := _coverage_note(run)) is not None]
    notes += [
        f"{run.run}: the pattern was stopped after {EXTRACT_TIMEOUT_S:g} s on {len(run.timed_out)} answer(s), "
        f"left unlabelled: {', '.join(run.timed_out[:10])}{' …' if len(run.timed_out) > 10 else ''}; "
        "simplify the pattern (nested repeats such as (a|aa)+ backtrack without end)"
        for run in runs
        if run.timed_out
    ]
    notes += [f"{run.run}: no keys (no call selected carries the key tag)" for run in runs if not run.keys]
    if not every:
        notes.append("no run has a label: check the extraction (--extract / --extract-json) against `ledger show call`")
    pairs: list[AgreementPair] = []
    for first, second in itertools.combinations(runs, 2):
        common = sorted(first.labels.keys() & second.labels.keys())
        a = [first.labels[key] for key in common]
        b = [second.labels[key] for key in common]
        kappa = quadratic_weighted_kappa(a, b, ordered)
        if kappa.value is None:
            notes.append(f"QWK {first.run} vs {second.run}: {kappa.reason}")
        agree = sum(x == y for x, y in zip(a, b, strict=True))
        pairs.append(
            AgreementPair(
                a=first.run, b=second.run, n=len(common), qwk=kappa.value, raw_agree=agree, raw_total=len(common)
            )
        )
    kappas = [p.qwk for p in pairs if p.qwk is not None]
    mean_qwk = math.fsum(kappas) / len(kappas) if kappas else None
    if mean_qwk is None:
        notes.append("mean QWK: no pair has a kappa")
    elif len(kappas) < len(pairs):
        notes.append(f"mean QWK over the {len(kappas)} of {len(pairs)} pairs that have one")
    distribution = {run.run: dict.fromkeys(ordered, 0) for run in runs}
    for run in runs:
        for label in run.labels.values():
            distribution[run.run][label] += 1
    rank_ic: dict[str, float | None] = {}
    rank_ic_n: dict[str, int] = {}
    if outcomes is not None:
        for run in runs:
            keys = sorted(run.labels.keys() & outcomes.keys())
            rho = spearman([float(position[run.labels[k]]) for k in keys], [outcomes[k] for k in keys])
            rank_ic[run.run], rank_ic_n[run.run] = rho.value, len(keys)
            if rho.value is None:
                notes.append(f"rank IC {run.run}: {rho.reason}")
    report = AgreementReport(pairs=pairs, mean_qwk=mean_qwk, distribution=distribution, rank_ic=rank_ic)
    return Agreement(report=report, scale=ordered, runs=list(runs), rank_ic_n=rank_ic_n, notes=notes)


def _extractor(extract: str | None, pointer: str | None) -> LabelExtractor:
    if (extract is None) == (pointer is None):
        raise ProjectionError("give one of --extract REGEX, --extract-json POINTER or --labels FILE")
    return regex_extractor(extract) if extract is not None else pointer_extractor(pointer or "")


def parse_where(items: Sequence[str]) -> list[tuple[str, str]]:
    """`--where TAG=VALUE` items as pairs; tag names as stored (the gateway lower-cases `X-Ledger-Tag-*` names)."""
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ProjectionError(f"--where {item!r}: give TAG=VALUE (e.g. --where step=grade)")
        pairs.append((name.strip(), value))
    return pairs


async def agreement_report(
    database: Database | None,
    runs: Sequence[str],
    *,
    extract: str | None = None,
    extract_json: str | None = None,
    labels_file: Path | None = None,
    key: str = "ticker",
    where: Sequence[str] = (),
    scale: str | None = None,
    outcomes_file: Path | None = None,
    outcome_column: str | None = None,
    run_gap_s: float = 900.0,
) -> Agreement:
    """Labels from the ledger (`database`) or `labels_file`, then the report. ProjectionError for bad usage."""
    if len(runs) < 2:
        raise ProjectionError("agreement needs at least two runs")
    repeated = sorted({run for run in runs if runs.count(run) > 1})
    if repeated:
        raise ProjectionError(f"run {', '.join(map(repr, repeated))} given more than once")
    if (outcomes_file is None) != (outcome_column is None):
        raise ProjectionError("--outcomes FILE and --outcome-column COL go together")
    ordered = parse_scale(scale) if scale is not None else None
    outcomes = read_outcomes(outcomes_file, key, outcome_column or "") if outcomes_file is not None else None
    if labels_file is not None:
        if extract is not None or extract_json is not None:
            raise ProjectionError("--labels FILE replaces --extract / --extract-json: give one of them")
        if where:
            raise ProjectionError("--where selects calls in the ledger: it does not apply to --labels FILE")
        labelled = labels_from_csv(labels_file, runs)
    else:
        extractor = _extractor(extract, extract_json)
        if database is None:
            raise ProjectionError("labels from stored responses need the ledger database")
        labelled = await labels_from_ledger(
            database, runs, extractor, key=key, where=parse_where(where), run_gap_s=run_gap_s
        )
    return compute_agreement(labelled, scale=ordered, outcomes=outcomes)

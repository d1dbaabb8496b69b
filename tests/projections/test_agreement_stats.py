"""`ledger agreement`'s statistics against scikit-learn and SciPy (hypothesis), and reading a label from a body."""

from __future__ import annotations

import gzip
import math
import warnings
import zlib
from collections.abc import Sequence

import brotli
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr  # type: ignore[import-untyped]
from sklearn.metrics import cohen_kappa_score  # type: ignore[import-untyped]

from usage_ledger.answers.agreement import compute_agreement, parse_scale
from usage_ledger.answers.agreement_labels import RunLabels
from usage_ledger.answers.agreement_stats import default_scale, quadratic_weighted_kappa, spearman
from usage_ledger.answers.agreement_text import (
    assistant_text,
    decoded_body,
    json_content,
    pointer_extractor,
    regex_extractor,
)
from usage_ledger.projections.errors import ProjectionError

# --- the oracles --------------------------------------------------------------------------------


def sklearn_qwk(a: Sequence[str], b: Sequence[str], scale: Sequence[str]) -> float | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 0/0 for one shared label: NaN with a RuntimeWarning
        value = float(cohen_kappa_score(list(a), list(b), labels=list(scale), weights="quadratic"))
    return None if math.isnan(value) else value


def scipy_rho(x: Sequence[float], y: Sequence[float]) -> float | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input: NaN with a ConstantInputWarning
        value = float(spearmanr(x, y).statistic)
    return None if math.isnan(value) else value


_scales = st.lists(st.text("abcdefghij", min_size=1, max_size=3), min_size=2, max_size=6, unique=True)


@st.composite
def _paired(draw: st.DrawFn) -> tuple[list[str], list[str], list[str]]:
    """A scale in an order of its own (not sorted), and two label lists; the second often misses labels."""
    scale = draw(st.permutations(draw(_scales)))
    some = draw(st.lists(st.sampled_from(scale), min_size=1, max_size=len(scale), unique=True))
    n = draw(st.integers(1, 40))
    a = draw(st.lists(st.sampled_from(scale), min_size=n, max_size=n))
    b = draw(st.lists(st.sampled_from(some), min_size=n, max_size=n))
    return list(scale), a, b


@settings(max_examples=300, deadline=None)
@given(_paired())
def test_qwk_matches_scikit_learn(case: tuple[list[str], list[str], list[str]]) -> None:
    scale, a, b = case
    ours = quadratic_weighted_kappa(a, b, scale)
    expected = sklearn_qwk(a, b, scale)
    if expected is None:
        assert ours.value is None and "one label" in ours.reason
    else:
        assert ours.value == pytest.approx(expected, abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 30).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(0, 4), min_size=n, max_size=n),  # positions on a scale: many ties
            st.lists(st.sampled_from([-0.5, 0.0, 0.01, 0.2, 3.0]) | st.floats(-1, 1), min_size=n, max_size=n),
        )
    )
)
def test_spearman_matches_scipy(xy: tuple[list[int], list[float]]) -> None:
    x, y = xy
    ours = spearman([float(v) for v in x], y)
    expected = scipy_rho(x, y) if len(x) >= 2 else None
    if expected is None:
        assert ours.value is None and ours.reason
    else:
        assert ours.value == pytest.approx(expected, abs=1e-9)


@st.composite
def _runs(draw: st.DrawFn) -> tuple[list[str], list[RunLabels], dict[str, float]]:
    scale = list(draw(st.permutations(draw(_scales))))
    keys = [f"K{i}" for i in range(draw(st.integers(1, 25)))]
    runs = []
    for r in range(draw(st.integers(2, 4))):
        used = draw(st.lists(st.sampled_from(scale), min_size=1, max_size=len(scale), unique=True))
        present = draw(st.lists(st.sampled_from(keys), unique=True))  # keys missing from a run
        runs.append(RunLabels(run=f"r{r}", labels={k: draw(st.sampled_from(used)) for k in present}))
    outcomes = {k: draw(st.sampled_from([0.0, 1.5]) | st.floats(-1, 1)) for k in keys if draw(st.booleans())}
    return scale, runs, outcomes


@settings(max_examples=150, deadline=None)
@given(_runs())
def test_the_report_pairs_keys_as_the_oracles_do(case: tuple[list[str], list[RunLabels], dict[str, float]]) -> None:
    scale, runs, outcomes = case
    result = compute_agreement(runs, scale=scale, outcomes=outcomes)
    for pair, (first, second) in zip(
        result.report.pairs, [(a, b) for i, a in enumerate(runs) for b in runs[i + 1 :]], strict=True
    ):
        common = sorted(first.labels.keys() & second.labels.keys())
        a, b = [first.labels[k] for k in common], [second.labels[k] for k in common]
        assert (pair.a, pair.b, pair.n, pair.raw_total) == (first.run, second.run, len(common), len(common))
        assert pair.raw_agree == sum(x == y for x, y in zip(a, b, strict=True))
        expected = sklearn_qwk(a, b, scale) if common else None
        assert pair.qwk == (None if expected is None else pytest.approx(expected, abs=1e-9))
    kappas = [p.qwk for p in result.report.pairs if p.qwk is not None]
    assert result.report.mean_qwk == (pytest.approx(sum(kappas) / len(kappas)) if kappas else None)
    for run in runs:
        assert result.report.distribution[run.run] == {label: list(run.labels.values()).count(label) for label in scale}
        keys = sorted(run.labels.keys() & outcomes.keys())
        rho = (
            scipy_rho([scale.index(run.labels[k]) for k in keys], [outcomes[k] for k in keys])
            if len(keys) > 1
            else None
        )
        assert result.report.rank_ic[run.run] == (None if rho is None else pytest.approx(rho, abs=1e-9))
    assert not any(math.isnan(v) for v in kappas)


def test_degenerate_cases_are_null_with_a_reason() -> None:
    one = quadratic_weighted_kappa(["Hold"] * 5, ["Hold"] * 5, ["Sell", "Hold", "Buy"])
    assert one.value is None and "'Hold'" in one.reason
    assert quadratic_weighted_kappa([], [], ["a", "b"]).reason == "no keys in common"
    assert spearman([1.0, 1.0, 1.0], [0.1, 0.2, 0.3]).value is None
    assert "label" in spearman([1.0, 1.0, 1.0], [0.1, 0.2, 0.3]).reason
    assert "outcome" in spearman([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]).reason
    assert spearman([1.0], [2.0]).value is None


def test_the_default_scale_is_numeric_when_every_label_is_a_number() -> None:
    assert default_scale(["10", "9", "-1", "2.5"]) == ["-1", "2.5", "9", "10"]
    assert default_scale(["Hold", "Buy", "10"]) == ["10", "Buy", "Hold"]
    assert default_scale(["nan", "1"]) == ["1", "nan"]  # NaN is not a number on a scale


def test_labels_outside_an_explicit_scale_are_named() -> None:
    runs = [RunLabels(run="a", labels={"k": "Buy", "j": "Strong buy"}), RunLabels(run="b", labels={"k": "Hold"})]
    with pytest.raises(ProjectionError, match="labels outside --scale: 'Buy', 'Strong buy'"):
        compute_agreement(runs, scale=["Sell", "Hold"])
    with pytest.raises(ProjectionError, match="more than once"):
        compute_agreement(runs, scale=["Hold", "Hold", "Buy", "Strong buy"])
    with pytest.raises(ProjectionError, match="empty label"):
        parse_scale("Sell,,Buy")


# --- reading the assistant text and the label -----------------------------------------------------

CHAT_SSE = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"Grade: "}}]}\r\n\r\n'
    b'data: {"choices":[{"index":1,"delta":{"content":"other choice"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"Buy"},"finish_reason":"stop"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
    b"data: [DONE]\n\n"
)


def test_assistant_text_of_each_shape() -> None:
    assert assistant_text(CHAT_SSE, "text/event-stream") == "Grade: Buy"
    assert assistant_text(CHAT_SSE) == "Grade: Buy"  # recognised without the header too
    completions = (
        b'data: {"choices":[{"index":0,"text":"Grade"}]}\n\ndata: {"choices":[{"index":0,"text":": Hold"}]}\n\n'
    )
    assert assistant_text(completions + b"data: [DONE]\n\n") == "Grade: Hold"
    assert assistant_text(b'{"choices":[{"index":0,"message":{"role":"assistant","content":"Sell"}}]}') == "Sell"
    assert assistant_text(b'{"choices":[{"index":0,"text":"Hold","logprobs":null}]}') == "Hold"
    parts = b'{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}'
    assert assistant_text(parts) == "ab"
    assert assistant_text(b'{"object":"list","data":[{"embedding":[0.1]}]}') is None
    assert assistant_text(b"not json") is None
    assert assistant_text(b'data: {"choices":[{"index":0,"delta":{"content":"cut sho') is None


def test_bodies_are_decoded_from_their_content_encoding() -> None:
    body = b'{"choices":[{"message":{"content":"Grade: Buy"}}]}'
    assert decoded_body(gzip.compress(body), "gzip") == body
    assert decoded_body(zlib.compress(body), "deflate") == body
    assert decoded_body(brotli.compress(body), "br") == body
    assert decoded_body(zstandard.ZstdCompressor().compress(body), "zstd") == body
    assert decoded_body(brotli.compress(gzip.compress(body)), "gzip, br") == body  # last applied, first undone
    with pytest.raises(ValueError, match="'compress'"):
        decoded_body(body, "compress")
    with pytest.raises(ValueError, match="not valid gzip"):
        decoded_body(body, "gzip")


def test_regex_and_pointer_extractors() -> None:
    grade = regex_extractor(r"Grade:\s*(\w+)")
    assert grade("Reasoning... Grade:  Buy. Later Grade: Sell") == "Buy"  # the first match
    assert grade("no grade here") is None
    with pytest.raises(ProjectionError, match="has 2 groups"):
        regex_extractor(r"(Grade): (\w+)")
    with pytest.raises(ProjectionError, match="has 0 groups"):
        regex_extractor(r"Grade: \w+")
    with pytest.raises(ProjectionError, match="not a valid regular expression"):
        regex_extractor(r"Grade: (\w+")
    fenced = 'Here you go:\n```json\n{"rating": {"a/b": "Hold", "m~n": 3, "list": [true, null]}}\n```\nDone.'
    assert json_content(fenced) == {"rating": {"a/b": "Hold", "m~n": 3, "list": [True, None]}}
    assert pointer_extractor("/rating/a~1b")(fenced) == "Hold"
    assert pointer_extractor("/rating/m~0n")(fenced) == "3"
    assert pointer_extractor("/rating/list/0")(fenced) == "true"
    assert pointer_extractor("/rating/list/1")(fenced) is None  # null is not a label
    assert pointer_extractor("/rating/list/01")(fenced) is None  # RFC 6901: no leading zeros
    assert pointer_extractor("/rating")(fenced) is None  # an object is not a label
    assert pointer_extractor("/grade")('{"grade": 4.5}') == "4.5"
    assert pointer_extractor("")('"Buy"') == "Buy"
    with pytest.raises(ProjectionError, match="start it with '/'"):
        pointer_extractor("grade")
    with pytest.raises(ProjectionError, match="'~' must be followed"):
        pointer_extractor("/a~2")

"""`ledger agreement` on a ledger: keys without a stored body say why, and the command end to end.

End to end: runs recorded through the real `ledger serve` against the emulator, on both backends.
Completions with `echo` return the prompt, so each response carries a grade the test chose
(`Grade: Buy` and a fenced JSON block); chat responses carry the emulator's own text, whose
label the test reads from what the client received. The statistics are checked against
scikit-learn and SciPy (tests/projections/test_agreement_stats.py).
"""

from __future__ import annotations

import asyncio
import csv
import gzip
import json
import random
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from tests.gateway import processes
from tests.gateway.processes import Process
from tests.projections.helpers import append, at, failed, finished, started
from tests.projections.test_agreement_stats import scipy_rho, sklearn_qwk
from usage_ledger.answers.agreement import compute_agreement
from usage_ledger.answers.agreement_labels import labels_from_ledger
from usage_ledger.answers.agreement_stats import default_scale
from usage_ledger.answers.agreement_text import regex_extractor
from usage_ledger.answers.callviews import get_call
from usage_ledger.cli import main
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor, blob_hash, redact_blob
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import CallImported, new_event
from usage_ledger.projections.errors import NotFound, ProjectionError

EMULATOR_SPEED = 50  # the shared `emulator` fixture (tests/conftest.py)

# --- bodies that are not there: imported, redacted, omitted (events built directly, both backends) -------


def _body_call(
    call_id: str,
    t: float,
    ticker: str | None,
    body: bytes | None,
    *,
    omitted: str = "",
    step: str = "final",
    encoding: str | None = None,
) -> tuple[list[Any], list[Any]]:
    start = started(call_id, t, run="mixed", ticker=ticker)
    start = new_event(
        msgspec_replace(start.body, tags={**({"ticker": ticker} if ticker else {}), "step": step}),
        stream=start.stream,
        occurred_at=start.occurred_at,
    )
    plain = finished(call_id, t, t + 1)
    stored = gzip.compress(body) if body is not None and encoding == "gzip" else body
    headers = [("content-type", "application/json")] + ([("content-encoding", encoding)] if encoding else [])
    end = new_event(
        msgspec_replace(
            plain.body,
            response_blob=blob_hash(stored) if stored is not None else None,
            response_headers=headers,
            response_blob_omitted=omitted,
        ),
        stream=plain.stream,
        occurred_at=plain.occurred_at,
    )
    blobs = [b for b in [BlobCompressor().prepare(stored)] if b is not None] if stored is not None else []
    return [start, end], blobs


def msgspec_replace(struct: Any, **changes: Any) -> Any:
    return msgspec.structs.replace(struct, **changes)


def _chat_body(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}).encode()


async def test_keys_without_a_label_say_why(database: Database) -> None:

    calls = [
        _body_call("a", 0, "T0", _chat_body("Grade: Buy"), encoding="gzip"),
        _body_call("b", 1, "T1", _chat_body("Grade: Hold")),  # redacted below
        _body_call("c", 2, "T2", None, omitted="too_large"),
        _body_call("e1", 4, "T4", _chat_body("Grade: Sell"), step="draft"),
        _body_call("e2", 5, "T4", _chat_body("no grade in this step"), step="final"),
        _body_call("f", 6, "T5", _chat_body("I cannot grade this")),
        _body_call("g", 7, None, _chat_body("Grade: Buy")),  # no ticker tag
    ]
    for events_, blobs in calls:
        await append_events(database, events_, blobs)
    await append(database, started("d", 3, run="mixed", ticker="T3"), failed("d", 3, 4))
    imported = CallImported(
        call_id="imp",
        source="old.jsonl",
        line=1,
        started_at=at(8),
        finished_at=at(9),
        input_tokens=1,
        output_tokens=1,
        run="mixed",
        tags={"ticker": "T6"},
    )
    await append(database, new_event(imported, stream="call-imp", occurred_at=at(8)))
    async with database.engine.begin() as conn:
        assert await redact_blob(conn, blob_hash(_chat_body("Grade: Hold")))

    grade = regex_extractor(r"Grade: (\w+)")
    [mixed] = await labels_from_ledger(database, ["mixed"], grade)
    assert mixed.labels == {"T0": "Buy", "T4": "Sell"}  # T4: its last call has no grade, the one before does
    assert mixed.unlabelled == {"redacted": 1, "omitted": 1, "not ok": 1, "no match": 1, "imported": 1}
    assert mixed.calls_without_key == 1 and mixed.keys == 7
    [final] = await labels_from_ledger(database, ["mixed"], grade, where=[("step", "final")])
    assert final.labels == {"T0": "Buy"} and final.unlabelled["no match"] == 2  # T4's draft is not selected
    [by_step] = await labels_from_ledger(database, ["mixed"], grade, key="step")
    assert by_step.labels == {"final": "Buy", "draft": "Sell"}  # the last final call with a grade is "g"
    with pytest.raises(NotFound, match="no run 'nope'"):
        await labels_from_ledger(database, ["mixed", "nope"], grade)
    note = compute_agreement([mixed, final]).notes[0]
    assert note.startswith("mixed: 3 of 7 keys have no stored response body (imported 1, omitted 1, redacted 1)")


# --- end to end: runs recorded through `ledger serve` against the emulator, both backends -----------------

SCALE = ["Sell", "Hold", "Buy"]
SCORE = {"Sell": 9, "Hold": 10, "Buy": 11}  # numbers that sort differently as strings
TICKERS = [f"T{i:02d}" for i in range(12)]
MODEL = "emulator-moe"
GRADE = r"Grade: (\w+)"


def _grades(seed: int, scale: Sequence[str] = SCALE) -> dict[str, str]:
    rng = random.Random(seed)
    weights = [1, 3, 1][: len(scale)]  # mostly Hold, as the user's runs are
    return {t: rng.choices(list(scale), weights=weights)[0] for t in TICKERS}


FINAL = {"rep-1": _grades(1), "rep-2": _grades(2), "rep-3": _grades(3, ["Hold", "Buy"])}  # rep-3 never says Sell
DRAFT = _grades(4)
MISSING = {"rep-2": "T11"}  # a ticker rep-2 never called: its pairs have 11 keys in common
OUTCOME = {t: round(random.Random(5).uniform(-0.1, 0.1) + 0.01 * i, 4) for i, t in enumerate(TICKERS)}


def _prompt(ticker: str, grade: str) -> str:
    return (
        f"Ticker {ticker}. Grade: {grade}\n```json\n" + json.dumps({"grade": grade, "score": SCORE[grade]}) + "\n```\n"
    )


async def _completion(client: httpx.AsyncClient, run: str, ticker: str, grade: str, *, stream: bool, step: str) -> str:
    headers = {"X-Ledger-Run": run, "X-Ledger-Ticker": ticker, "X-Ledger-Tag-Step": step}
    body = {"model": MODEL, "prompt": _prompt(ticker, grade), "echo": True, "max_tokens": 4, "stream": stream}
    response = await client.post("/v1/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.headers["x-ledger-call-id"]


async def _chat(client: httpx.AsyncClient, run: str, ticker: str, prompt: str, *, stream: bool) -> str:
    """The assistant text as the client received it."""
    headers = {"X-Ledger-Run": run, "X-Ledger-Ticker": ticker}
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 6, "stream": stream}
    response = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    if not stream:
        return str(response.json()["choices"][0]["message"]["content"])
    text = ""
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    return text


async def _record(url: str) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The runs; returns rep-3's call id per ticker and the chat runs' labels as their clients read them."""
    limits = httpx.Limits(max_connections=8)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def rep_1(ticker: str) -> None:  # a draft, then the final grade: the last call's label counts
            await _completion(client, "rep-1", ticker, DRAFT[ticker], stream=False, step="draft")
            await _completion(client, "rep-1", ticker, FINAL["rep-1"][ticker], stream=True, step="final")

        await asyncio.gather(*(rep_1(t) for t in TICKERS))
        await asyncio.gather(
            *(
                _completion(client, "rep-2", t, FINAL["rep-2"][t], stream=i % 2 == 0, step="final")
                for i, t in enumerate(TICKERS)
                if t != MISSING["rep-2"]
            )
        )
        ids = await asyncio.gather(
            *(
                _completion(client, "rep-3", t, FINAL["rep-3"][t], stream=i % 3 == 0, step="final")
                for i, t in enumerate(TICKERS)
            )
        )
        chat: dict[str, dict[str, str]] = {}
        for run, salt in (("chat-1", ""), ("chat-2", " again")):
            texts = await asyncio.gather(
                *(
                    _chat(client, run, t, f"Grade {t}{salt if i % 2 else ''}.", stream=i % 2 == 0)
                    for i, t in enumerate(TICKERS)
                )
            )
            chat[run] = {t: re.search(r"(\w+)", text).group(1) for t, text in zip(TICKERS, texts, strict=True)}  # type: ignore[union-attr]
    return dict(zip(TICKERS, ids, strict=True)), chat


def _ledger(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["agreement", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _expected(runs: Sequence[str], labels: dict[str, dict[str, str]], scale: Sequence[str]) -> dict[str, Any]:
    pairs = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            common = sorted(labels[a].keys() & labels[b].keys())
            x, y = [labels[a][k] for k in common], [labels[b][k] for k in common]
            pairs.append(
                {
                    "a": a,
                    "b": b,
                    "n": len(common),
                    "qwk": sklearn_qwk(x, y, scale),
                    "raw_agree": sum(p == q for p, q in zip(x, y, strict=True)),
                    "raw_total": len(common),
                }
            )
    distribution = {r: {s: list(labels[r].values()).count(s) for s in scale} for r in runs}
    return {"pairs": pairs, "distribution": distribution}


def _close(report: dict[str, Any], expected: dict[str, Any]) -> None:
    assert report["distribution"] == expected["distribution"]
    assert [{**p, "qwk": None} for p in report["pairs"]] == [{**p, "qwk": None} for p in expected["pairs"]]
    for got, want in zip(report["pairs"], expected["pairs"], strict=True):
        assert got["qwk"] == (None if want["qwk"] is None else pytest.approx(want["qwk"], abs=1e-12))
    kappas = [p["qwk"] for p in expected["pairs"] if p["qwk"] is not None]
    assert report["mean_qwk"] == pytest.approx(sum(kappas) / len(kappas), abs=1e-12)


async def test_a_pattern_that_backtracks_without_end_is_stopped_and_named(database: Database) -> None:
    """`(?:a|aa)+$` on 40 a's and a b backtracks for minutes in Python's `re`: the search is stopped after the
    extractor's time limit, that key stays unlabelled as `timed out`, and a note names the answer."""
    for events_, blobs in (
        _body_call("fine", 0, "T0", _chat_body("Grade: aa")),
        _body_call("slow", 1, "T1", _chat_body("Grade: " + "a" * 40 + "b")),
    ):
        await append_events(database, events_, blobs)
    [mixed] = await labels_from_ledger(database, ["mixed"], regex_extractor(r"Grade: ((?:a|aa)+)$", timeout_s=0.2))
    assert mixed.labels == {"T0": "aa"}
    assert mixed.unlabelled == {"timed out": 1} and mixed.timed_out == ["T1 (slow)"]
    note = next(n for n in compute_agreement([mixed]).notes if "stopped" in n)
    assert note.startswith("mixed: the pattern was stopped after") and "T1 (slow)" in note


def test_agreement_of_recorded_runs(
    gateway: Process,
    backend_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rep_3_ids, chat = asyncio.run(_record(gateway.url))  # type: ignore[attr-defined]
    reps = ["rep-1", "rep-2", "rep-3"]
    final = {r: {t: g for t, g in FINAL[r].items() if t != MISSING.get(r)} for r in reps}
    db, as_json, graded = ["--db", backend_url], ["--format", "json"], ["--extract", GRADE, "--scale", ",".join(SCALE)]

    code, out, err = _ledger(capsys, *reps, *graded, *as_json, *db)
    assert code == 0, err
    report = json.loads(out)
    assert set(report) == {"pairs", "mean_qwk", "distribution", "rank_ic"} and report["rank_ic"] == {}
    _close(report, _expected(reps, final, SCALE))
    assert report["distribution"]["rep-3"]["Sell"] == 0

    # the same labels from the fenced JSON; the scores as a numeric default scale give the same kappas
    code, out, _ = _ledger(capsys, *reps, "--extract-json", "/grade", "--scale", ",".join(SCALE), *as_json, *db)
    assert code == 0 and json.loads(out) == report
    code, out, _ = _ledger(capsys, *reps, "--extract-json", "/score", *as_json, *db)
    scores = json.loads(out)
    assert [p["qwk"] for p in scores["pairs"]] == [p["qwk"] for p in report["pairs"]]
    assert list(scores["distribution"]["rep-1"]) == ["9", "10", "11"]

    # --where picks rep-1's drafts instead of its last call per ticker (and selects in every run: rep-2 has none)
    code, out, _ = _ledger(capsys, "rep-1", "rep-2", *graded, "--where", "step=draft", *as_json, *db)
    drafts = json.loads(out)
    assert drafts["distribution"] == {
        "rep-1": {s: list(DRAFT.values()).count(s) for s in SCALE},
        "rep-2": dict.fromkeys(SCALE, 0),
    }
    assert drafts["pairs"][0]["n"] == 0 and drafts["pairs"][0]["qwk"] is None

    # rank IC against an outcome file; the same report from a labels file
    outcomes = tmp_path / "returns.csv"
    outcomes.write_text("ticker,fwd_return\n" + "".join(f"{t},{OUTCOME[t]}\n" for t in TICKERS))
    ic = ["--outcomes", str(outcomes), "--outcome-column", "fwd_return"]
    code, out, _ = _ledger(capsys, *reps, *graded, *ic, *as_json, *db)
    with_ic = json.loads(out)
    for run in reps:
        keys = sorted(final[run])
        expected_rho = scipy_rho([SCALE.index(final[run][k]) for k in keys], [OUTCOME[k] for k in keys])
        assert with_ic["rank_ic"][run] == pytest.approx(expected_rho, abs=1e-12)
    labels_csv = tmp_path / "labels.csv"
    with labels_csv.open("w", newline="") as handle:
        csv.writer(handle).writerows([["run", "key", "label"], *([r, t, g] for r in reps for t, g in final[r].items())])
    code, out, _ = _ledger(capsys, *reps, "--labels", str(labels_csv), "--scale", ",".join(SCALE), *ic, *as_json)
    assert code == 0 and json.loads(out) == with_ic

    # chat completions, streamed and not: the labels the clients read
    code, out, _ = _ledger(capsys, "chat-1", "chat-2", "--extract", r"(\w+)", *as_json, *db)
    chat_scale = default_scale([*chat["chat-1"].values(), *chat["chat-2"].values()])
    _close(json.loads(out), _expected(["chat-1", "chat-2"], chat, chat_scale))

    # the table fits 100 columns and shows raw agreement as agreed/common
    code, out, _ = _ledger(capsys, *reps, *graded, *db)
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 100
    first = report["pairs"][0]
    assert f"{first['raw_agree']}/{first['raw_total']}" in out and "mean QWK" in out
    monkeypatch.setenv("COLUMNS", "80")  # and 80, with the same figures
    code, narrow, _ = _ledger(capsys, *reps, *graded, *db)
    assert code == 0 and max(len(line) for line in narrow.splitlines()) <= 80
    assert f"{first['raw_agree']}/{first['raw_total']}" in narrow and "mean QWK" in narrow
    monkeypatch.delenv("COLUMNS")

    # an imported run has no bodies: said, counted, never guessed
    imported = tmp_path / "old.jsonl"
    rows = [
        {
            "run": "old",
            "ticker": t,
            "started_at": 1_700_000_000 + i,
            "elapsed_s": 1,
            "input_tokens": 5,
            "output_tokens": 5,
        }
        for i, t in enumerate(TICKERS)
    ]
    imported.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["import", str(imported), *db]) == 0
    code, out, err = _ledger(capsys, "rep-1", "old", "--extract", GRADE, *as_json, *db)
    assert code == 0 and json.loads(out)["pairs"][0]["n"] == 0 and json.loads(out)["pairs"][0]["qwk"] is None
    said = "old: 12 of 12 keys have no stored response body (imported 12)"
    assert said in err
    code, out, _ = _ledger(capsys, "rep-1", "old", "--extract", GRADE, *db)
    assert said in " ".join(out.split())

    # a redacted response: that key loses its label and says why
    blob = asyncio.run(_response_blob(backend_url, rep_3_ids["T00"]))
    redact = subprocess.run([processes.LEDGER, "redact", blob, "--reason", "test", *db], capture_output=True)
    assert redact.returncode == 0, redact.stderr
    code, out, err = _ledger(capsys, "rep-1", "rep-3", "--extract", GRADE, *as_json, *db)
    assert json.loads(out)["pairs"][0]["n"] == 11
    assert "rep-3: 1 of 12 keys have no stored response body (redacted 1)" in err

    # bad usage exits 2 and says what was wrong
    code, _, err = _ledger(capsys, "rep-1", "nope", "--extract", GRADE, *db)
    assert code == 2 and "no run 'nope'" in err
    code, _, err = _ledger(capsys, "rep-1", "rep-2", "--extract", GRADE, "--scale", "Sell,Hold", *db)
    assert code == 2 and "labels outside --scale: 'Buy'" in err
    code, _, err = _ledger(capsys, "rep-1", "--extract", GRADE, *db)
    assert code == 2 and "at least two runs" in err
    code, _, err = _ledger(capsys, "rep-1", "rep-2", "--extract", "Grade: \\w+", *db)
    assert code == 2 and "exactly one" in err


async def _response_blob(url: str, call_id: str) -> str:
    database = open_database(url, null_pool=True)
    try:
        blob = (await get_call(database, call_id)).response_blob
    finally:
        await database.dispose()
    assert blob is not None
    return blob


@pytest.mark.parametrize("pattern", ["(" * 5_000 + "a" + ")" * 5_000, "(a)" + "(?:" * 5_000 + "b" + ")" * 5_000])
def test_an_extract_nested_past_the_engines_depth_is_a_clear_error(
    pattern: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ProjectionError, match="nests its groups too deeply") as info:
        regex_extractor(pattern)
    assert len(str(info.value)) < 300  # the pattern is shown cut short, not 10,000 characters
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    capsys.readouterr()
    for argv in (
        ["agreement", "a", "b", "--extract", pattern],
        ["labels", "import", "--run", "a", "--extract", pattern],
    ):
        assert main([*argv, "--db", db]) == 2
        err = capsys.readouterr().err
        assert "nests its groups too deeply" in err and "Traceback" not in err and "RecursionError" not in err

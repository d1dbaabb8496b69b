"""The emulator's grade line (`--grade-line`): off by default, seeded, Hold-heavy, part of the answer's tokens."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.emulator.shapes import parse_sse
from usage_ledger.answers.agreement_stats import quadratic_weighted_kappa
from usage_ledger.emulator import profile_config, running_emulator
from usage_ledger.emulator.commands import add_arguments, build_config
from usage_ledger.emulator.grades import GRADE_SCALE, GRADE_WEIGHTS, LEANING, grade_of
from usage_ledger.emulator.tokenizer import Answer, count_tokens, lead_pieces

GRADED = profile_config("moe", speed=1000.0, grade_line=True)
GRADE = re.compile(r"^Grade: (.+?) *\n\n")
CHAT = "/v1/chat/completions"


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 40, "min_tokens": 40, **extra}


def _streamed_text(body: str, field: str) -> str:
    text = ""
    for event in parse_sse(body):
        if isinstance(event.data, dict):
            for choice in event.data["choices"]:
                text += (choice["delta"].get("content") or "") if field == "delta" else choice["text"]
    return text


async def test_off_by_default_the_answers_are_unchanged() -> None:
    plain, graded = profile_config("moe", speed=1000.0), GRADED
    assert plain.grade_line is False
    async with running_emulator(plain) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        text = (await h.post(CHAT, json=_chat("AAPL"))).json()["choices"][0]["message"]["content"]
    assert "Grade" not in text
    async with running_emulator(graded) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        graded_text = (await h.post(CHAT, json=_chat("AAPL"))).json()["choices"][0]["message"]["content"]
    lead = GRADE.match(graded_text)
    assert lead is not None and lead.group(1) in GRADE_SCALE
    # the grade line takes the place of the first tokens; the rest of the answer is the same text
    assert graded_text[lead.end() :] == text[lead.end() :]


async def test_every_api_shape_carries_the_same_line_and_the_tokens_still_count() -> None:
    """Chat and completions, streamed or not, with logprobs: one label per (model, seed, prompt), usage unchanged."""
    async with running_emulator(GRADED) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:
        chat = (await h.post(CHAT, json=_chat("MSFT", seed=3))).json()
        streamed = await h.post(CHAT, json=_chat("MSFT", seed=3, stream=True))
        with_logprobs = (await h.post(CHAT, json=_chat("MSFT", seed=3, logprobs=True, top_logprobs=1))).json()
        completion = (
            await h.post("/v1/completions", json={"prompt": "MSFT", "max_tokens": 40, "min_tokens": 40, "seed": 3})
        ).json()
        completion_streamed = await h.post(
            "/v1/completions", json={"prompt": "MSFT", "max_tokens": 40, "min_tokens": 40, "seed": 3, "stream": True}
        )
    text = chat["choices"][0]["message"]["content"]
    assert count_tokens(text) == chat["usage"]["completion_tokens"] == 40
    assert _streamed_text(streamed.text, "delta") == text
    tokens = [item["token"] for item in with_logprobs["choices"][0]["logprobs"]["content"]]
    assert "".join(tokens) == with_logprobs["choices"][0]["message"]["content"] == text
    completion_text = completion["choices"][0]["text"]
    assert GRADE.match(completion_text) and count_tokens(completion_text) == 40
    assert _streamed_text(completion_streamed.text, "text") == completion_text


async def test_the_label_follows_the_request_seed_else_the_emulator_seed() -> None:
    prompts = [f"ticker {i}" for i in range(40)]
    async with running_emulator(GRADED) as emu, httpx.AsyncClient(base_url=emu.base_url, timeout=60) as h:

        async def labels(**extra: Any) -> list[str]:
            out = []
            for prompt in prompts:
                text = (await h.post(CHAT, json=_chat(prompt, **extra))).json()["choices"][0]["message"]["content"]
                match = GRADE.match(text)
                assert match is not None, text
                out.append(match.group(1))
            return out

        default, again, seed_zero, other = await labels(), await labels(), await labels(seed=0), await labels(seed=1)
    assert default == again == seed_zero  # deterministic; no request seed means the emulator's (0)
    assert default != other  # another seed, other labels for some prompts
    assert sum(a == b for a, b in zip(default, other, strict=True)) > 0  # and the same for others


def test_a_short_answer_cuts_the_line_as_any_text_is_cut() -> None:
    answer = Answer(5, lead_pieces("Grade: Strong Sell"))
    assert answer.text(0, 2) == "Grade: S"
    assert "".join(answer.piece(i) for i in range(9)) == answer.text(0, 9)
    assert answer.text(3, 4) == answer.text(0, 7)[12:]


@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ: .", max_size=40), st.integers(0, 200), st.integers(0, 60))
def test_lead_pieces_are_whole_tokens_and_any_slice_joins_up(line: str, offset: int, n: int) -> None:
    lead = lead_pieces(line)
    assert all(len(piece) == 4 for piece in lead)
    assert "".join(lead).rstrip("\n").rstrip() == line.rstrip()
    answer = Answer(offset, lead)
    whole = answer.text(0, n)
    assert count_tokens(whole) == n
    for cut in range(n + 1):
        assert answer.text(0, cut) + answer.text(cut, n - cut) == whole


def test_the_labels_are_hold_heavy_and_repetitions_agree_as_the_users_did() -> None:
    """Over 3,000 prompts: each label's share within 2.5 points of its weight; two seeds agree on
    LEANING² + (1 − LEANING²)·Σw² of the keys with kappa ≈ LEANING²; two models agree by chance only."""
    prompts = [f"Step 17 of 17 for T{i:04d}".encode() for i in range(3000)]
    scale = list(GRADE_SCALE)

    def run(model: str, seed: int) -> list[str]:
        return [grade_of(model, seed, prompt) for prompt in prompts]

    first, second, other_model = run("moe", 1), run("moe", 2), run("dense", 1)
    shares = Counter(first)
    for label, weight in zip(GRADE_SCALE, GRADE_WEIGHTS, strict=True):
        assert shares[label] / len(prompts) == pytest.approx(weight, abs=0.025), label
    chance = sum(w * w for w in GRADE_WEIGHTS)

    def agree(a: list[str], b: list[str]) -> float:
        return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)

    def kappa(a: list[str], b: list[str]) -> float:
        value = quadratic_weighted_kappa(a, b, scale).value
        assert value is not None
        return value

    assert agree(first, second) == pytest.approx(LEANING**2 + (1 - LEANING**2) * chance, abs=0.03)
    assert kappa(first, second) == pytest.approx(LEANING**2, abs=0.06)
    assert agree(first, other_model) == pytest.approx(chance, abs=0.03)
    assert kappa(first, other_model) == pytest.approx(0, abs=0.06)


def test_the_flag() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert build_config(parser.parse_args([])).grade_line is False
    assert build_config(parser.parse_args(["--grade-line", "--profile", "dense"])).grade_line is True

"""`gateway.kept`: the response bytes kept for a blob stay within the per-call cap and the shared budget."""

from __future__ import annotations

import gzip

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from usage_ledger.gateway.encoding import BodyDecoder
from usage_ledger.gateway.kept import BUDGET_STEP, TAIL_BYTES, KeptBody, usage_from_tail
from usage_ledger.gateway.limits import ByteBudget, derived_max_connections
from usage_ledger.ledger.events import Usage

USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


def _body(content: str, size: int = 0) -> bytes:
    message = {"role": "assistant", "content": content + "x" * size}
    return msgspec.json.encode({"id": "c1", "choices": [{"message": message, "finish_reason": "stop"}], "usage": USAGE})


def _feed(kept: KeptBody, data: bytes, piece: int = 10_000) -> None:
    for start in range(0, len(data), piece):
        kept.append(data[start : start + piece])


def test_a_body_under_the_cap_is_kept_whole_and_its_budget_given_back() -> None:
    budget = ByteBudget(1 << 20)
    kept = KeptBody(budget, cap=100_000)
    _feed(kept, b"a" * 50_000)
    assert kept.whole() == b"a" * 50_000 and len(kept) == 1 and kept.omitted == ""
    assert budget.held == BUDGET_STEP  # taken in steps, not per chunk
    kept.release()
    assert budget.held == 0


def test_a_body_growing_over_the_cap_is_dropped_and_only_its_tail_kept() -> None:
    budget = ByteBudget(1 << 30)
    kept = KeptBody(budget, cap=200_000)
    kept.expect([], whole_json=True, encoding=None)
    body = _body("", size=500_000)
    _feed(kept, body)
    assert kept.omitted == "too_large" and kept.whole() is None and not kept
    assert kept.size == len(body) and kept.tail == body[-TAIL_BYTES:]
    assert budget.held == 0  # dropped at once, not at the end of the call
    assert usage_from_tail(kept.tail) == (Usage(prompt_tokens=7, completion_tokens=5, total_tokens=12), "")


def test_a_declared_length_over_the_cap_keeps_nothing_from_the_start() -> None:
    budget = ByteBudget(1 << 30)
    kept = KeptBody(budget, cap=1000)
    kept.expect([(b"content-length", b"5000")], whole_json=False, encoding=None)
    _feed(kept, b"b" * 5000, piece=100)
    assert kept.omitted == "too_large" and kept.size == 5000 and kept.tail == b"" and budget.peak == 0


def test_a_full_budget_drops_the_blob_of_the_call_that_finds_it_full() -> None:
    budget = ByteBudget(3 * BUDGET_STEP)
    first, second = KeptBody(budget, cap=1 << 30), KeptBody(budget, cap=1 << 30)
    _feed(first, b"1" * (2 * BUDGET_STEP))
    _feed(second, b"2" * (2 * BUDGET_STEP))
    assert first.omitted == "" and first.whole() == b"1" * (2 * BUDGET_STEP)
    assert second.omitted == "budget_full" and second.size == 2 * BUDGET_STEP
    first.release()
    second.release()
    assert budget.held == 0


def test_the_tail_of_a_compressed_body_is_decoded_before_reading_its_usage() -> None:
    body = _body("", size=400_000)
    packed = gzip.compress(body)
    decoder = BodyDecoder.for_encoding(b"gzip")
    assert len(packed) > 100
    kept = KeptBody(ByteBudget(1 << 30), cap=100)
    kept.expect([(b"content-length", str(len(packed)).encode())], whole_json=True, encoding=decoder)
    _feed(kept, packed, piece=300)
    assert kept.tail == body[-TAIL_BYTES:]
    assert usage_from_tail(kept.tail)[0] == Usage(prompt_tokens=7, completion_tokens=5, total_tokens=12)


def test_usage_named_inside_a_string_is_not_taken_for_the_member() -> None:
    tail = _body('a quote: \\"usage\\": {\\"prompt_tokens\\": 99} and "usage": text')[-TAIL_BYTES:]
    assert usage_from_tail(tail)[0] == Usage(prompt_tokens=7, completion_tokens=5, total_tokens=12)
    usage, detail = usage_from_tail(b'"content":"no usage here"}]}')
    assert usage is None and "hold no usage" in detail


@given(st.text(max_size=300))
def test_usage_from_the_tail_of_any_body_is_the_body_s_usage(content: str) -> None:
    body = _body(content)
    assert usage_from_tail(body[-200:])[0] == Usage(prompt_tokens=7, completion_tokens=5, total_tokens=12)


def test_the_connection_cap_leaves_room_for_the_upstream_pool_and_the_ledger() -> None:
    assert derived_max_connections(256, fd_limit=1024) == 1024 - 256 - 64 - 32
    assert derived_max_connections(256, fd_limit=100) == 16  # never none
    assert derived_max_connections(256, fd_limit=1 << 20) == 4096

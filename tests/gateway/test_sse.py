from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from usage_ledger.gateway.sse import SseEvent, SseScanner


def scan(parts: list[bytes]) -> list[SseEvent]:
    scanner = SseScanner()
    events = [e for part in parts for e in scanner.feed(part)]
    return events + scanner.close()


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


_line_end = st.sampled_from([b"\n", b"\r\n", b"\r"])
_value = st.binary(max_size=20).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_field = st.one_of(
    st.tuples(st.just(b"data: "), _value),
    st.tuples(st.just(b"data:"), _value),
    st.tuples(st.just(b"event: "), _value),
    st.tuples(st.just(b": comment"), st.just(b"")),
    st.tuples(st.just(b"data"), st.just(b"")),
)
_event = st.tuples(st.lists(st.tuples(_field, _line_end), max_size=4), _line_end).map(
    lambda e: b"".join(a + b + end for (a, b), end in e[0]) + e[1]
)
_stream = st.lists(_event, max_size=8).map(b"".join)


@given(_stream, st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_gives_the_same_events(data: bytes, cuts: list[int]) -> None:
    assert scan(splits(data, cuts)) == scan([data])


@given(_stream, st.binary(max_size=30))
def test_byte_at_a_time_equals_whole(data: bytes, tail: bytes) -> None:
    stream = data + tail
    assert scan([stream[i : i + 1] for i in range(len(stream))]) == scan([stream])


@given(_stream)
def test_event_spans_tile_the_stream(data: bytes) -> None:
    events = scan([data])
    pos = 0
    for event in events:
        assert event.start == pos and event.end > event.start
        pos = event.end
    assert data[pos:].strip(b"\r\n") == b"" or not data[pos:].endswith((b"\n\n", b"\r\r", b"\r\n\r\n"))


def test_vllm_shape() -> None:
    stream = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    events = scan([stream[:5], stream[5:20], stream[20:]])
    assert [e.data for e in events] == [b'{"a":1}', b'{"b":2}', b"[DONE]"]
    assert stream[events[2].start : events[2].end] == b"data: [DONE]\n\n"


def test_multiline_data_and_crlf() -> None:
    events = scan([b"data: a\r\ndata: b\r\n\r\n: ping\r\n\r\n"])
    assert [e.data for e in events] == [b"a\nb", None]

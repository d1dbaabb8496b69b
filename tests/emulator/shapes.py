"""The shape of a JSON value or of an SSE stream, and where two shapes differ.

A shape is the value with every leaf replaced by its JSON type (`"str"`, `"int"`, `"float"`,
`"bool"`, `"null"`), objects kept with their keys, and a list replaced by the distinct shapes
of its items. Values are not compared; null versus a missing key is (`"null"` versus absent).
An object whose keys are data (a map, e.g. logprobs keyed by token) is named by its path in
`maps` and becomes `{"*": shape of its values}`.

A stream's shape is its sequence of event shapes with runs of equal shapes collapsed, so
twelve content chunks and three content chunks have the same shape:
`role chunk, content chunk, finish chunk, usage chunk, [DONE]`. With several choices (`n > 1`)
their chunks interleave as timing has it, so each choice's own sequence (with the events that
belong to no choice: the usage chunk, `[DONE]`) is compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ("Event", "differences", "parse_sse", "skeleton", "stream_differences", "stream_shape")


def skeleton(value: Any, maps: frozenset[str] = frozenset(), path: str = "$") -> Any:
    """The type skeleton of a decoded JSON value; objects at a path in `maps` are maps."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        distinct: list[Any] = []
        for item in value:
            shape = skeleton(item, maps, path + "[]")
            if shape not in distinct:
                distinct.append(shape)
        return distinct
    if isinstance(value, dict):
        if path in maps:
            values = skeleton(list(value.values()), maps, path + ".*")
            return {"*": values[0] if len(values) == 1 else values}
        return {key: skeleton(value[key], maps, f"{path}.{key}") for key in sorted(value)}
    raise TypeError(f"not a JSON value: {value!r}")


def _brief(shape: Any) -> str:
    text = msgspec.json.encode(shape).decode()
    return text if len(text) <= 160 else text[:157] + "..."


def differences(real: Any, emulated: Any, path: str = "$") -> list[str]:
    """Where `emulated`'s skeleton differs from `real`'s, one line per path (empty when equal)."""
    if isinstance(real, dict) and isinstance(emulated, dict):
        out: list[str] = []
        for key in real.keys() - emulated.keys():
            out.append(f"{path}.{key}: vLLM sends it ({_brief(real[key])}), the emulator does not")
        for key in emulated.keys() - real.keys():
            out.append(f"{path}.{key}: the emulator sends it ({_brief(emulated[key])}), vLLM does not")
        for key in sorted(real.keys() & emulated.keys()):
            out.extend(differences(real[key], emulated[key], f"{path}.{key}"))
        return sorted(out)
    if isinstance(real, list) and isinstance(emulated, list):
        if not real or not emulated:
            return []  # an empty list says nothing about its items' shape
        if len(real) == 1 and len(emulated) == 1:
            return differences(real[0], emulated[0], f"{path}[]")
        if sorted(map(_brief, real)) != sorted(map(_brief, emulated)):
            return [f"{path}[]: vLLM items {_brief(real)} vs emulator items {_brief(emulated)}"]
        return []
    if real != emulated:
        return [f"{path}: vLLM {_brief(real)} vs emulator {_brief(emulated)}"]
    return []


@dataclass(frozen=True)
class Event:
    """One SSE event: its `event:` name (None without one) and its data (decoded JSON, or the raw text)."""

    name: str | None
    data: Any


def parse_sse(text: str) -> list[Event]:
    events: list[Event] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if not data:
            continue  # a comment (keep-alive) or the trailing separator
        raw = "\n".join(data)
        try:
            events.append(Event(name, msgspec.json.decode(raw)))
        except msgspec.DecodeError:
            events.append(Event(name, raw))  # `[DONE]`
    return events


def stream_shape(events: list[Event], maps: frozenset[str] = frozenset()) -> list[tuple[str | None, Any]]:
    """(event name, data skeleton) per event, runs of equal ones collapsed; `[DONE]` stays as is."""
    shapes: list[tuple[str | None, Any]] = []
    for event in events:
        shape = (event.name, event.data if isinstance(event.data, str) else skeleton(event.data, maps))
        if not shapes or shapes[-1] != shape:
            shapes.append(shape)
    return shapes


def _label(shape: tuple[str | None, Any]) -> str:
    name, data = shape
    if isinstance(data, str):
        return data
    if name is not None:
        return name
    if isinstance(data, dict):
        choices = data.get("choices")
        if choices == []:
            return "usage-only chunk" if "usage" in data else "empty chunk"
        if "error" in data:
            return "error"
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" in delta:
                return "role chunk"
            return "finish chunk" if choice.get("finish_reason") == "str" else "content chunk"
    return "event"


def _choice_index(event: Event) -> int | None:
    data = event.data
    if isinstance(data, dict) and isinstance(data.get("choices"), list) and data["choices"]:
        first = data["choices"][0]
        if isinstance(first, dict) and isinstance(first.get("index"), int):
            return int(first["index"])
    return None


def _per_choice(events: list[Event]) -> dict[int, list[Event]]:
    indices = sorted({i for i in map(_choice_index, events) if i is not None}) or [0]
    return {i: [e for e in events if _choice_index(e) in (i, None)] for i in indices}


def stream_differences(real: list[Event], emulated: list[Event], maps: frozenset[str] = frozenset()) -> list[str]:
    """Where the emulated stream's shape differs from the real one's (empty when equal)."""
    mine, theirs = _per_choice(real), _per_choice(emulated)
    if len(mine) > 1 or len(theirs) > 1:
        if sorted(mine) != sorted(theirs):
            return [f"choices: vLLM streams indices {sorted(mine)}, the emulator {sorted(theirs)}"]
        out: list[str] = []
        for i in mine:
            out.extend(f"choice {i}: {line}" for line in _sequence_differences(mine[i], theirs[i], maps))
        return out
    return _sequence_differences(real, emulated, maps)


def _sequence_differences(real: list[Event], emulated: list[Event], maps: frozenset[str]) -> list[str]:
    a, b = stream_shape(real, maps), stream_shape(emulated, maps)
    labels_a, labels_b = [_label(s) for s in a], [_label(s) for s in b]
    out: list[str] = []
    if labels_a != labels_b:
        out.append(f"event sequence: vLLM {labels_a} vs emulator {labels_b}")
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x[0] != y[0]:
            out.append(f"event {i}: vLLM `event: {x[0]}` vs emulator `event: {y[0]}`")
        out.extend(f"event {i} ({labels_a[i]}) {line}" for line in differences(x[1], y[1]))
    return out

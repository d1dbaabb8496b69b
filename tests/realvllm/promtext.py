"""A small, careful reader of the Prometheus text format (the project venv has no prometheus_client).

Only what the tier needs: every sample's name, labels and value, and sums over label sets.
Label values are quoted strings with `\\\\`, `\\"` and `\\n` escapes and may hold spaces, commas or
braces, so they are scanned character by character rather than split.
"""

from __future__ import annotations

import math

__all__ = ("Sample", "parse_samples", "total")

Sample = tuple[str, dict[str, str], float]

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(text: str, start: int) -> tuple[dict[str, str], int]:
    """Labels from `text[start]` (just after `{`) to the closing `}`; returns them and the index after it."""
    labels: dict[str, str] = {}
    i = start
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if text[i] == "}":
            return labels, i + 1
        eq = text.index("=", i)
        name = text[i:eq].strip()
        i = eq + 1
        while text[i] == " ":
            i += 1
        if text[i] != '"':
            raise ValueError(f"label {name!r}: value is not quoted in {text!r}")
        i += 1
        value = []
        while text[i] != '"':
            if text[i] == "\\":
                value.append(_ESCAPES.get(text[i + 1], "\\" + text[i + 1]))
                i += 2
            else:
                value.append(text[i])
                i += 1
        labels[name] = "".join(value)
        i += 1


def _parse_value(text: str) -> float:
    token = text.split()[0]  # an optional timestamp may follow
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    return special[token] if token in special else float(token)


def parse_samples(text: str) -> list[Sample]:
    samples: list[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            labels, end = _parse_labels(line, brace + 1)
            samples.append((line[:brace], labels, _parse_value(line[end:])))
        else:
            samples.append((line[:space], {}, _parse_value(line[space + 1 :])))
    return samples


def total(samples: list[Sample], name: str, **match: str) -> float:
    """The sum of `name` over every label set (optionally only those whose labels include `match`)."""
    return sum(
        value
        for sample_name, labels, value in samples
        if sample_name == name and all(labels.get(k) == v for k, v in match.items())
    )

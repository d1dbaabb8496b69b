"""The bulk scans read what the Python fold reads: the fields of the slim events (`_slim`), no more, no fewer.

`call_sql` writes the scans' SELECT lists once over `PayloadSQL`; here a recording `PayloadSQL`
collects every payload path they read, and the paths must be the fields `fold_call`'s views declare
(nested structs flattened). A field added to a view and not to the SQL, or the other way round, fails.
"""

from __future__ import annotations

import re
import typing

import msgspec

from usage_ledger.ledger.events import CallFailed, CallFinished, CallStarted, Timings, Usage
from usage_ledger.projections._slim import SFailed, SFinished, SStarted, STimings, SUsage
from usage_ledger.projections.call_sql import END_KEPT_SQL, end_fields_sql, start_fields_sql, start_values_sql


class _Recorder:
    """A `PayloadSQL` that writes each read as a placeholder and remembers its path."""

    position = "position"
    type = "type"
    clean = "clean"

    def __init__(self) -> None:
        self.paths: set[str] = set()

    def _read(self, path: str) -> str:
        self.paths.add(path)
        return f"<{path}>"

    def field(self, path: str) -> str:
        return self._read(path)

    def json(self, path: str) -> str:
        return self._read(path)

    def json_text(self, path: str) -> str:
        return self._read(path)

    def is_object(self, path: str) -> str:
        return self._read(path)

    def lacks(self, text: str, char: str) -> str:
        return f"lacks({text})"

    def integer(self, value: str) -> str:
        return value

    def moment(self, value: str) -> str:
        return value

    def is_count(self, block: str, key: str) -> str:
        return f"is_count({block}.{key})"

    def count(self, block: str, key: str) -> str:
        return f"{block}.{key}"


def _struct_of(annotation: object) -> type[msgspec.Struct] | None:
    """The Struct an annotation holds (`X` or `X | None`), if any."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


def _paths(view: type[msgspec.Struct], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, annotation in typing.get_type_hints(view).items():
        nested = _struct_of(annotation)
        out |= _paths(nested, f"{prefix}{name}.") if nested else {prefix + name}
    return out


def test_the_start_scan_reads_the_fields_of_the_slim_start() -> None:
    recorder = _Recorder()
    start_fields_sql(recorder)
    start_values_sql(recorder)
    # the ticker is the fold's `tags.get("ticker")`: a path into a field the view has
    assert recorder.paths - {"tags.ticker"} == _paths(SStarted)


def test_the_end_scan_reads_the_fields_of_the_slim_finish_and_failure() -> None:
    recorder = _Recorder()
    end_fields_sql(recorder)
    assert recorder.paths == _paths(SFinished) | _paths(SFailed)


def test_the_ends_work_tables_keep_columns_the_end_scan_reads() -> None:
    selected = re.findall(r" AS (\w+)", end_fields_sql(_Recorder()))
    assert set(END_KEPT_SQL.split(", ")) <= set(selected)


def test_the_slim_views_are_the_events_fields_with_the_events_defaults() -> None:
    """A view reads a stored payload as its event would: a field it has that the event lacks, or a default the
    event does not give (what an absent field reads as, e.g. `usage_source` `absent`), would fold other values
    than the event holds. The bulk SQL's own defaults are those of `call_rules` (`NO_USAGE`…), as the fold's."""
    pairs = (
        (SStarted, CallStarted),
        (SFinished, CallFinished),
        (SFailed, CallFailed),
        (STimings, Timings),
        (SUsage, Usage),
    )
    for view, event in pairs:
        assert view.__struct_config__.tag == event.__struct_config__.tag  # the events' tags; none for the parts
        event_fields = {f.name: f for f in msgspec.structs.fields(event)}
        for field in msgspec.structs.fields(view):
            assert field.name in event_fields, f"{view.__name__}.{field.name}"
            assert (field.required, field.default) == (
                event_fields[field.name].required,
                event_fields[field.name].default,
            ), f"{view.__name__}.{field.name}"

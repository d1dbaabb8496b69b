"""The slim decoders (`projections._slim`) read a subset of each event: every field they declare must be a field
of the event of the same tag, of a type that accepts every value the event's can hold, with the event's default.
Otherwise a field renamed in `ledger.events` would decode silently as the slim default."""

from __future__ import annotations

import typing

import msgspec
import msgspec.inspect as mi
import pytest

from usage_ledger.ledger import Event
from usage_ledger.projections._slim import DECODERS

_EVENTS = {cls.__struct_config__.tag: cls for cls in typing.get_args(Event)}


def _accepts(slim: mi.Type, event: mi.Type) -> bool:
    """Whether every value of the event's type decodes as the slim type (which may be laxer)."""
    if isinstance(slim, mi.AnyType):
        return True
    if isinstance(event, mi.UnionType):
        return all(_accepts(slim, member) for member in event.types)
    if isinstance(slim, mi.UnionType):
        return any(_accepts(member, event) for member in slim.types)
    if isinstance(event, mi.LiteralType):
        return all(_accepts(slim, mi.type_info(type(value))) for value in event.values)
    if isinstance(slim, mi.StructType):
        if isinstance(event, mi.DictType):  # an object of any keys: fine if the slim one needs none of them
            return isinstance(event.key_type, mi.StrType) and not any(f.required for f in slim.fields)
        return isinstance(event, mi.StructType) and not _shape_problems(slim, event)
    if isinstance(slim, mi.ListType) and isinstance(event, mi.ListType):
        return _accepts(slim.item_type, event.item_type)
    if isinstance(slim, mi.DictType) and isinstance(event, mi.DictType):
        return _accepts(slim.key_type, event.key_type) and _accepts(slim.value_type, event.value_type)
    return type(slim) is type(event) and not isinstance(slim, (mi.StructType, mi.ListType, mi.DictType))


def _shape_problems(slim: mi.StructType, event: mi.StructType) -> list[str]:
    """What of the slim shape is not the event's: a missing field, a type that parts, another default."""
    fields = {f.encode_name: f for f in event.fields}
    where = f"{slim.cls.__name__} ~ {event.cls.__name__}"
    problems = []
    for field in slim.fields:
        theirs = fields.get(field.encode_name)
        if theirs is None:
            problems.append(f"{where}: {field.encode_name} is no field of the event")
        elif not _accepts(field.type, theirs.type):
            ours, their_type = slim.cls.__annotations__[field.name], event.cls.__annotations__[theirs.name]
            problems.append(f"{where}: {field.encode_name}: {ours} cannot hold the event's {their_type}")
        elif not theirs.required and (field.default, field.default_factory) != (
            theirs.default,
            theirs.default_factory,
        ):
            problems.append(
                f"{where}: {field.encode_name} defaults to {field.default!r}, the event's to {theirs.default!r}"
            )
    return problems


SLIM = sorted(tag for tag, decoder in DECODERS.items() if decoder.type is not _EVENTS.get(tag))


@pytest.mark.parametrize("tag", SLIM)
def test_a_slim_shape_is_part_of_its_event(tag: str) -> None:
    assert tag in _EVENTS, f"no event is tagged {tag!r}"
    slim, event = mi.type_info(DECODERS[tag].type), mi.type_info(_EVENTS[tag])
    assert isinstance(slim, mi.StructType) and isinstance(event, mi.StructType)
    assert _shape_problems(slim, event) == []


def test_the_slim_shapes_are_the_calls_events() -> None:
    assert SLIM == ["call.failed", "call.finished", "call.imported", "call.started"]


def test_a_renamed_or_retyped_field_is_caught() -> None:
    """The check itself: a slim shape that has parted from its event in each way is reported."""
    event = mi.type_info(_EVENTS["call.started"])
    assert isinstance(event, mi.StructType)
    parted = [
        msgspec.defstruct("Renamed", [("call_ident", str)]),
        msgspec.defstruct("Retyped", [("received_at", int)]),
        msgspec.defstruct("Nested", [("sampling", msgspec.defstruct("S", [("top_k", str)]))]),
        msgspec.defstruct("Defaulted", [("run", str | None, "x")]),
    ]
    for slim in parted:
        info = mi.type_info(slim)
        assert isinstance(info, mi.StructType)
        assert len(_shape_problems(info, event)) == 1, slim.__name__

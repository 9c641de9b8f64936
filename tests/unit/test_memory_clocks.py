"""Every number memory keeps declares the clock it is read on (sparkd.model.time), and every
daemon-time stamp is moved when daemon time is re-based: none is left out of a handover."""

from __future__ import annotations

import re
import types
import typing
from typing import Any

from pydantic import BaseModel

from sparkd.core.clock import bounded, restamp
from sparkd.core.remembering.handover import from_ages, to_ages
from sparkd.model.memory import Adopted, Memory, TokenMark
from sparkd.model.time import Clock


def floats(model: type[BaseModel], path: str = "Memory") -> list[tuple[str, Clock | None]]:
    """Every float field reachable from `model`, by path, with the clock it declares."""
    found: list[tuple[str, Clock | None]] = []

    def visit(kind: Any, where: str, clock: Clock | None) -> None:
        origin = typing.get_origin(kind)
        if origin is typing.Annotated:
            base, *extras = typing.get_args(kind)
            mark = next((e for e in extras if isinstance(e, Clock)), clock)
            visit(base, where, mark)
        elif kind is float:
            found.append((where, clock))
        elif isinstance(kind, type) and issubclass(kind, BaseModel):
            found.extend(floats(kind, where))
        elif origin in (typing.Union, types.UnionType, dict, tuple):
            for arm in typing.get_args(kind):
                if arm is not Ellipsis:
                    visit(arm, where, clock)

    for name, field in model.model_fields.items():
        mark = next((e for e in field.metadata if isinstance(e, Clock)), None)
        visit(field.annotation, f"{path}.{name}", mark)
    return found


# Names that say "a point in time": such a field must be read on a clock, not be a quantity.
POINT_WORDS = ("_at", ".at", "since", "until", "started", "launch", "entered")


def test_every_float_in_memory_declares_its_clock() -> None:
    found = floats(Memory)
    assert len(found) > 40  # the walk reached the nested records
    undeclared = [where for where, clock in found if clock is None]
    assert undeclared == []
    quantities_named_as_times = [
        where
        for where, clock in found
        if clock is not None and clock.name == "none" and where.endswith(POINT_WORDS)
    ]
    assert quantities_named_as_times == []


def test_a_handover_keeps_the_age_of_the_adoption_stamps() -> None:
    """Adoption's stamps came after the hand-kept list of stamps and were missing from it: a
    box taking over read a first contact's wait as days old, or not yet begun."""
    writer_now, reader_now = 2_000_000_000.0, 1_000.0
    memory = Memory(
        adopting_since=writer_now - 30.0,
        adopted=Adopted(containers={"spark-a": "ray-head"}, serve_pid=7, at=writer_now - 60.0),
        token_mark=TokenMark(tokens=5.0, since=writer_now - 5.0, quiet_since=writer_now - 4.0),
    )
    read = from_ages(to_ages(memory, writer_now), reader_now)
    assert read.adopting_since == reader_now - 30.0
    assert read.adopted is not None and read.adopted.at == reader_now - 60.0
    assert read.token_mark is not None
    assert (read.token_mark.since, read.token_mark.quiet_since) == (reader_now - 5.0, 996.0)
    assert read.token_mark.tokens == 5.0  # a count, not a time


def test_every_daemon_stamp_moves_and_nothing_else_does() -> None:
    """Fill every float memory can hold with a distinct value, move daemon time by 1000 s: the
    daemon stamps moved by exactly that, every other float (wall clock, monotonic, quantities)
    stayed, and the "never" of the backoff stays "never"."""
    values = iter(float(n) for n in range(1, 10_000))
    memory = Memory.model_validate(filled(Memory, values))
    moved = restamp(memory, lambda at: at + 1000.0)
    before, after = flat(memory), flat(moved)
    assert before.keys() == after.keys() and len(before) > 40
    clocks = dict(floats(Memory))
    for key, value in before.items():
        clock = clocks[re.sub(r"\[[^]]*\]", "", key)]  # the field, whatever its map key
        expected = value + 1000.0 if clock and clock.name == "daemon" else value
        assert after[key] == expected, key
    never = memory.evolve(backoff_reset_at=0.0)
    assert restamp(never, lambda at: at + 1000.0).backoff_reset_at == 0.0
    # A stamp from the future is taken as now, wherever it sits.
    assert bounded(memory, 5.0).adopting_since == 5.0


def filled(model: type[BaseModel], values: typing.Iterator[float]) -> dict[str, Any]:
    """A document with every field of `model` present, floats distinct, one entry per map."""

    def make(kind: Any) -> Any:
        origin = typing.get_origin(kind)
        args = typing.get_args(kind)
        if origin is typing.Annotated:
            return make(args[0])
        if kind is float:
            return next(values)
        if kind is int:
            return int(next(values))
        if kind is str:
            return f"s{int(next(values))}"
        if kind is bool:
            return True
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return filled(kind, values)
        if origin in (typing.Union, types.UnionType):
            return make(next(a for a in args if a is not type(None)))
        if origin is dict:
            return {make(args[0]): make(args[1])}
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return [make(args[0]), make(args[0])]
            return [make(a) for a in args]
        if origin is typing.Literal:
            return args[0]
        return None

    document: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        value = make(field.annotation)
        if value is not None:
            document[name] = value
    return document


def flat(value: Any, where: str = "Memory") -> dict[str, float]:
    """Every float in a memory, keyed by its field path (map keys and indices in brackets)."""
    out: dict[str, float] = {}
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            out.update(flat(getattr(value, name), f"{where}.{name}"))
    elif isinstance(value, dict):
        for key, item in value.items():
            out.update(flat(item, f"{where}[{key}]"))
    elif isinstance(value, tuple):
        for index, item in enumerate(value):
            out.update(flat(item, f"{where}[{index}]"))
    elif isinstance(value, float):
        out[where] = value
    return out

"""The time model: which clock each value comes from, and which may decide what.

Three kinds of time, never mixed without a conversion named here:

- **Daemon time** (`now` in the planner, every stamp in memory, `observed_at`, probe and
  action stamps): the ops box's monotonic clock plus an offset fixed when the daemon first ran
  in this boot (`Memory.clock`). It cannot step: NTP correcting a box that ran behind, an RTC
  wrong at boot or `date -s` move the wall clock, not this. Backoff, budget incidents, probe
  pacing, Ray reuse, Ray settling and every grace (join, load, stall) are measured on it.
- **Wall clock**: an operator's intent. A pause's end and a maintenance window are wall clock,
  and so are the events' `at`. The planner gets it as `wall` beside `now`; the difference
  between the two is the step detected since the anchor was set, logged and shown in `/status`.
- **Hosts' own reports**: a container's or process's age, CPU seconds, a log's mtime against
  the host's own `date`. Ages are durations the host vouches for; they become daemon time as
  `observed_at - age`, never by comparing the host's clock with ours.

Across a reboot of the ops box the monotonic clock starts again and the anchor is set anew
from the wall clock: a remembered stamp later than now is then taken as now (`bounded`), and
Ray settling never lasts longer than the Ray containers have existed (core.judging.ray_stage).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from sparkd.model.memory import Memory
from sparkd.model.time import Clock

Shift = Callable[[float], float]

# A wall clock that moved this far against daemon time has stepped (NTP slews stay far below).
STEP_NOTICED = 2.0


def bounded(memory: Memory, now: float) -> Memory:
    """`memory` with every daemon-time stamp later than `now` taken as `now`: a stamp from the
    future (the wall clock stepped back across a reboot) would otherwise stretch a backoff,
    suspend probe counting, make everything Ray shows look new, or let a rollout begun "in the
    future" judge no launch as its own and never roll back."""
    if _latest(memory) <= now:
        return memory
    return restamp(memory, lambda at: min(at, now))


def _latest(memory: Memory) -> float:
    stamps = [memory.backoff_reset_at]

    def seen(at: float) -> float:
        stamps.append(at)
        return at

    restamp(memory, seen)
    return max(stamps)


def restamp(memory: Memory, shift: Shift) -> Memory:
    """`memory` with `shift` applied to every daemon-time stamp it holds and to nothing else
    (wall-clock values, such as a pause's end, stay as they are), for `bounded` and for memory
    crossing to another box (core.remembering.handover). The stamps are the fields typed
    `DaemonTime` (sparkd.model.time), found by walking the model: there is no list of them to forget
    one in. A value that stands for "never" (a backoff never reset, 0.0) stays that."""
    moved = _walk_model(memory, shift)
    assert isinstance(moved, Memory)
    return moved


def _walk_model(value: BaseModel, shift: Shift) -> BaseModel:
    update: dict[str, Any] = {}
    for name, kind in _stamped_fields(type(value)):
        current = getattr(value, name)
        new = _walk(current, kind, shift)
        if new is not current:
            update[name] = new
    return value.model_copy(update=update) if update else value


@functools.cache
def _stamped_fields(model: type[BaseModel]) -> tuple[tuple[str, Any], ...]:
    """The fields of `model` that hold a daemon-time stamp somewhere inside, with their types:
    the walk is run every cycle over up to hundreds of attempts, and looks at nothing else."""
    fields = []
    for name, field in model.model_fields.items():
        # Pydantic keeps a field's own `Annotated[...]` as metadata beside the bare annotation.
        kind: Any = field.annotation
        if field.metadata:
            kind = Annotated[(kind, *field.metadata)]
        if _holds_stamp(kind):
            fields.append((name, kind))
    return tuple(fields)


def _holds_stamp(kind: Any) -> bool:
    origin = get_origin(kind)
    if origin is Annotated:
        base, *extras = get_args(kind)
        clock = next((e for e in extras if isinstance(e, Clock)), None)
        return clock.name == "daemon" if clock is not None else _holds_stamp(base)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return bool(_stamped_fields(kind))
    return any(_holds_stamp(arg) for arg in get_args(kind) if arg is not Ellipsis)


def _walk(value: Any, kind: Any, shift: Shift) -> Any:
    if value is None:
        return None
    origin = get_origin(kind)
    if origin is Annotated:
        base, *extras = get_args(kind)
        clock = next((e for e in extras if isinstance(e, Clock)), None)
        if clock is None:
            return _walk(value, base, shift)
        if clock.name != "daemon" or value == clock.never:
            return value
        return shift(value)
    if origin in (Union, UnionType):
        arms = [a for a in get_args(kind) if a is not NoneType]
        if len(arms) != 1:
            raise TypeError(f"memory holds no unions but optionals: {kind}")
        return _walk(value, arms[0], shift)
    if isinstance(value, BaseModel):
        return _walk_model(value, shift)
    if origin is dict:
        _, of = get_args(kind)
        return {key: _walk(item, of, shift) for key, item in value.items()}
    if origin is tuple:
        parts = get_args(kind)
        if len(parts) == 2 and parts[1] is Ellipsis:
            moved = tuple(_walk(item, parts[0], shift) for item in value)
        else:
            moved = tuple(_walk(item, part, shift) for item, part in zip(value, parts, strict=True))
        # The same tuple when nothing in it moved: the field is then left as it is, uncopied.
        return value if all(a is b for a, b in zip(moved, value, strict=True)) else moved
    return value


def stepped(offset: float, wall: float, mono: float) -> float:
    """How far the wall clock has moved against daemon time since the anchor was set
    (positive: forward)."""
    return wall - (mono + offset)

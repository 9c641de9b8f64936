"""Which clock a number in memory is read on, declared on the field itself.

`core.clock.restamp` moves every daemon-time stamp when daemon time is re-based (a stamp from the
future bounded to now, memory crossing to another box as ages) by walking the fields for
`DaemonTime`: a stamp is moved because its type says it is one, not because a hand-kept list
names it. Every float memory keeps carries one of these (tests/unit/test_memory_clocks.py), so a
new field cannot be left out by accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

ClockName = Literal["daemon", "wall", "monotonic", "none"]


@dataclass(frozen=True)
class Clock:
    """The clock a float is a reading of ("none": a quantity, not a point in time). `never` is
    a value that stands for "never happened" and is no reading (it is never moved)."""

    name: ClockName
    never: float | None = None


# The ops box's monotonic clock plus the anchor's offset (core.clock): moved on a re-base.
DaemonTime = Annotated[float, Clock("daemon")]
# An operator's intent or what is shown to one: never moved.
WallTime = Annotated[float, Clock("wall")]
# The ops box's raw monotonic clock (the anchor's own reading): never moved.
MonotonicTime = Annotated[float, Clock("monotonic")]
# A duration, a count or a ratio: no point in time.
Quantity = Annotated[float, Clock("none")]

"""Memory as it crosses from one ops box to another: daemon time made relative to the write.

Every daemon-time stamp in memory (sparkd.core.clock) is one box's elapsed clock plus an offset
fixed in that box's boot; another box's daemon time is a different clock. What goes into a
shared store is therefore each stamp's age at the write (`to_ages`: stamp minus the writer's
now, so zero or less), and what comes out is those ages counted back from the reader's now
(`from_ages`). The time between the write and the read is not counted: a grace, a backoff or a
budget window resumes with at least what remained at the write, never less, whatever the two
boxes' clocks say. Wall-clock values (a pause, a rollout's `started`) are an operator's or an
observation's wall time, the same on every box: untouched. The readings' marks (since when a
host is silent, its last flap, its GID row's move) are daemon time like the rest: a copy of
them would make a host silent seconds ago look silent for the boxes' difference, and a power
cycle due.
"""

from __future__ import annotations

from sparkd.core.clock import restamp
from sparkd.model.memory import Memory


def to_ages(memory: Memory, now: float) -> Memory:
    """`memory` with every daemon-time stamp as its age at `now` (negative seconds), and no
    clock anchor (it is the writer's box's)."""
    return restamp(memory, lambda at: at - now).evolve(clock=None)


def from_ages(memory: Memory, now: float) -> Memory:
    """A memory written by `to_ages`, as stamps on the daemon time whose present is `now`. An
    age above zero (a hand-edited record) is taken as zero: nothing lies in the future."""
    return restamp(memory, lambda age: now + min(age, 0.0))

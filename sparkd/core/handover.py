"""Memory as it crosses from one ops box to another: daemon time made relative to the write.

Every daemon-time stamp in memory (sparkd.core.clock) is one box's elapsed clock plus an offset
fixed in that box's boot; another box's daemon time is a different clock. What goes into a
shared store is therefore each stamp's age at the write (`to_ages`: stamp minus the writer's
now, so zero or less), and what comes out is those ages counted back from the reader's now
(`from_ages`). The time between the write and the read is not counted: a grace, a backoff or a
budget window resumes with at least what remained at the write, never less, whatever the two
boxes' clocks say. Wall-clock values (a pause, the unreachable and flap marks, a rollout's
`started`) are an operator's or an observation's wall time, the same on every box: untouched.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkd.model.memory import Blocked, LoadMark, Memory, Rollout

Shift = Callable[[float], float]

ROLLOUT_STAMPS = ("began_at", "stopped_at", "accepted_at", "rolled_back_at", "restored_at")


def to_ages(memory: Memory, now: float) -> Memory:
    """`memory` with every daemon-time stamp as its age at `now` (negative seconds), and no
    clock anchor (it is the writer's box's)."""
    return _shifted(memory, lambda at: at - now).evolve(clock=None)


def from_ages(memory: Memory, now: float) -> Memory:
    """A memory written by `to_ages`, as stamps on the daemon time whose present is `now`. An
    age above zero (a hand-edited record) is taken as zero: nothing lies in the future."""
    return _shifted(memory, lambda age: now + min(age, 0.0))


def _shifted(memory: Memory, shift: Shift) -> Memory:
    def maybe(value: float | None) -> float | None:
        return None if value is None else shift(value)

    mark = memory.load_mark
    blocked = memory.blocked
    return memory.evolve(
        attempts=tuple(a.model_copy(update={"at": shift(a.at)}) for a in memory.attempts),
        went_unreachable={
            host: tuple(shift(t) for t in times) for host, times in memory.went_unreachable.items()
        },
        # 0.0 is "never reset": it stays that on every box.
        backoff_reset_at=shift(memory.backoff_reset_at) if memory.backoff_reset_at else 0.0,
        blocked=None
        if blocked is None
        else Blocked(reason=blocked.reason, since=shift(blocked.since)),
        launched_at=maybe(memory.launched_at),
        model_ready_at=maybe(memory.model_ready_at),
        last_probe_at=maybe(memory.last_probe_at),
        last_probe=None
        if memory.last_probe is None
        else memory.last_probe.model_copy(update={"at": shift(memory.last_probe.at)}),
        ray_unsettled_since=maybe(memory.ray_unsettled_since),
        healthy_since=maybe(memory.healthy_since),
        fabric_sound_at=maybe(memory.fabric_sound_at),
        fabric_held_since=maybe(memory.fabric_held_since),
        ray_seen={node: shift(seen) for node, seen in memory.ray_seen.items()},
        ray_started={host: shift(started) for host, started in memory.ray_started.items()},
        load_mark=None
        if mark is None
        else LoadMark(
            pid=mark.pid,
            launch=shift(mark.launch),
            key=mark.key,
            cpu_seconds=mark.cpu_seconds,
            at=shift(mark.at),
            entered=maybe(mark.entered),
        ),
        token_mark=None
        if memory.token_mark is None
        else memory.token_mark.model_copy(update={"since": shift(memory.token_mark.since)}),
        last_good=None
        if memory.last_good is None
        else memory.last_good.model_copy(update={"at": shift(memory.last_good.at)}),
        rollout=_rollout(memory.rollout, shift),
    )


def _rollout(rollout: Rollout | None, shift: Shift) -> Rollout | None:
    if rollout is None:
        return None
    update = {
        name: shift(value)
        for name in ROLLOUT_STAMPS
        if (value := getattr(rollout, name)) is not None
    }
    return rollout.model_copy(update=update)

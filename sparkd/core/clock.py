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
Ray settling never lasts longer than the Ray containers have existed (core.ray_stage).
"""

from __future__ import annotations

from collections.abc import Callable

from sparkd.model.memory import Blocked, LoadMark, Memory, Rollout

Shift = Callable[[float], float]

ROLLOUT_STAMPS = ("began_at", "stopped_at", "accepted_at", "rolled_back_at", "restored_at")

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
    (wall-clock values, such as a pause's end, stay as they are): the one list of them, for
    `bounded` and for memory crossing to another box (core.handover). A backoff never reset
    (0.0) stays that."""

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
        observing_since=maybe(memory.observing_since),
        fabric_sound_at=maybe(memory.fabric_sound_at),
        fabric_held_since=maybe(memory.fabric_held_since),
        ray_seen={node: shift(seen) for node, seen in memory.ray_seen.items()},
        ray_started={host: shift(started) for host, started in memory.ray_started.items()},
        # The readings' times: how long a host has been silent (the power cycle's evidence),
        # when its carrier last flapped, when its GID row moved.
        unreachable_since={host: shift(t) for host, t in memory.unreachable_since.items()},
        refusing_since={host: shift(t) for host, t in memory.refusing_since.items()},
        gpu_unknown_since={host: shift(t) for host, t in memory.gpu_unknown_since.items()},
        owner_unknown_since={host: shift(t) for host, t in memory.owner_unknown_since.items()},
        omen_at={host: shift(t) for host, t in memory.omen_at.items()},
        flapped_at={host: shift(t) for host, t in memory.flapped_at.items()},
        gid_moved={
            host: (before, after, shift(at))
            for host, (before, after, at) in memory.gid_moved.items()
        },
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
        else memory.token_mark.model_copy(
            update={
                "since": shift(memory.token_mark.since),
                "quiet_since": maybe(memory.token_mark.quiet_since),
            }
        ),
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


def stepped(offset: float, wall: float, mono: float) -> float:
    """How far the wall clock has moved against daemon time since the anchor was set
    (positive: forward)."""
    return wall - (mono + offset)

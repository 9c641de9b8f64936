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

from sparkd.model.memory import Attempt, Blocked, LoadMark, Memory, Rollout

# A wall clock that moved this far against daemon time has stepped (NTP slews stay far below).
STEP_NOTICED = 2.0


def bounded(memory: Memory, now: float) -> Memory:
    """`memory` with every daemon-time stamp later than `now` taken as `now`: a stamp from the
    future (the wall clock stepped back across a reboot) would otherwise stretch a backoff,
    suspend probe counting, or make everything Ray shows look new."""

    def at(value: float) -> float:
        return min(value, now)

    def maybe(value: float | None) -> float | None:
        return None if value is None else min(value, now)

    if _latest(memory) <= now:
        return memory
    mark = memory.load_mark
    blocked = memory.blocked
    return memory.evolve(
        attempts=tuple(
            Attempt(key=a.key, at=at(a.at), ok=a.ok, reason=a.reason) for a in memory.attempts
        ),
        went_unreachable={
            host: tuple(at(t) for t in times) for host, times in memory.went_unreachable.items()
        },
        backoff_reset_at=at(memory.backoff_reset_at),
        blocked=None
        if blocked is None
        else Blocked(reason=blocked.reason, since=at(blocked.since)),
        launched_at=maybe(memory.launched_at),
        model_ready_at=maybe(memory.model_ready_at),
        last_probe_at=maybe(memory.last_probe_at),
        last_probe=None
        if memory.last_probe is None
        else memory.last_probe.model_copy(update={"at": at(memory.last_probe.at)}),
        ray_unsettled_since=maybe(memory.ray_unsettled_since),
        healthy_since=maybe(memory.healthy_since),
        fabric_sound_at=maybe(memory.fabric_sound_at),
        ray_seen={node: at(seen) for node, seen in memory.ray_seen.items()},
        ray_started={host: at(started) for host, started in memory.ray_started.items()},
        load_mark=None
        if mark is None
        else LoadMark(
            pid=mark.pid,
            launch=at(mark.launch),
            key=mark.key,
            cpu_seconds=mark.cpu_seconds,
            at=at(mark.at),
        ),
        token_mark=None
        if memory.token_mark is None
        else memory.token_mark.model_copy(update={"since": at(memory.token_mark.since)}),
        last_good=None
        if memory.last_good is None
        else memory.last_good.model_copy(update={"at": at(memory.last_good.at)}),
        rollout=_rollout(memory.rollout, now),
        fabric_held_since=maybe(memory.fabric_held_since),
    )


def _rollout(rollout: Rollout | None, now: float) -> Rollout | None:
    # A rollout begun "in the future" would judge no launch as its own and never roll back.
    if rollout is None:
        return None
    stamps = ("began_at", "stopped_at", "accepted_at", "rolled_back_at", "restored_at")
    update = {
        name: min(value, now)
        for name in stamps
        if (value := getattr(rollout, name)) is not None and value > now
    }
    return rollout.model_copy(update=update) if update else rollout


def _latest(memory: Memory) -> float:
    stamps = [a.at for a in memory.attempts]
    stamps.append(memory.backoff_reset_at)
    stamps.extend(memory.ray_seen.values())
    stamps.extend(memory.ray_started.values())
    stamps.extend(t for times in memory.went_unreachable.values() for t in times)
    for value in (
        memory.launched_at,
        memory.model_ready_at,
        memory.last_probe_at,
        memory.ray_unsettled_since,
        memory.healthy_since,
        memory.fabric_sound_at,
        memory.blocked.since if memory.blocked is not None else None,
        memory.last_probe.at if memory.last_probe is not None else None,
        memory.load_mark.at if memory.load_mark is not None else None,
        memory.load_mark.launch if memory.load_mark is not None else None,
        memory.token_mark.since if memory.token_mark is not None else None,
        memory.last_good.at if memory.last_good is not None else None,
        memory.fabric_held_since,
        *_rollout_stamps(memory.rollout),
    ):
        if value is not None:
            stamps.append(value)
    return max(stamps)


def _rollout_stamps(rollout: Rollout | None) -> tuple[float | None, ...]:
    if rollout is None:
        return ()
    return (
        rollout.began_at,
        rollout.stopped_at,
        rollout.accepted_at,
        rollout.rolled_back_at,
        rollout.restored_at,
    )


def stepped(offset: float, wall: float, mono: float) -> float:
    """How far the wall clock has moved against daemon time since the anchor was set
    (positive: forward)."""
    return wall - (mono + offset)

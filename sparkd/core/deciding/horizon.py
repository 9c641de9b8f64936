"""When a plan's decision can next change with nothing observed changing: the horizon.

A controller rechecks at `recheck_interval` at most while work is in progress; when what it
waits for has a known deadline sooner than that (a backoff ending, a pause's end, Ray's join
timeout, a load's stall or timeout limit, a probe falling due), it looks again at the deadline
instead of up to a whole recheck after it. Changes on the hosts themselves are the event
streams' to report.
"""

from __future__ import annotations

from collections.abc import Iterable

from sparkd.core.judging.load import silent_cap
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import LoadMark, Memory


def horizon(
    desired: ClusterSpec,
    memory: Memory,
    now: float,
    *,
    wall: float | None = None,
    backoffs: Iterable[float] = (),
    ray_unsettled: bool = False,
    load_mark: LoadMark | None = None,
    model_ready: bool = False,
    hang_at: float | None = None,
) -> float | None:
    """The earliest deadline after `now` among those this plan waits on, or None."""
    deadlines = list(backoffs)
    if memory.paused is not None and memory.paused.until is not None:
        # A pause ends on the wall clock: that moment, in daemon time.
        deadlines.append(now + memory.paused.until - (now if wall is None else wall))
    if ray_unsettled:
        since = memory.ray_unsettled_since if memory.ray_unsettled_since is not None else now
        deadlines.append(since + desired.ray.join_timeout)
    if load_mark is not None:
        deadlines.append(load_mark.at + desired.model.load_stall)
        deadlines.append(load_mark.launch + desired.model.load_timeout)
        cap = silent_cap(desired, load_mark)
        if cap is not None and load_mark.entered is not None:
            deadlines.append(load_mark.entered + cap)
    if model_ready and memory.last_probe_at is not None:
        deadlines.append(memory.last_probe_at + desired.probe_interval)
    if hang_at is not None:
        # A counter standing still under load becomes a hang at this moment (core.judging.hang).
        deadlines.append(hang_at)
    ahead = [d for d in deadlines if d > now]
    return min(ahead) if ahead else None

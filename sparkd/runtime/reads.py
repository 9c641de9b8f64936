"""The controller's read policy: what a look reads and what it may take from the last one."""

from __future__ import annotations

from sparkd.core.judging import hang
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import ModelEndpoint, RayState
from sparkd.runtime.cluster_view import ClusterView


def probe_due(cluster: ClusterSpec, memory: Memory, endpoint: ModelEndpoint, now: float) -> bool:
    """Whether this look probes the model (`now` in daemon time)."""
    if hang.stands(cluster, memory, endpoint, now):
        # The plan restarts a hung engine on this reading: a probe would only hold the look up
        # for its whole timeout first.
        return False
    ready_before = memory.model_ready_at is not None
    if endpoint.status != "up" and not ready_before:
        return False
    # The first probe of a launch goes as soon as the model answers; then every interval.
    last = memory.last_probe_at
    if memory.last_probe is None or last is None:
        return True
    return now - last >= cluster.probe_interval


def reusable_ray(
    view: ClusterView, *, stirred: bool, read_at: float | None, now: float, probe_interval: float
) -> RayState | None:
    """Ray's last reading, when it may stand in for a `ray` call (0.6-3 s of a core on the
    head each): the cluster is converged, nothing since stirred it (no event, no operator,
    no failed cycle), and Ray was read within a probe interval, so Ray is still verified
    at least as often as the model is probed."""
    plan, seen = view.plan, view.snapshot
    if stirred or view.last_error is not None or plan is None:
        return None
    if not plan.converged or seen is None or seen.ray is None or not seen.ray.up:
        return None
    if read_at is None or now - read_at >= probe_interval:
        return None
    return seen.ray

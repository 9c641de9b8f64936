"""Evidence belongs to the process it came from. Pure.

A "ready" mark, a probe result, a failure count or the Ray nodes of a launch are evidence about
one `vllm serve` process (its PID and start), never about the one that replaced it. A serve
process younger than a piece of evidence did not produce it: whoever started it (sparkd, an
operator by hand, a unit), it is a new launch and gets the load grace from its own start.
"""

from __future__ import annotations

from sparkd.core.judging.load import LAUNCH_SLACK
from sparkd.model.memory import Memory
from sparkd.model.observed import Observed


def serve_started(observed: Observed) -> float | None:
    """When the running serve process started (daemon time, from its host-reported age)."""
    serve = observed.serve
    if serve is None or not serve.running or serve.elapsed_seconds is None:
        return None
    return observed.observed_at - serve.elapsed_seconds


def of_this_launch(memory: Memory, observed: Observed) -> Memory:
    """`memory` without what it learnt about a serve process older than the one running."""
    started = serve_started(observed)
    if started is None:
        return memory
    before = started - LAUNCH_SLACK
    changes: dict[str, object] = {}
    if memory.model_ready_at is not None and memory.model_ready_at < before:
        changes["model_ready_at"] = None
    if memory.last_probe_at is not None and memory.last_probe_at < before:
        changes.update(consecutive_failures=0, busy_streak=0, unknown_streak=0, last_probe=None)
    if memory.launched_at is not None and memory.launched_at < before and memory.launch_nodes:
        # Started after sparkd's launch: the nodes it runs on were never recorded.
        changes["launch_nodes"] = ()
    return memory.model_copy(update=changes) if changes else memory

"""Where the serve's placement group stands, from its log since launch.

vLLM's Ray executor (vLLM 0.32.0 `v1/executor/ray_utils.py`, `initialize_ray_cluster`) logs
"No current placement group found. Creating a new placement group." (line 607) and, when the
cluster has fewer GPUs than it asks for, only a warning (line 613); it then waits for the group
(`_wait_until_pg_ready`, up to 1800 s, "Waiting for creating a placement group of specs for N
seconds" at 10, 30, 70 ... s) and goes on when a node joins. Once the group is ready,
`_verify_bundles` warns for each node holding fewer bundles than the tensor-parallel size (line
321, "... in a node NODE_ID"): with one GPU per node, every node the model runs on is named.
The workers' own lines then carry Ray's `(RayWorkerProc pid=N[, ip=IP])` prefix
(tests/fixtures/vllm-ray-executor/serve.log).

A launch still waiting has no Ray actors anywhere: a node that joins is where its group will go,
not a node it lost."""

from __future__ import annotations

import re

from sparkd.model.observed import Placement, PlacementStage, ServeState

_CREATING = "No current placement group found. Creating a new placement group."
_WAITING = "Waiting for creating a placement group of specs"
_SHORT = "exceeds the total number of available GPUs in the placement group"
_IN_NODE = re.compile(r"reserved number of GPUs \(\d+ GPUs\) in a node ([0-9a-f]{56})\b")
# Ray's prefix on a worker actor's output, after its colour code (raw, or made printable).
_WORKER = re.compile(r"^[^(]{0,12}\(RayWorkerProc pid=\d+")


def parse_placement(lines: list[str]) -> Placement | None:
    """`lines` are the latest launch's (core.reading.assemble cuts the log at its marker). None
    when the log says nothing of a placement group (no Ray executor, or not that far yet)."""
    stage: PlacementStage | None = None
    nodes: list[str] = []
    for line in lines:
        found = _IN_NODE.search(line)
        if found is not None:
            stage = "placed"
            if found[1] not in nodes:
                nodes.append(found[1])
        elif _WORKER.match(line):
            stage = "placed"
        elif stage is None and (_CREATING in line or _WAITING in line or _SHORT in line):
            stage = "waiting"
    if stage is None:
        return None
    return Placement(stage=stage, nodes=tuple(nodes))


def _running(serve: ServeState | None) -> Placement | None:
    """The placement of a serve that is running: an exited one's log says nothing of now."""
    return serve.placement if serve is not None and serve.running else None


def placed_nodes(serve: ServeState | None) -> tuple[str, ...]:
    """The Ray node ids the running serve's placement group went to, sorted, where its log names
    them; none otherwise (no Ray executor, a group still waiting, or lines not that far yet)."""
    placement = _running(serve)
    if placement is None or placement.stage != "placed":
        return ()
    return tuple(sorted(placement.nodes))


def placement_waiting(serve: ServeState | None) -> bool:
    """Whether the running serve's log shows its placement group still waiting for GPUs."""
    placement = _running(serve)
    return placement is not None and placement.stage == "waiting"

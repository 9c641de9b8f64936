"""The `ray` CLI inside a simulated container (`status` in the 2.60 or the older layout, `list
nodes`, `stop`), over the clusters `RayNodes` runs (see ray_nodes.py)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sparkd_sim.protocol import Done, fail
from sparkd_sim.ray_nodes import NodeLost, RayNodes
from sparkd_sim.ray_text import (
    LIST_USAGE,
    NO_CLUSTER_STATUS,
    NO_RESOURCE,
    no_cluster_traceback,
    no_dashboard,
)
from sparkd_sim.state import Container, RayCluster, RayNode
from sparkd_sim.timing import Timing

StatusLayout = Literal["active", "healthy"]
DEFAULT_LIST_LIMIT = 100
_LIST_COLUMNS = ("node_id", "node_ip", "is_head_node", "state", "state_message", "node_name")


def _size(gib: float) -> str:
    """A memory amount as `ray list nodes` prints it: `22.400 GiB`, `190.735 MiB`."""
    return f"{gib:.3f} GiB" if gib >= 1 else f"{gib * 1024:.3f} MiB"


def _status_size(gib: float) -> str:
    """A memory amount as `ray status` prints it: `44.66GiB`, `381.47MiB`."""
    return f"{gib:.2f}GiB" if gib >= 1 else f"{gib * 1024:.2f}MiB"


def status_text(cluster: RayCluster, timing: Timing, layout: StatusLayout = "active") -> str:
    """What `ray status` prints of a cluster that answers (the dashboard's formatted status is
    the same text). Under autoscaler v2 (`RAY_enable_autoscaler_v2=1`) a node with nothing
    scheduled on it is listed under `Idle:`, one in use under `Active:` (ray 2.60
    autoscaler/v2/utils.py `ClusterStatusFormatter`; tests/fixtures/ray-http/v2_two_nodes.jsonl)."""
    now = time.monotonic()
    head = next((n for n in cluster.nodes if n.is_head), None)
    if head is None or now < head.launched + head.counted_after:
        return NO_CLUSTER_STATUS + "\n"
    # Ray lists nodes sorted by id; the head is not singled out.
    active = sorted((n for n in cluster.nodes if n.active(now, timing)), key=_id)
    counted = cluster.counted_nodes(now, timing)
    cpus = sum(n.cpus for n in counted)
    gpus = sum(n.gpus for n in counted)
    memory = sum(n.memory_gib for n in counted)
    store = sum(n.object_store_gib for n in counted)
    used_gpus = min(cluster.gpus_in_use, gpus)
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
    active_title = "Active:" if layout == "active" else "Healthy:"
    usage = "Total Usage:" if layout == "active" else "Usage:"
    listed = [f" 1 node_{n.node_id}" for n in active]
    nodes = [active_title, *listed]
    if cluster.autoscaler_v2:
        # The placement group vLLM holds spans every GPU: every node is in use, or none is.
        busy = used_gpus > 0
        nodes = [
            "Active:",
            *(listed if busy and listed else [" (no active nodes)"]),
            "Idle:",
            *(listed if not busy and listed else [" (no idle nodes)"]),
        ]
    lines = [
        f"======== Autoscaler status: {stamp} ========",
        "Node status",
        "-" * 63,
        *nodes,
        "Pending:",
        " (no pending nodes)",
        "Recent failures:",
        " (no failures)",
        "",
        "Resources",
        "-" * 63,
        usage,
        f" 0.0/{cpus:.1f} CPU",
        f" {used_gpus:.1f}/{gpus:.1f} GPU",
        f" 0B/{_status_size(memory)} memory",
        f" 0B/{_status_size(store)} object_store_memory",
        "",
    ]
    if layout == "active":
        lines += ["From request_resources:", " (none)", "Pending Demands:"]
    else:
        lines += ["Demands:"]
    lines.append(" (no resource demands)")
    return "".join(line + "\n" for line in lines)


class RayWorld(RayNodes):
    """Ray's clusters (`RayNodes`) and the `ray` CLI inside a container."""

    def __init__(self, timing: Timing, on_node_lost: NodeLost) -> None:
        super().__init__(timing, on_node_lost)
        self.layout: StatusLayout = "active"

    def cli(self, container: Container | None, args: list[str]) -> Done:
        if container is None:
            return fail("bash: ray: command not found", 127)
        if not args:
            return Done(stdout="Usage: ray [OPTIONS] COMMAND [ARGS]...\n")
        cmd = args[0]
        if cmd == "status":
            return self.status(container)
        if cmd == "list":
            return self.list_nodes(container, args[1:])
        if cmd == "stop":
            return self.stop(container)
        if cmd == "start":
            return fail("ray start: only simulated as a container's main command (--block)", 1)
        return fail(
            "Usage: ray [OPTIONS] COMMAND [ARGS]...\nTry 'ray --help' for help.\n\n"
            f"Error: No such command '{cmd}'.",
            2,
        )

    def stop(self, container: Container) -> Done:
        """`ray stop`: SIGTERM to the container's Ray daemons; `ray start --block` stays."""
        found = self.node_of(container.id)
        if found is None:
            return Done(stdout="Did not find any active Ray processes.\n")
        cluster, node = found
        daemons = [p for p in container.processes[1:] if _is_ray_daemon(p.args)]
        for proc in daemons:
            container.processes.remove(proc)
        node.stopped = True
        self._node_died(cluster, node, "stopped")
        node.raylet_exit.set()
        if node.is_head:
            self._end(cluster)
        return Done(stdout=f"Stopped all {len(daemons)} Ray processes.\n")

    def status(self, container: Container) -> Done:
        cluster = self.cluster_of(container.id)
        now = time.monotonic()
        if cluster is None or not cluster.answers(now):
            return fail(no_cluster_traceback("status"), 1)
        return Done(stdout=status_text(cluster, self.timing, self.layout))

    def list_nodes(self, container: Container, args: list[str]) -> Done:
        if not args or args[0] != "nodes":
            what = args[0] if args else ""
            return fail(
                LIST_USAGE + f"\nError: Invalid value for '{{actors|jobs|placement-groups|nodes|"
                f"workers|tasks|objects|runtime-envs|cluster-events}}': '{what}'",
                2,
            )
        options = _parse_list(args[1:])
        if isinstance(options, Done):
            return options
        fmt, filters, limit = options
        cluster = self.cluster_of(container.id)
        now = time.monotonic()
        if cluster is None or not cluster.answers(now):
            return fail(no_cluster_traceback("list"), 1)
        if not cluster.dashboard:
            return fail(no_dashboard(limit), 2)
        rows = []
        for node in sorted(cluster.nodes, key=_id):
            state = node.state(now, self.timing)
            if state is None:
                continue
            row = self._row(node, state, node.state_message(now, self.timing))
            if all(_filter_match(row, f) for f in filters):
                rows.append(row)
        rows = rows[:limit]
        if not rows:
            return Done(stdout=NO_RESOURCE + "\n")
        if fmt == "json":
            # One line, Python's default separators (what `json.dumps` gives Ray's CLI).
            return Done(stdout=json.dumps(rows) + "\n")
        if fmt == "yaml":
            return fail("ray list: --format=yaml is not simulated", 2)
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
        out = [
            f"======== List: {stamp} ========",
            "Stats:",
            "------------------------------",
            f"Total: {len(rows)}",
            "",
            "Table:",
            "------------------------------",
            "    NODE_ID  NODE_IP  IS_HEAD_NODE  STATE  STATE_MESSAGE  NODE_NAME",
        ]
        for i, row in enumerate(rows):
            out.append(
                f" {i}  {row['node_id']}  {row['node_ip']}  {row['is_head_node']}  "
                f"{row['state']}  {row['state_message'] or ''}  {row['node_name']}"
            )
        return Done(stdout="\n".join(out) + "\n")

    @staticmethod
    def _row(node: RayNode, state: str, message: str | None) -> dict[str, object]:
        # Key order as Ray 2.60 printed it in the samples (it varies between calls there).
        resources: dict[str, object] = {"CPU": node.cpus}
        if node.is_head:
            resources[f"node:{node.ip}"] = 1.0
            resources["object_store_memory"] = _size(node.object_store_gib)
            resources["node:__internal_head__"] = 1.0
            resources["memory"] = _size(node.memory_gib)
            if node.gpus:
                resources["GPU"] = node.gpus
        else:
            resources["object_store_memory"] = _size(node.object_store_gib)
            resources[f"node:{node.ip}"] = 1.0
            if node.gpus:
                resources["GPU"] = node.gpus
            resources["memory"] = _size(node.memory_gib)
        return {
            **node.listed(state, message, resources),
            "start_time_ms": None,
            "end_time_ms": None,
        }


@dataclass
class _Filter:
    key: str
    op: str
    value: str


def _parse_list(args: list[str]) -> tuple[str, list[_Filter], int] | Done:
    fmt, limit = "default", DEFAULT_LIST_LIMIT
    filters: list[_Filter] = []
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in ("--format", "--filter", "-f", "--limit", "--timeout", "--address"):
            if not eq:
                i += 1
                if i >= len(args):
                    return fail(LIST_USAGE + f"\nError: Option '{name}' requires an argument.", 2)
                value = args[i]
            if name == "--format":
                fmt = value
            elif name in ("--filter", "-f"):
                for op in ("!=", "="):
                    key, found, want = value.partition(op)
                    if found:
                        break
                if not found or key.strip() not in _LIST_COLUMNS:
                    return fail(
                        LIST_USAGE + f"\nError: Invalid filter {value!r}: the filter column must "
                        f"be one of {', '.join(_LIST_COLUMNS)}",
                        2,
                    )
                filters.append(_Filter(key.strip(), op, want.strip()))
            elif name == "--limit":
                if not value.isdigit():
                    return fail(
                        LIST_USAGE + f"\nError: Invalid value for '--limit': '{value}' is not a "
                        "valid integer.",
                        2,
                    )
                limit = int(value)
        elif name not in ("--detail", "--explain"):
            return fail(LIST_USAGE + f"\nError: No such option: {name}", 2)
        i += 1
    return fmt, filters, limit


def _filter_match(row: dict[str, object], f: _Filter) -> bool:
    value = row.get(f.key)
    if isinstance(value, bool):
        text = "true" if value else "false"
        equal = text == f.value.lower()
    elif f.key == "state":
        equal = str(value).upper() == f.value.upper()
    else:
        equal = str(value) == f.value
    return equal if f.op == "=" else not equal


def _id(node: RayNode) -> str:
    return node.node_id


def _is_ray_daemon(args: str) -> bool:
    return any(name in args for name in ("gcs_server", "raylet", "dashboard"))

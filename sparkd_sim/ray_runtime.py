"""Ray as the simulated containers run it: `ray start --block` as a container's main command, node
registration and death with the delays real Ray 2.60 shows (`Timing`), and the `ray` CLI (`status`
in the 2.60 or the older layout, `list nodes`, `stop`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sparkd_sim.engine import HostEngine
from sparkd_sim.protocol import Done, fail
from sparkd_sim.ray_text import (
    LIST_USAGE,
    NO_CLUSTER_STATUS,
    NO_RESOURCE,
    no_cluster_traceback,
    no_dashboard,
)
from sparkd_sim.state import Container, DeathKind, RayCluster, RayNode, new_node_id
from sparkd_sim.timing import Timing

StatusLayout = Literal["active", "healthy"]
NodeLost = Callable[[RayCluster, RayNode], None]
DEFAULT_LIST_LIMIT = 100
_LIST_COLUMNS = ("node_id", "node_ip", "is_head_node", "state", "state_message", "node_name")


@dataclass
class StartArgs:
    block: bool = False
    head: bool = False
    address: str | None = None
    node_ip: str | None = None
    port: int = 6379
    dashboard: bool = True
    dashboard_port: int = 8265
    num_gpus: float = 1.0
    errors: list[str] = field(default_factory=list)


def parse_start(args: list[str]) -> StartArgs:
    parsed = StartArgs()
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        takes_value = name in (
            "--address",
            "--node-ip-address",
            "--port",
            "--dashboard-host",
            "--dashboard-port",
            "--include-dashboard",
            "--num-gpus",
            "--num-cpus",
            "--object-store-memory",
            "--resources",
            "--temp-dir",
            "--disable-usage-stats",
        )
        if takes_value and not eq and name != "--disable-usage-stats":
            i += 1
            value = args[i] if i < len(args) else ""
        if name == "--block":
            parsed.block = True
        elif name == "--head":
            parsed.head = True
        elif name == "--address":
            parsed.address = value
        elif name == "--node-ip-address":
            parsed.node_ip = value
        elif name == "--port":
            parsed.port = int(value)
        elif name == "--dashboard-port" and value.isdigit():
            parsed.dashboard_port = int(value)
        elif name == "--include-dashboard":
            parsed.dashboard = value.lower() in ("true", "1", "yes")
        elif name == "--num-gpus":
            parsed.num_gpus = float(value)
        elif not takes_value:
            parsed.errors.append(f"Error: No such option: {name}")
        i += 1
    return parsed


def _size(gib: float) -> str:
    """A memory amount as `ray list nodes` prints it: `22.400 GiB`, `190.735 MiB`."""
    return f"{gib:.3f} GiB" if gib >= 1 else f"{gib * 1024:.3f} MiB"


def _status_size(gib: float) -> str:
    """A memory amount as `ray status` prints it: `44.66GiB`, `381.47MiB`."""
    return f"{gib:.2f}GiB" if gib >= 1 else f"{gib * 1024:.2f}MiB"


class RayWorld:
    def __init__(self, timing: Timing, on_node_lost: NodeLost) -> None:
        self.timing = timing
        self.layout: StatusLayout = "active"
        self.clusters: list[RayCluster] = []
        self._on_node_lost = on_node_lost
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def _poll(self) -> float:
        return max(0.005, self.timing.join_retry / 8)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    # -- lookups -----------------------------------------------------------------------------

    def cluster_at(self, ip: str, port: int) -> RayCluster | None:
        """The cluster whose head answers at ip:port (what a joining worker dials)."""
        now = time.monotonic()
        for cluster in self.clusters:
            if cluster.ip == ip and cluster.port == port and cluster.answers(now):
                return cluster
        return None

    def _running_at(self, ip: str, port: int) -> RayCluster | None:
        for cluster in self.clusters:
            if cluster.alive and cluster.ip == ip and cluster.port == port:
                return cluster
        return None

    def node_of(self, container_id: str) -> tuple[RayCluster, RayNode] | None:
        """The node this container's raylet currently is, if its Ray still runs."""
        for cluster in self.clusters:
            if not cluster.alive:
                continue
            for node in cluster.nodes:
                if node.container_id == container_id and node.runs:
                    return cluster, node
        return None

    def cluster_of(self, container_id: str) -> RayCluster | None:
        found = self.node_of(container_id)
        return found[0] if found is not None else None

    # -- `ray start --block` as a container's main command -----------------------------------

    async def run_start(self, engine: HostEngine, container: Container, args: list[str]) -> int:
        parsed = parse_start(args)
        if parsed.errors:
            for line in parsed.errors:
                container.log(line)
            return 2
        host = engine.state
        node_ip = host.ray_ip_override or parsed.node_ip or host.data_ip
        if node_ip in ("127.0.0.1", "localhost"):
            # Ray rewrites a loopback node IP to the machine's primary address.
            node_ip = host.address
        container.log("Usage stats collection is disabled.")
        container.log("")
        container.log(f"Local node IP: {node_ip}")
        if not parsed.block:
            # Without --block the daemons detach and the main command returns: the container
            # exits and takes them with it, as with real Ray in a container.
            container.log("Ray runtime started.")
            return 0
        if parsed.head:
            return await self._run_head(engine, container, parsed, node_ip)
        return await self._run_worker(engine, container, parsed, node_ip)

    async def _run_head(
        self, engine: HostEngine, container: Container, parsed: StartArgs, node_ip: str
    ) -> int:
        if self._running_at(node_ip, parsed.port) is not None:
            await asyncio.sleep(self.timing.head_answer)
            container.log(
                f"ConnectionError: Ray is trying to start at {node_ip}:{parsed.port}, "
                "but is already running at the same address."
            )
            return 1
        now = time.monotonic()
        cluster = RayCluster(
            head_container_id=container.id,
            head_host=engine.state.name,
            ip=node_ip,
            port=parsed.port,
            dashboard=parsed.dashboard,
            dashboard_port=parsed.dashboard_port,
            launched=now,
            answers_after=self.timing.head_answer,
        )
        node = RayNode(
            node_id=new_node_id(),
            ip=node_ip,
            host=engine.state.name,
            container_id=container.id,
            is_head=True,
            gpus=parsed.num_gpus,
            launched=now,
            listed_after=self.timing.head_listed,
            counted_after=self.timing.head_counted,
        )
        cluster.nodes.append(node)
        self.clusters.append(cluster)
        engine.add_process(
            container, f"/usr/local/bin/gcs_server --gcs_server_port={parsed.port}", cores=0.05
        )
        engine.add_process(
            container, "/usr/local/bin/raylet --node_ip_address=" + node_ip, cores=0.05
        )
        if parsed.dashboard:
            engine.add_process(container, "/usr/bin/python3 -u dashboard/dashboard.py", cores=0.02)
        for line in (
            "--------------------",
            "Ray runtime started.",
            "--------------------",
            "",
            "Next steps",
            "  To add another node to this Ray cluster, run",
            f"    ray start --address='{node_ip}:{parsed.port}'",
            "",
            "--block",
            "  This command will now block forever until terminated by a signal.",
            "  Running subprocesses are monitored and a message will be printed if any of them "
            "terminate unexpectedly. Subprocesses exit with SIGTERM will be treated as graceful, "
            "thus NOT reported.",
        ):
            container.log(line)
        try:
            await node.raylet_exit.wait()
            if node.stopped:
                # `ray stop` ended the daemons with SIGTERM: `--block` keeps running, empty.
                await asyncio.Event().wait()
            self._subprocesses_died(container)
            return 1
        finally:
            self._node_died(cluster, node, "killed")
            self._end(cluster)

    async def _run_worker(
        self, engine: HostEngine, container: Container, parsed: StartArgs, node_ip: str
    ) -> int:
        address = parsed.address or ""
        head_ip, _, port_text = address.rpartition(":")
        port = int(port_text) if port_text.isdigit() else 6379
        cluster = self.cluster_at(head_ip, port)
        while cluster is None:
            # A worker with no head to join retries for ever (the container never exits).
            container.log(
                f"Failed to connect to GCS at address {address} within 5 seconds. Retrying..."
            )
            await asyncio.sleep(self.timing.join_retry)
            cluster = self.cluster_at(head_ip, port)
        node = RayNode(
            node_id=new_node_id(),
            ip=node_ip,
            host=engine.state.name,
            container_id=container.id,
            is_head=False,
            gpus=parsed.num_gpus,
            listed_after=self.timing.worker_listed,
            counted_after=self.timing.worker_counted,
        )
        cluster.nodes.append(node)
        engine.add_process(
            container, "/usr/local/bin/raylet --node_ip_address=" + node_ip, cores=0.05
        )
        container.log("--------------------")
        container.log("Ray runtime started.")
        container.log("--------------------")
        try:
            return await self._worker_life(container, cluster, node, address)
        finally:
            self._node_died(cluster, node, "killed")

    async def _worker_life(
        self, container: Container, cluster: RayCluster, node: RayNode, address: str
    ) -> int:
        exit_wait = asyncio.ensure_future(node.raylet_exit.wait())
        head_wait = asyncio.ensure_future(cluster.ended.wait())
        try:
            await asyncio.wait({exit_wait, head_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exit_wait.cancel()
            head_wait.cancel()
        if not node.raylet_exit.is_set():
            # The head went away. A new head at the same address has another cluster ID: the
            # raylet dies a while after it is up. With no head at all it gives up on GCS.
            ended_at = cluster.ended_at or time.monotonic()
            while not node.raylet_exit.is_set():
                now = time.monotonic()
                new = self.cluster_at(cluster.ip, cluster.port)
                give_up = ended_at + self.timing.gcs_reconnect_timeout
                if new is not None and new.up_since() < give_up:
                    if now >= new.up_since() + self.timing.head_mismatch:
                        break
                elif now >= give_up:
                    container.log(
                        f"Failed to connect to GCS at address {address} within "
                        f"{self.timing.gcs_reconnect_timeout:g} seconds."
                    )
                    break
                await asyncio.sleep(self._poll)
        if node.stopped:
            await asyncio.Event().wait()
        self._subprocesses_died(container)
        return 1

    @staticmethod
    def _subprocesses_died(container: Container) -> None:
        container.log("Some Ray subprocesses exited unexpectedly:")
        container.log("  raylet [exit code=1]")
        container.log("Remaining processes will be killed.")

    def _end(self, cluster: RayCluster) -> None:
        if cluster.alive:
            cluster.alive = False
            cluster.ended_at = time.monotonic()
            cluster.ended.set()

    def _node_died(self, cluster: RayCluster, node: RayNode, kind: DeathKind) -> None:
        """The node's raylet stopped answering; the head notices per `Timing`."""
        if kind == "killed" and (node.stopped or any(k == "killed" for _, k in node.deaths)):
            return
        node.deaths.append((time.monotonic(), kind))
        if kind == "hung":
            self._spawn(self._declare_dead(cluster, node))
        else:
            self._lose(cluster, node)

    def _lose(self, cluster: RayCluster, node: RayNode) -> None:
        if not node.lost:
            node.lost = True
            self._on_node_lost(cluster, node)

    async def _declare_dead(self, cluster: RayCluster, node: RayNode) -> None:
        await asyncio.sleep(self.timing.hung_listed)
        if node.hung:
            self._lose(cluster, node)

    # -- hung nodes (stopped processes, a host that stops answering) -------------------------

    def freeze(self, container_id: str) -> list[RayNode]:
        """The container's Ray stops answering: Ray declares its node dead after the hung-node
        delay; what uses the node is lost then."""
        frozen = []
        for cluster in self.clusters:
            for node in cluster.nodes:
                if node.container_id == container_id and node.runs and not node.hung:
                    self._node_died(cluster, node, "hung")
                    frozen.append(node)
        return frozen

    def thaw(self, container_id: str) -> None:
        """It answers again: in time, as if nothing happened; once declared dead, its raylet is
        told so and exits (then `ray start --block` exits 1)."""
        now = time.monotonic()
        for cluster in self.clusters:
            for node in cluster.nodes:
                if node.container_id != container_id or not node.hung:
                    continue
                hung_at = min(at for at, k in node.deaths if k == "hung")
                if now < hung_at + self.timing.hung_listed and cluster.alive:
                    node.deaths = [(at, k) for at, k in node.deaths if k != "hung"]
                else:
                    node.raylet_exit.set()

    def frozen(self, container_id: str) -> bool:
        return any(
            n.container_id == container_id and n.hung and not n.raylet_exit.is_set()
            for c in self.clusters
            for n in c.nodes
        )

    # -- the `ray` CLI inside a container ----------------------------------------------------

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
        head = next((n for n in cluster.nodes if n.is_head), None)
        if head is None or now < head.launched + head.counted_after:
            return Done(stdout=NO_CLUSTER_STATUS + "\n")
        # Ray lists nodes sorted by id; the head is not singled out.
        active = sorted((n for n in cluster.nodes if n.active(now, self.timing)), key=_id)
        counted = cluster.counted_nodes(now, self.timing)
        cpus = sum(n.cpus for n in counted)
        gpus = sum(n.gpus for n in counted)
        memory = sum(n.memory_gib for n in counted)
        store = sum(n.object_store_gib for n in counted)
        used_gpus = min(cluster.gpus_in_use, gpus)
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
        active_title = "Active:" if self.layout == "active" else "Healthy:"
        usage = "Total Usage:" if self.layout == "active" else "Usage:"
        lines = [
            f"======== Autoscaler status: {stamp} ========",
            "Node status",
            "-" * 63,
            active_title,
            *(f" 1 node_{n.node_id}" for n in active),
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
        if self.layout == "active":
            lines += ["From request_resources:", " (none)", "Pending Demands:"]
        else:
            lines += ["Demands:"]
        lines.append(" (no resource demands)")
        return Done(stdout="".join(line + "\n" for line in lines))

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
            "node_id": node.node_id,
            "node_ip": node.ip,
            "is_head_node": node.is_head,
            "state": state,
            "state_message": message,
            "node_name": node.ip,
            "resources_total": resources,
            "labels": {"ray.io/node-id": node.node_id},
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

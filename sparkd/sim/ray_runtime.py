"""Ray as the simulated containers run it: `ray start --block` as a container's main command, node
registration with measured delays, heartbeat-timeout lag for dead nodes, and the `ray` CLI
(`status` in the 2.60 or the older layout, `list nodes --format=json`, `stop`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from sparkd.sim.engine import HostEngine
from sparkd.sim.protocol import Done, fail
from sparkd.sim.state import Container, RayCluster, RayNode, new_node_id
from sparkd.sim.timing import Timing

StatusLayout = Literal["active", "healthy"]
NodeLost = Callable[[RayCluster, RayNode], None]

_NO_CLUSTER = (
    "ConnectionError: Could not find any running Ray instance. Please specify the one to connect "
    "to by setting `--address` flag or `RAY_ADDRESS` environment variable."
)
_NO_DASHBOARD = (
    "ConnectionError: Failed to connect to API server. Please check the API server log for "
    "details. Make sure dependencies are installed with `pip install ray[default]`. Please also "
    "check dashboard is available, and included when starting ray cluster, i.e., "
    "`ray start --include-dashboard=True --head`. "
    "Response(url=http://127.0.0.1:8265/api/v0/nodes?limit=100&timeout=30&detail=False"
    "&exclude_driver=True&server_timeout_multiplier=0.8,status=500)"
)


@dataclass
class StartArgs:
    block: bool = False
    head: bool = False
    address: str | None = None
    node_ip: str | None = None
    port: int = 6379
    dashboard: bool = True
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
        elif name == "--include-dashboard":
            parsed.dashboard = value.lower() in ("true", "1", "yes")
        elif name == "--num-gpus":
            parsed.num_gpus = float(value)
        elif not takes_value:
            parsed.errors.append(f"Error: No such option: {name}")
        i += 1
    return parsed


class RayWorld:
    def __init__(self, timing: Timing, on_node_lost: NodeLost) -> None:
        self.timing = timing
        self.layout: StatusLayout = "active"
        self.clusters: list[RayCluster] = []
        self._on_node_lost = on_node_lost

    # -- lookups -----------------------------------------------------------------------------

    def cluster_at(self, ip: str, port: int) -> RayCluster | None:
        for cluster in self.clusters:
            if cluster.alive and cluster.ip == ip and cluster.port == port:
                return cluster
        return None

    def cluster_of(self, container_id: str) -> RayCluster | None:
        for cluster in self.clusters:
            if not cluster.alive:
                continue
            for node in cluster.nodes:
                if node.container_id == container_id and node.died_at is None:
                    return cluster
        return None

    # -- `ray start --block` as a container's main command -----------------------------------

    async def run_start(self, engine: HostEngine, container: Container, args: list[str]) -> int:
        parsed = parse_start(args)
        if parsed.errors:
            for line in parsed.errors:
                container.log(line)
            return 2
        host = engine.state
        node_ip = host.ray_ip_override or parsed.node_ip or host.data_ip
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
        await asyncio.sleep(self.timing.head_start)
        if self.cluster_at(node_ip, parsed.port) is not None:
            container.log(
                f"ConnectionError: Ray is trying to start at {node_ip}:{parsed.port}, "
                "but is already running at the same address."
            )
            return 1
        cluster = RayCluster(
            head_container_id=container.id,
            head_host=engine.state.name,
            ip=node_ip,
            port=parsed.port,
            dashboard=parsed.dashboard,
        )
        node = RayNode(
            node_id=new_node_id(),
            ip=node_ip,
            host=engine.state.name,
            container_id=container.id,
            is_head=True,
            gpus=parsed.num_gpus,
        )
        cluster.nodes.append(node)
        self.clusters.append(cluster)
        engine.add_process(container, "/usr/local/bin/gcs_server --gcs_server_port=6379")
        engine.add_process(container, "/usr/local/bin/raylet --node_ip_address=" + node_ip)
        if parsed.dashboard:
            engine.add_process(container, "/usr/bin/python3 -u dashboard/dashboard.py")
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
            await asyncio.Event().wait()
        finally:
            self._node_died(cluster, node)
            cluster.alive = False
            cluster.ended.set()
        return 0

    async def _run_worker(
        self, engine: HostEngine, container: Container, parsed: StartArgs, node_ip: str
    ) -> int:
        address = parsed.address or ""
        head_ip, _, port_text = address.rpartition(":")
        port = int(port_text) if port_text.isdigit() else 6379
        started = time.monotonic()
        await asyncio.sleep(self.timing.worker_join)
        cluster = self.cluster_at(head_ip, port)
        while cluster is None:
            if time.monotonic() - started >= self.timing.join_timeout:
                container.log(
                    f"Failed to connect to GCS at address {address} within "
                    f"{self.timing.join_timeout:g} seconds."
                )
                container.log(
                    f"ConnectionError: Failed to connect to GCS at address {address}. "
                    "Make sure the head node is running and reachable."
                )
                return 1
            await asyncio.sleep(max(0.01, self.timing.worker_join / 4))
            cluster = self.cluster_at(head_ip, port)
        node = RayNode(
            node_id=new_node_id(),
            ip=node_ip,
            host=engine.state.name,
            container_id=container.id,
            is_head=False,
            gpus=parsed.num_gpus,
        )
        cluster.nodes.append(node)
        engine.add_process(container, "/usr/local/bin/raylet --node_ip_address=" + node_ip)
        container.log("--------------------")
        container.log("Ray runtime started.")
        container.log("--------------------")
        try:
            await cluster.ended.wait()
            # The head went away: the raylet gives up once GCS stays unreachable.
            await asyncio.sleep(self.timing.gcs_reconnect_timeout)
            container.log(
                f"Failed to connect to GCS at address {address} within "
                f"{self.timing.gcs_reconnect_timeout:g} seconds."
            )
            container.log("Some Ray subprocesses exited unexpectedly:")
            container.log("  raylet [exit code=1]")
            return 1
        finally:
            self._node_died(cluster, node)

    def _node_died(self, cluster: RayCluster, node: RayNode) -> None:
        if node.died_at is None:
            node.died_at = time.monotonic()
            self._on_node_lost(cluster, node)

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
            return fail("ray stop: not simulated; stop the container instead", 1)
        if cmd == "start":
            return fail("ray start: only simulated as a container's main command (--block)", 1)
        return fail(
            "Usage: ray [OPTIONS] COMMAND [ARGS]...\nTry 'ray --help' for help.\n\n"
            f"Error: No such command '{cmd}'.",
            2,
        )

    def status(self, container: Container) -> Done:
        cluster = self.cluster_of(container.id)
        if cluster is None:
            return fail(_NO_CLUSTER, 1)
        now = time.monotonic()
        nodes = cluster.counted_nodes(now, self.timing.heartbeat_timeout)
        # Ray lists nodes sorted by id; the head is not singled out.
        nodes = sorted(nodes, key=lambda n: n.node_id)
        cpus = sum(n.cpus for n in nodes)
        gpus = sum(n.gpus for n in nodes)
        memory = sum(n.memory_gib for n in nodes)
        store = sum(n.object_store_gib for n in nodes)
        used_gpus = min(cluster.gpus_in_use, gpus)
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
        active = "Active:" if self.layout == "active" else "Healthy:"
        usage = "Total Usage:" if self.layout == "active" else "Usage:"
        lines = [
            f"======== Autoscaler status: {stamp} ========",
            "Node status",
            "-" * 63,
            active,
            *(f" 1 node_{n.node_id}" for n in nodes),
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
            f" 0B/{memory:.2f}GiB memory",
            f" 0B/{store:.2f}GiB object_store_memory",
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
            return fail(f"Error: Invalid value for '{{actors|jobs|nodes|...}}': '{what}'", 2)
        fmt = "default"
        rest = args[1:]
        for i, arg in enumerate(rest):
            if arg.startswith("--format="):
                fmt = arg.split("=", 1)[1]
            elif arg == "--format" and i + 1 < len(rest):
                fmt = rest[i + 1]
        cluster = self.cluster_of(container.id)
        if cluster is None:
            return fail(_NO_CLUSTER, 1)
        if not cluster.dashboard:
            return fail(_NO_DASHBOARD, 1)
        now = time.monotonic()
        rows = []
        for node in sorted(cluster.nodes, key=lambda n: n.is_head):
            dead = node.dead(now, self.timing.heartbeat_timeout)
            resources: dict[str, object] = {}
            if node.is_head:
                resources["node:__internal_head__"] = 1.0
            resources.update(
                {
                    "CPU": node.cpus,
                    "memory": f"{node.memory_gib:.3f} GiB",
                    "GPU": node.gpus,
                    "object_store_memory": f"{node.object_store_gib:.3f} GiB",
                    f"node:{node.ip}": 1.0,
                }
            )
            rows.append(
                {
                    "node_id": node.node_id,
                    "node_ip": node.ip,
                    "is_head_node": node.is_head,
                    "state": "DEAD" if dead else "ALIVE",
                    "state_message": (
                        "Unexpected termination: health check failed due to missing too many "
                        "heartbeats"
                        if dead
                        else None
                    ),
                    "node_name": node.ip,
                    "resources_total": resources,
                    "labels": {"ray.io/node-id": node.node_id},
                    "start_time_ms": None,
                    "end_time_ms": None,
                }
            )
        if fmt == "json":
            return Done(stdout=json.dumps(rows, indent=1) + "\n")
        if fmt == "yaml":
            return fail("ray list: --format=yaml is not simulated", 2)
        out = [
            "======== List: ========",
            "Stats:",
            "------------------------------",
            f"Total: {len(rows)}",
            "",
            "Table:",
            "------------------------------",
            "    NODE_ID  NODE_IP  IS_HEAD_NODE  STATE",
        ]
        for i, row in enumerate(rows):
            out.append(
                f" {i}  {row['node_id']}  {row['node_ip']}  {row['is_head_node']}  {row['state']}"
            )
        return Done(stdout="\n".join(out) + "\n")

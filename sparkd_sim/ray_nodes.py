"""Ray's nodes as the simulated containers run them: `ray start --block` as a container's main
command, and node registration, hangs and death with the delays real Ray 2.60 shows (`Timing`)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkd_sim.engine import HostEngine
from sparkd_sim.state import Container, DeathKind, RayCluster, RayNode, new_node_id
from sparkd_sim.timing import Timing

NodeLost = Callable[[RayCluster, RayNode], None]


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


class RayNodes:
    """The simulated Ray clusters and their nodes: started, joined, hung and dead."""

    def __init__(self, timing: Timing, on_node_lost: NodeLost) -> None:
        self.timing = timing
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
            # Ray reads its config flags from `RAY_<name>`, a bool as `1` or `true`.
            autoscaler_v2=container.env.get("RAY_enable_autoscaler_v2", "").lower()
            in ("1", "true"),
            auth_token=head_token(container),
        )
        self.clusters.append(cluster)
        engine.add_process(
            container, f"/usr/local/bin/gcs_server --gcs_server_port={parsed.port}", cores=0.05
        )
        node = self._raylet(cluster, engine, container, parsed, node_ip, now)
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

    def _raylet(
        self,
        cluster: RayCluster,
        engine: HostEngine,
        container: Container,
        parsed: StartArgs,
        node_ip: str,
        launched: float,
    ) -> RayNode:
        """A raylet starts in `container` and registers with `cluster`: a new node."""
        head = parsed.head
        node = RayNode(
            node_id=new_node_id(),
            ip=node_ip,
            host=engine.state.name,
            container_id=container.id,
            is_head=head,
            gpus=parsed.num_gpus,
            launched=launched,
            listed_after=self.timing.head_listed if head else self.timing.worker_listed,
            counted_after=self.timing.head_counted if head else self.timing.worker_counted,
        )
        cluster.nodes.append(node)
        engine.add_process(
            container, "/usr/local/bin/raylet --node_ip_address=" + node_ip, cores=0.05
        )
        return node

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
        node = self._raylet(cluster, engine, container, parsed, node_ip, time.monotonic())
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


def head_token(container: Container) -> str | None:
    """The token a head started in `container` checks, with `RAY_AUTH_MODE=token` in its env:
    read from the file `RAY_AUTH_TOKEN_PATH` names (through the container's mounts), else a new
    one, as `ray start --head` makes for a new local cluster when it finds none (ray 2.60
    python/ray/_private/authentication/authentication_token_setup.py: `generate_and_save_token`).
    `RAY_AUTH_TOKEN` by value is also read, as Ray does (sparkd's config refuses it)."""
    if container.env.get("RAY_AUTH_MODE", "").lower() != "token":
        return None
    token = container.env.get("RAY_AUTH_TOKEN", "").strip()
    named = container.env.get("RAY_AUTH_TOKEN_PATH", "")
    for mount in container.mounts if named and not token else ():
        if named == mount.destination or named.startswith(mount.destination.rstrip("/") + "/"):
            source = Path(mount.source) / Path(named).relative_to(mount.destination)
            try:
                token = source.read_text().strip()
            except (OSError, UnicodeDecodeError):
                token = ""
            break
    return token or secrets.token_hex(16)

"""What a container's main command does in the world, and what follows when its processes
stop, freeze or die: Ray nodes lost, model engines hung with them, and freed again."""

from __future__ import annotations

import asyncio

from sparkd_sim.engine import ENTRYPOINT, HostEngine
from sparkd_sim.serve import ServeProcess
from sparkd_sim.state import Container, RayCluster, RayNode
from sparkd_sim.vllm_logs import crash_loop_log
from sparkd_sim.world_state import WorldState


class Consequences:
    """Container main commands and the hangs and deaths they cause in the model servers."""

    def __init__(self, state: WorldState) -> None:
        self.state = state
        # Head hosts whose model engine hangs because a Ray node it uses is frozen.
        self._engines_hung_by_ray: set[str] = set()
        # Head hosts whose model engine hangs in NCCL over a broken link: until it exits.
        self._engines_hung_by_link: set[str] = set()

    async def run_main(self, engine: HostEngine, container: Container) -> int:
        if container.crash_loop:
            await asyncio.sleep(self.state.timing.crash_loop_run)
            for line in crash_loop_log(container.processes[0].pid if container.processes else 1):
                container.log(line)
            return 1
        if container.command[:1] == ["ray"] and container.image_id in engine.state.rayless_ids:
            # The image's entrypoint (bash) `exec`s the command it is given, and finds no `ray`
            # (bash's words; tests/fixtures/docker-real/no-ray.jsonl has a shell's through an
            # entrypoint, exit 127 at once).
            container.log(f"{ENTRYPOINT}: line 67: exec: ray: not found")
            return 127
        if container.command[:2] == ["ray", "start"]:
            if self.state.real_ray is not None:
                return await self.state.real_ray.run(
                    container,
                    container.command[2:],
                    engine.state.ray_ip_override,
                    dict(container.env),
                )
            return await self.state.ray.run_start(engine, container, container.command[2:])
        # Any other image command idles until stopped (the stale GLM server, a shell...).
        await asyncio.Event().wait()
        return 0

    def container_exited(self, engine: HostEngine, container: Container) -> None:
        for serve in list(self.state.serves):
            if serve.container is container:
                serve.kill_hard()
        if self.state.real_ray is not None:
            self.state.real_ray.kill(container.id)

    def node_lost(self, cluster: RayCluster, node: RayNode) -> None:
        for serve in list(self.state.serves):
            if serve.cluster is cluster and any(
                c.id == node.container_id for _, c, _, _ in serve.workers
            ):
                self.unhang_engine(serve)
                serve.crash(f"Ray node {node.node_id[:8]} ({node.ip}) died")

    def freeze(self, container: Container) -> None:
        """The container's processes stop (SIGSTOP, a host that stops answering): its Ray nodes
        hang, and a model using them hangs with them until Ray declares them dead."""
        if self.state.real_ray is not None:
            # Real Ray finds out on its own; the model hangs until its driver sees the node die.
            self.state.real_ray.freeze(container.id)
            frozen = [container.id] if self.state.real_ray.frozen(container.id) else []
        else:
            frozen = [n.container_id for n in self.state.ray.freeze(container.id)]
        ids = set(frozen)
        for serve in self.state.serves:
            if any(c.id in ids for _, c, _, _ in serve.workers):
                host = next(h for h in self.state.hosts.values() if h.engine is serve.engine)
                if host.behaviour.engine == "ok":
                    host.behaviour.engine = "hung"
                    self._engines_hung_by_ray.add(host.name)

    def hang_across(self, host: str) -> None:
        """Every running model with a rank on `host` hangs (completions never finish)."""
        h = self.state.host(host)
        ids = set(h.state.containers)
        for serve in self.state.serves:
            if serve.engine is not h.engine and not any(
                c.id in ids for _, c, _, _ in serve.workers
            ):
                continue
            head = next(x for x in self.state.hosts.values() if x.engine is serve.engine)
            if head.behaviour.engine == "ok":
                head.behaviour.engine = "hung"
                self._engines_hung_by_link.add(head.name)

    def thaw(self, container: Container) -> None:
        if self.state.real_ray is not None:
            self.state.real_ray.thaw(container.id)
        self.state.ray.thaw(container.id)
        for serve in self.state.serves:
            if not any(self.frozen(c.id) for _, c, _, _ in serve.workers):
                self.unhang_engine(serve)

    def frozen(self, container_id: str) -> bool:
        if self.state.real_ray is not None:
            return self.state.real_ray.frozen(container_id)
        return self.state.ray.frozen(container_id)

    def unhang_engine(self, serve: ServeProcess) -> None:
        for host in self.state.hosts.values():
            if host.engine is serve.engine and host.name in self._engines_hung_by_ray:
                self._engines_hung_by_ray.discard(host.name)
                if host.behaviour.engine == "hung":
                    host.behaviour.engine = "ok"

    def serve_gone(self, serve: ServeProcess) -> None:
        """A model server's process ended: a broken link hung its NCCL, not the next launch's."""
        for host in self.state.hosts.values():
            if host.engine is serve.engine and host.name in self._engines_hung_by_link:
                self._engines_hung_by_link.discard(host.name)
                if host.behaviour.engine == "hung":
                    host.behaviour.engine = "ok"

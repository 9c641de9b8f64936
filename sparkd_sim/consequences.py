"""What a container's main command does in the world, and what follows when its processes
stop, freeze or die: Ray nodes lost, model engines hung with them, and freed again."""

from __future__ import annotations

import asyncio

from sparkd_sim.engine import ENTRYPOINT, HostEngine
from sparkd_sim.serve import ServeProcess
from sparkd_sim.state import Container, RayCluster, RayNode
from sparkd_sim.vllm_logs import crash_loop_log
from sparkd_sim.world_state import WorldState


class Consequences(WorldState):
    """Container main commands and the hangs and deaths they cause in the model servers."""

    async def _run_main(self, engine: HostEngine, container: Container) -> int:
        if container.crash_loop:
            await asyncio.sleep(self.timing.crash_loop_run)
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
            if self.real_ray is not None:
                return await self.real_ray.run(
                    container,
                    container.command[2:],
                    engine.state.ray_ip_override,
                    dict(container.env),
                )
            return await self.ray.run_start(engine, container, container.command[2:])
        # Any other image command idles until stopped (the stale GLM server, a shell...).
        await asyncio.Event().wait()
        return 0

    def _container_exited(self, engine: HostEngine, container: Container) -> None:
        for serve in list(self.serves):
            if serve.container is container:
                serve.kill_hard()
        if self.real_ray is not None:
            self.real_ray.kill(container.id)

    def _ray_container_at(self, ip: str) -> tuple[HostEngine, Container] | None:
        """The running Ray container whose node registered with `ip`."""
        for host in self.hosts.values():
            if ip not in (host.state.data_ip, host.state.ray_ip_override):
                continue
            for container in host.state.containers.values():
                if container.running and container.command[:2] == ["ray", "start"]:
                    return host.engine, container
        return None

    def _node_lost(self, cluster: RayCluster, node: RayNode) -> None:
        for serve in list(self.serves):
            if serve.cluster is cluster and any(
                c.id == node.container_id for _, c, _, _ in serve.workers
            ):
                self._unhang_engine(serve)
                serve.crash(f"Ray node {node.node_id[:8]} ({node.ip}) died")

    def _freeze(self, container: Container) -> None:
        """The container's processes stop (SIGSTOP, a host that stops answering): its Ray nodes
        hang, and a model using them hangs with them until Ray declares them dead."""
        if self.real_ray is not None:
            # Real Ray finds out on its own; the model hangs until its driver sees the node die.
            self.real_ray.freeze(container.id)
            frozen = [container.id] if self.real_ray.frozen(container.id) else []
        else:
            frozen = [n.container_id for n in self.ray.freeze(container.id)]
        ids = set(frozen)
        for serve in self.serves:
            if any(c.id in ids for _, c, _, _ in serve.workers):
                host = next(h for h in self.hosts.values() if h.engine is serve.engine)
                if host.behaviour.engine == "ok":
                    host.behaviour.engine = "hung"
                    self._engines_hung_by_ray.add(host.name)

    def _hang_across(self, host: str) -> None:
        """Every running model with a rank on `host` hangs (completions never finish)."""
        h = self.host(host)
        ids = set(h.state.containers)
        for serve in self.serves:
            if serve.engine is not h.engine and not any(
                c.id in ids for _, c, _, _ in serve.workers
            ):
                continue
            head = next(x for x in self.hosts.values() if x.engine is serve.engine)
            if head.behaviour.engine == "ok":
                head.behaviour.engine = "hung"
                self._engines_hung_by_link.add(head.name)

    def _thaw(self, container: Container) -> None:
        if self.real_ray is not None:
            self.real_ray.thaw(container.id)
        self.ray.thaw(container.id)
        for serve in self.serves:
            if not any(self._frozen(c.id) for _, c, _, _ in serve.workers):
                self._unhang_engine(serve)

    def _frozen(self, container_id: str) -> bool:
        if self.real_ray is not None:
            return self.real_ray.frozen(container_id)
        return self.ray.frozen(container_id)

    def _unhang_engine(self, serve: ServeProcess) -> None:
        for host in self.hosts.values():
            if host.engine is serve.engine and host.name in self._engines_hung_by_ray:
                self._engines_hung_by_ray.discard(host.name)
                if host.behaviour.engine == "hung":
                    host.behaviour.engine = "ok"

"""The scenarios a world starts in: the seeds' stale GLM server and units, or, for `healthy`,
what sparkd converges to (Ray on every host, the model serving)."""

from __future__ import annotations

import asyncio
import shlex
import time
from pathlib import Path

from sparkd_sim import contract
from sparkd_sim.docker_images import image_id
from sparkd_sim.engine import graphics_processes, normalize_image
from sparkd_sim.hosts import SimHost
from sparkd_sim.reference import GLM_IMAGE, INTERFACE, MODEL_ID, QWEN_IMAGE, STALE_UNITS
from sparkd_sim.state import Container, Mount, RestartPolicy, Unit, new_container_id
from sparkd_sim.world_state import WorldState

# The `hand-made` scenario's containers: the operator's own names, not sparkd's.


class Scenarios:
    """Each scenario's hosts, containers and model."""

    def __init__(self, state: WorldState) -> None:
        self.state = state
        # The model launches the `healthy` and hand-made scenarios started, until `brought_up`.
        self.launches: list[asyncio.Future[None]] = []

    def apply(self) -> None:
        for host in self.state.hosts.values():
            state = host.state
            state.gpu_processes = graphics_processes()
            if self.state.scenario == "empty":
                continue
            state.images = {normalize_image(QWEN_IMAGE), normalize_image(GLM_IMAGE)}
            if self.state.scenario not in ("seed-morning", "seed-crashloop"):
                continue
            if state.role == "head":
                for unit in STALE_UNITS:
                    state.units[unit] = Unit(unit, enabled=True, active=True)
            glm = Container(
                id=new_container_id(),
                name="glm-flash",
                image=GLM_IMAGE,
                command=["bash", "-c", "vllm serve /models/GLM-4.7-Flash --port 30000"],
                labels={"com.docker.compose.project": "glm"},
                env={},
                mounts=[Mount("/models", "/models")],
                restart="always",
                created_wall=time.time() - 9 * 86400,
                # `seed-crashloop`: since the reboot its server dies at start-up, and docker
                # keeps restarting it with a growing backoff.
                crash_loop=self.state.scenario == "seed-crashloop",
                image_id=image_id(state, GLM_IMAGE),
            )
            state.containers[glm.id] = glm
            host.engine.start(glm)
            # It came back with the reboot a couple of minutes ago ("Up 2 minutes").
            state.booted_wall = time.time() - 150
            glm.started_wall = time.time() - 120

    async def bring_up_healthy(self) -> None:
        """What sparkd converges to: Ray on every host of each cluster, the model serving."""
        for cluster in sorted({h.cluster for h in self.state.hosts.values()}):
            members = [h for h in self.state.hosts.values() if h.cluster == cluster]
            head = members[0]
            labels = {contract.LABEL_CLUSTER: cluster}
            env = {
                "NCCL_SOCKET_IFNAME": INTERFACE,
                "GLOO_SOCKET_IFNAME": INTERFACE,
                "RAY_memory_monitor_refresh_ms": "0",
            }
            head_ip = head.state.data_ip
            head_start = ["ray", "start", "--block", "--head", f"--node-ip-address={head_ip}"]
            self.create(
                head,
                contract.container_name(cluster, "head"),
                {
                    **labels,
                    contract.LABEL_ROLE: "head",
                    contract.LABEL_SPEC: self._spec(cluster, "head", head.name),
                },
                {**env, "VLLM_HOST_IP": head_ip},
                [*head_start, "--port=6379", "--dashboard-host=0.0.0.0"],
            )
            for worker in members[1:]:
                worker_start = ["ray", "start", "--block", f"--address={head_ip}:6379"]
                self.create(
                    worker,
                    contract.container_name(cluster, "worker"),
                    {
                        **labels,
                        contract.LABEL_ROLE: "worker",
                        contract.LABEL_SPEC: self._spec(cluster, "worker", worker.name),
                    },
                    {**env, "VLLM_HOST_IP": worker.state.data_ip},
                    [*worker_start, f"--node-ip-address={worker.state.data_ip}"],
                )
            self.launches.append(self.state.spawn(self._launch_model(head, cluster, len(members))))

    async def ray_ready(self, head: SimHost, gpus: int) -> None:
        while True:
            ray = next(
                (c for c in self.state.ray.clusters if c.alive and c.ip == head.state.data_ip), None
            )
            if ray is not None and ray.total_gpus(time.monotonic(), self.state.timing) >= gpus:
                return
            await asyncio.sleep(self.state.timing.join_retry / 8)

    async def brought_up(self) -> None:
        """Returns once the `healthy` scenario has launched every cluster's model (it then
        loads): from here on a daemon finds nothing to start."""
        await asyncio.gather(*self.launches)

    def _spec(self, cluster: str, role: str, host: str | None = None) -> str:
        key = contract.host_spec_key(cluster, host) if host is not None else None
        by_host = self.state.spec_labels.get(key) if key is not None else None
        return by_host or self.state.spec_labels.get(
            contract.spec_key(cluster, role), "sim-healthy"
        )

    async def _launch_model(self, head: SimHost, cluster: str, gpus: int) -> None:
        """Start `vllm serve` the way sparkd does, once Ray has every host's GPU."""
        await self.ray_ready(head, gpus)
        log = f"{head.state.log_dir}/serve.log"
        spec_file = Path(head.state.log_dir) / "serve.spec"
        spec_file.write_text(self._spec(cluster, "model") + "\n")
        self.state.give_to_session_user(spec_file)
        inner = (
            f"exec vllm serve {MODEL_ID} --port 30000 --tensor-parallel-size {gpus} "
            "--pipeline-parallel-size 1 --reasoning-parser qwen3 --tool-call-parser qwen3_coder "
            f"--enable-auto-tool-choice >>{log} 2>&1"
        )
        command = f"docker exec -d sparkd-{cluster}-ray-head sh -c {shlex.quote(inner)}"
        rc, _, err = await head.ssh.run_local(command)
        if rc != 0:
            raise RuntimeError(f"could not launch the model on {head.name}: {err.strip()}")

    def create(
        self,
        host: SimHost,
        name: str,
        labels: dict[str, str],
        env: dict[str, str],
        command: list[str],
        restart: RestartPolicy = "no",
    ) -> Container:
        # The compile cache's directory (`model.cache_dir`'s default), as sparkd's start_ray
        # makes it beside the container it starts.
        cache = Path(host.state.log_dir) / "cache"
        cache.mkdir(mode=0o700, exist_ok=True)
        self.state.give_to_session_user(cache)
        container = Container(
            id=new_container_id(),
            name=name,
            image=QWEN_IMAGE,
            command=command,
            labels=labels,
            env=env,
            mounts=[
                Mount(str(self.state.models_dir), "/models"),
                Mount(host.state.log_dir, host.state.log_dir),
            ],
            restart=restart,
            shm_size="16g",
            gpus="all",
            image_id=image_id(host.state, QWEN_IMAGE),
        )
        host.state.containers[container.id] = container
        host.engine.start(container)
        return container

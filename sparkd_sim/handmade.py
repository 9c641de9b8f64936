"""The `handmade` scenario: the deployment as its operator runs it before sparkd, by a script.

Ray head and worker containers of the operator's own naming (no sparkd labels), started on
the data IPs with the environment the world's config names, and `vllm serve` started in the
head container with `docker exec -d` (no log file, no PID file, no spec hash: nothing of
sparkd's). The world's config describes it exactly, so sparkd's first look adopts it.
"""

from __future__ import annotations

import asyncio
import shlex
import time

from sparkd_sim.hosts import SimHost
from sparkd_sim.reference import INTERFACE, MODEL_ID
from sparkd_sim.scenarios import Scenarios

# The operator's own names for the containers (a script's `docker run --name`).
HEAD_BOX = "vllm-ray-head"
WORKER_BOX = "vllm-ray-worker"


def serve_argv(gpus: int) -> list[str]:
    """The operator's `vllm serve`: the world's config's arguments, in their own order."""
    return [
        "vllm", "serve", MODEL_ID,
        "--tensor-parallel-size", str(gpus),
        "--port", "30000",
        "--reasoning-parser", "qwen3",
        "--tool-call-parser", "qwen3_coder",
        "--enable-auto-tool-choice",
        "--distributed-executor-backend", "ray",
    ]  # fmt: skip


async def bring_up(world: Scenarios) -> None:
    """Every cluster's hand-made Ray and `vllm serve` (which then loads)."""
    for cluster in sorted({h.cluster for h in world.hosts.values()}):
        members = [h for h in world.hosts.values() if h.cluster == cluster]
        head = members[0]
        env = {
            "NCCL_SOCKET_IFNAME": INTERFACE,
            "GLOO_SOCKET_IFNAME": INTERFACE,
            "RAY_memory_monitor_refresh_ms": "0",
        }
        head_ip = head.state.data_ip
        port = world.ray_port
        world._create(
            head,
            HEAD_BOX,
            {},
            {**env, "VLLM_HOST_IP": head_ip},
            ["ray", "start", "--block", "--head", f"--node-ip-address={head_ip}", f"--port={port}"],
        )
        for worker in members[1:]:
            ip = worker.state.data_ip
            world._create(
                worker,
                WORKER_BOX,
                {},
                {**env, "VLLM_HOST_IP": ip},
                [
                    "ray",
                    "start",
                    "--block",
                    f"--address={head_ip}:{port}",
                    f"--node-ip-address={ip}",
                ],
            )
        world._launches.append(world._spawn(_launch(world, head, len(members))))


async def _launch(world: Scenarios, head: SimHost, gpus: int) -> None:
    """`docker exec -d HEAD vllm serve ...`, once Ray has every host's GPU."""
    while True:
        ray = next((c for c in world.ray.clusters if c.alive and c.ip == head.state.data_ip), None)
        if ray is not None and ray.total_gpus(time.monotonic(), world.timing) >= gpus:
            break
        await asyncio.sleep(world.timing.join_retry / 8)
    command = shlex.join(["docker", "exec", "-d", HEAD_BOX, *serve_argv(gpus)])
    rc, _, err = await head.ssh.run_local(command)
    if rc != 0:
        raise RuntimeError(f"could not launch the model on {head.name}: {err.strip()}")

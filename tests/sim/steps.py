"""The manual procedure's steps as shell commands, shared by the scenario tests."""

from __future__ import annotations

import shlex

import asyncssh

from sparkd_sim.reference import MODEL_ID, QWEN_IMAGE, STALE_UNITS
from sparkd_sim.world import World
from tests.sim.conftest import Result, eventually, run

HEAD = "sparkd-sparks-ray-head"
WORKER = "sparkd-sparks-ray-worker"


def ray_head_command(world: World, extra: str = "--dashboard-host=0.0.0.0") -> str:
    head = world.hosts["spark-a"].state
    return (
        f"timeout -k 2 30 docker run -d --name {HEAD} --label sparkd.cluster=sparks "
        "--label sparkd.role=head --label sparkd.spec=5e2c9a1f "
        "-e NCCL_SOCKET_IFNAME=enp1s0f0np0 -e GLOO_SOCKET_IFNAME=enp1s0f0np0 "
        f"-e RAY_memory_monitor_refresh_ms=0 -v /models:/models -v {head.log_dir}:{head.log_dir} "
        "--network host --gpus all --shm-size 16g --restart=no --pull=never "
        f"{QWEN_IMAGE} ray start --block --head --node-ip-address={head.data_ip} "
        f"--port=6379 {extra}"
    )


def ray_worker_command(world: World) -> str:
    head, worker = world.hosts["spark-a"].state, world.hosts["spark-b"].state
    return (
        f"timeout -k 2 30 docker run -d --name {WORKER} --label sparkd.cluster=sparks "
        "--label sparkd.role=worker -e NCCL_SOCKET_IFNAME=enp1s0f0np0 -v /models:/models "
        "--network host --gpus all --shm-size 16g --restart=no --pull=never "
        f"{QWEN_IMAGE} ray start --block --address={head.data_ip}:6379 "
        f"--node-ip-address={worker.data_ip}"
    )


def serve_command(world: World, tp: int = 2, extra: str = "") -> str:
    log_dir = world.hosts["spark-a"].state.log_dir
    inner = (
        f"exec vllm serve {MODEL_ID} --port 30000 --tensor-parallel-size {tp} "
        "--pipeline-parallel-size 1 --reasoning-parser qwen3 --tool-call-parser qwen3_coder "
        f"--enable-auto-tool-choice {extra}>>{log_dir}/serve.log 2>&1"
    )
    return f"timeout -k 2 30 docker exec -d {HEAD} sh -c {shlex.quote(inner)}"


async def clean_up(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    units = " ".join(STALE_UNITS)
    result = await run(head, f"systemctl stop {units} && systemctl disable {units}")
    assert result.exit_status == 0, result.stderr
    for conn in (head, worker):
        assert (await run(conn, "docker rm -f glm-flash")).exit_status == 0


async def ray_status(head: asyncssh.SSHClientConnection) -> Result:
    return await run(head, f"timeout -k 2 10 docker exec {HEAD} ray status")


async def start_ray(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    assert (await run(head, ray_head_command(world))).exit_status == 0
    assert (await run(worker, ray_worker_command(world))).exit_status == 0

    async def two_gpus() -> bool:
        return " 0.0/2.0 GPU" in (await ray_status(head)).stdout

    await eventually(two_gpus)

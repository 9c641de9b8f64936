"""A simulated model load as real vLLM shows it: CPU time in `docker top` rising through every
stage (silent ones too) and not during a stall, stalls quiet or chatty, harmless error-like
warnings, and a fatal start-up failure."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest

from sparkd.core.reading import parsers
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.sim.steps import (
    HEAD,
    WORKER,
    clean_up,
    ray_head_command,
    ray_status,
    ray_worker_command,
    serve_command,
    start_ray,
)
from tests.support.sim import REAL_LINES, connect, eventually, run

TOP = f"docker top {HEAD} -eo pid,etimes,times,time,args"


@pytest.fixture
async def slow_world(tmp_path: Path) -> AsyncIterator[World]:
    """Loads long enough to watch each stage (weights ~1.5 s, compile and capture ~1 s each)."""
    timing = dataclasses.replace(Timing.fast(), model_load=1.5, graph_capture=2.0)
    async with World(tmp_path / "world", scenario="seed-morning", timing=timing) as w:
        yield w


async def cpu(head: asyncssh.SSHClientConnection) -> dict[str, int]:
    """CPU seconds (`times`) of the serve and engine processes, checked against `time`."""
    top = await run(head, TOP)
    header, *rows = top.stdout.splitlines()
    assert header.split() == ["PID", "ELAPSED", "TIME", "TIME", "COMMAND"]
    found = {}
    for row in rows:
        _, _, times, clock, args = row.split(maxsplit=4)
        assert re.fullmatch(r"(\d+-)?\d\d:\d\d:\d\d", clock)
        days, _, hms = clock.rpartition("-")
        h, m, s = (int(x) for x in hms.split(":"))
        assert int(days or 0) * 86400 + h * 3600 + m * 60 + s == int(times)
        if "vllm serve" in args:
            found["serve"] = int(times)
        elif args == "VLLM::EngineCore":
            found["engine"] = int(times)
    return found


def load_log(world: World) -> str:
    path = Path(world.hosts["spark-a"].state.log_dir, "serve.log")
    return path.read_text() if path.exists() else ""


def log_mtime(world: World) -> float:
    return Path(world.hosts["spark-a"].state.log_dir, "serve.log").stat().st_mtime


async def launch(world: World, head: asyncssh.SSHClientConnection, extra: str = "") -> None:
    async with await connect(world, "spark-b") as worker:
        await clean_up(world, head, worker)
        await start_ray(world, head, worker)
    assert (await run(head, serve_command(world, extra=extra))).exit_status == 0


async def stage(world: World) -> str:
    return next((s.phase for s in world.serves), "none")


async def launch_until(
    world: World,
    head: asyncssh.SSHClientConnection,
    logged: str,
    running: bool = False,
    fault: str | None = None,
) -> None:
    """Launch the model (after the head's `fault`, when given), then wait until its load log
    shows `logged` (and, with `running`, the serve has reached its running stage)."""
    if fault is not None:
        await world.fault(fault, "spark-a")
    await launch(world, head)

    async def there() -> bool:
        if running and await stage(world) != "running":
            return False
        return logged in load_log(world)

    await eventually(there)


async def test_cpu_time_rises_in_every_load_stage_and_idles_when_serving(
    slow_world: World,
) -> None:
    async with await connect(slow_world, "spark-a") as head:
        await launch(slow_world, head)
        seen: dict[str, list[int]] = {}
        while (phase := await stage(slow_world)) != "running":
            if phase in ("loading", "compile", "capture"):
                sample = await cpu(head)
                if "engine" in sample:
                    seen.setdefault(phase, []).append(sample["engine"])
            await asyncio.sleep(0.05)
        for phase in ("loading", "compile", "capture"):
            samples = seen.get(phase, [])
            assert len(samples) >= 2 and samples[-1] > samples[0], (phase, samples)
        # torch.compile is a silent stage: no new log line while CPU time rises.
        log = load_log(slow_world)
        assert "torch.compile" in log and "Dynamo bytecode transform time" in log
        before = await cpu(head)
        await asyncio.sleep(1.0)
        after = await cpu(head)
        # Idle: about 0.02 CPUs, scaled like the rest of the world's time.
        assert after["engine"] - before["engine"] <= 2
        assert after["serve"] - before["serve"] <= 2


async def test_stalled_load_accrues_no_cpu_and_writes_nothing(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    await launch_until(world, head, "Completed | 15/39", fault="stall-load")
    await asyncio.sleep(0.1)
    before, size = await cpu(head), len(load_log(world))
    await asyncio.sleep(1.0)
    assert await cpu(head) == before
    assert len(load_log(world)) == size


async def test_chatty_stall_keeps_writing_without_progress(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    await launch_until(world, head, "41% Completed", fault="chatty-stall")
    await asyncio.sleep(0.1)
    before, mtime = await cpu(head), log_mtime(world)
    await asyncio.sleep(world.timing.stall_chatter * 2.5)
    text = load_log(world)
    assert log_mtime(world) > mtime
    assert text.count("No available shared memory broadcast block found") >= 2
    last_progress = [line for line in text.splitlines() if "% Completed" in line][-1]
    assert "41% Completed" in last_progress
    assert await cpu(head) == before
    assert any(s.phase == "loading" for s in world.serves)


async def test_noisy_load_prints_harmless_error_like_lines_and_still_loads(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    # The serve's output reaches serve.log through the shell's redirection after the process
    # itself runs: wait for its last start-up line in the file, then read what came before it.
    await launch_until(
        world, head, "Application startup complete.", running=True, fault="noisy-load"
    )
    log = load_log(world)
    assert "OSError: [Errno 24] Too many open files" in log
    assert "Error: No available node types can fulfill resource request {'GPU': 1.0}" in log
    assert "RuntimeError: NVML_ERROR_NOT_SUPPORTED" in log
    assert "Application startup complete." in log


@pytest.fixture
async def data_world(tmp_path: Path) -> AsyncIterator[World]:
    async with World(
        tmp_path / "world", scenario="seed-morning", timing=Timing.fast(), data_network=True
    ) as w:
        yield w


@pytest.mark.parametrize(
    ("host_ip", "older_executor"), [(False, True), (True, True), (False, False)]
)
async def test_vllm_host_ip_decides_placement_on_a_separate_data_network(
    data_world: World, host_ip: bool, older_executor: bool
) -> None:
    """Only vLLM 0.32.0's older Ray executor (`VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0`) pins its
    placement group to `node:<VLLM_HOST_IP or the host's own IP>` (`ray_utils.py` 632-643):
    with the management network's IP, which no Ray node has, it never places. The default
    `RayExecutorV2` places by Ray's own node IPs, whatever VLLM_HOST_IP says."""
    world = data_world
    head_state, worker_state = world.hosts["spark-a"].state, world.hosts["spark-b"].state
    assert head_state.data_ip != head_state.address
    async with (
        await connect(world, "spark-a") as head,
        await connect(world, "spark-b") as worker,
    ):
        route = await run(head, "ip route")
        assert (
            route.stdout.startswith("default via ")
            and f"src {head_state.address}" in (route.stdout.splitlines()[0])
        )
        await clean_up(world, head, worker)
        head_run, worker_run = ray_head_command(world), ray_worker_command(world)
        if host_ip:
            head_run = head_run.replace(
                "docker run -d", f"docker run -d -e VLLM_HOST_IP={head_state.data_ip}"
            )
            worker_run = worker_run.replace(
                "docker run -d", f"docker run -d -e VLLM_HOST_IP={worker_state.data_ip}"
            )
        if older_executor:
            head_run = head_run.replace(
                "docker run -d", "docker run -d -e VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0"
            )
        assert (await run(head, head_run)).exit_status == 0
        assert (await run(worker, worker_run)).exit_status == 0

        async def two_gpus() -> bool:
            return " 0.0/2.0 GPU" in (await ray_status(head)).stdout

        await eventually(two_gpus)
        assert (await run(head, serve_command(world))).exit_status == 0
        if host_ip or not older_executor:

            async def serving() -> bool:
                return await stage(world) == "running"

            await eventually(serving)
            return
        await asyncio.sleep(world.timing.pg_wait_first * 3.5)
        assert [s.phase for s in world.serves] == ["init"]
        log = load_log(world)
        assert "Loading safetensors" not in log
        waits = [line for line in log.splitlines() if "Waiting for creating a placement" in line]
        assert 1 <= len(waits) <= 2
        assert f"'node:{head_state.address}': 0.001" in waits[0] and "VLLM_HOST_IP" in waits[0]


async def test_the_simulated_load_prints_the_real_servers_lines(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    await launch_until(world, head, "Application startup complete.", running=True)
    lines = parsers.log_lines(load_log(world))
    for pattern in REAL_LINES:
        assert any(re.search(pattern, line) for line in lines), pattern


async def test_a_node_ray_still_counts_after_its_container_died_takes_no_worker(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    """Ray counts a killed raylet's GPU until it declares the node dead (23 to 25 s in
    tests/fixtures/ray-real): a placement group asked for meanwhile waits, as real vLLM's
    does, instead of a worker appearing in the dead container, and its bundle goes to the
    node that replaces it."""
    spark_b = world.hosts["spark-b"].state
    await clean_up(world, head, worker)
    await start_ray(world, head, worker)
    await world.fault("kill-container", "spark-b", WORKER)
    dead = spark_b.container(WORKER)
    assert dead is not None and not dead.running
    assert (await run(head, serve_command(world))).exit_status == 0
    await asyncio.sleep(world.timing.pg_wait_first * 1.5)
    assert await stage(world) == "init"
    assert [g for g in spark_b.gpu_processes if g.container_id == dead.id] == []
    assert "Waiting for creating a placement group" in load_log(world)

    assert (await run(worker, f"docker rm -f {WORKER}")).exit_status == 0
    assert (await run(worker, ray_worker_command(world))).exit_status == 0

    async def serving() -> bool:
        return await stage(world) == "running"

    await eventually(serving)
    live = spark_b.container(WORKER)
    assert live is not None and live.running and live.id != dead.id
    workers = [g for g in spark_b.gpu_processes if g.name == "ray::RayWorkerProc.run"]
    assert [g.container_id for g in workers] == [live.id]

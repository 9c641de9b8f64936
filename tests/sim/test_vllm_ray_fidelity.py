"""The simulated Ray-executor load as real vLLM 0.32/0.34 shows it: the workers' real titles in
`docker top` (tests/fixtures/vllm-ray-titles), each loader's own progress line
(tests/fixtures/vllm-loaders), and sparkd reading both."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
from pathlib import Path

import aiohttp
import asyncssh
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import ENGINE_MARKERS
from sparkd_sim import real_ray
from sparkd_sim.state import Container
from sparkd_sim.timing import Timing
from sparkd_sim.vllm_logs import placement_timeout
from sparkd_sim.vllm_server import ModelBehaviour, SimVllmServer
from sparkd_sim.world import World
from tests.sim.steps import HEAD
from tests.sim.test_load_real import launch, load_log, stage
from tests.support.sim import eventually, run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TOP = f"docker top {HEAD} -eo pid,etimes,times,args"


def _shape(line: str) -> str:
    """A line with its numbers, times and PIDs made wildcards: what a capture and the
    simulator must share."""
    return re.sub(r"\d+(\.\d+)?", "N", line)


def _titles(sample: str) -> set[str]:
    rows = parsers.parse_docker_top((FIXTURES / "vllm-ray-titles" / sample).read_text())
    return {r.args for r in rows if any(m in r.args for m in ENGINE_MARKERS)}


def _raw_log(world: World) -> str:
    """The serve log as its bytes are: read_text() would turn tqdm's `\r` into a line break."""
    return Path(world.hosts["spark-a"].state.log_dir, "serve.log").read_bytes().decode()


async def _engine_titles(head: asyncssh.SSHClientConnection) -> set[str]:
    rows = parsers.parse_docker_top((await run(head, TOP)).stdout)
    return {r.args for r in rows if any(m in r.args for m in ENGINE_MARKERS)}


# Weights ~1.5 s: long enough for a `docker top` over SSH to land inside the stage.
SLOW_LOAD = pytest.mark.parametrize(
    "timing", [dataclasses.replace(Timing.fast(), model_load=1.5)], ids=["slow-load"]
)


@SLOW_LOAD
async def test_workers_carry_the_real_titles_loading_and_after(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    await launch(world, head)

    async def loading() -> bool:
        return await stage(world) == "loading"

    await eventually(loading)
    assert await _engine_titles(head) == _titles("docker-top-loading.txt")

    async def compiling() -> bool:
        return await stage(world) in ("compile", "capture", "running")

    await eventually(compiling)
    assert await _engine_titles(head) == _titles("docker-top-compile.txt")


async def test_the_default_bar_arrives_with_rays_prefix(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    await launch(world, head)

    async def loaded() -> bool:
        return "100% Completed" in load_log(world)

    await eventually(loaded)
    raw = [ln for ln in _raw_log(world).split("\n") if "% Completed" in ln]
    # The real prefix, `(RayWorkerProc pid=N)`, then tqdm's carriage return.
    real = (FIXTURES / "vllm-ray-titles" / "log-prefix.txt").read_text()
    prefix = _shape(real.split(")")[0] + ")")
    assert raw and all(_shape(ln.split(" \r")[0]) == prefix for ln in raw)
    assert all(" \rLoading safetensors checkpoint shards: " in ln for ln in raw)


@pytest.mark.parametrize(
    ("extra", "index"),
    [
        ("", 0),
        ("--safetensors-load-strategy eager ", 1),
        ("--load-format fastsafetensors ", 2),
        ("--model-loader-extra-config '{\"enable_multithread_load\": true}' ", 3),
        ("--load-format instanttensor ", 4),
        ("--load-format runai_streamer ", 5),
    ],
)
async def test_each_loader_prints_its_own_line_and_sparkd_reads_it(
    world: World, head: asyncssh.SSHClientConnection, extra: str, index: int
) -> None:
    real = (FIXTURES / "vllm-loaders" / "progress-lines.txt").read_text().splitlines()[index]
    await launch(world, head, extra=extra)

    async def loaded() -> bool:
        return "100% Completed" in load_log(world)

    await eventually(loaded)
    lines = [ln for ln in parsers.log_lines(load_log(world)) if "% Completed" in ln]
    desc = real.split(":")[0]
    assert lines and all(ln.split(":")[0] == desc for ln in lines)
    # A two-digit percentage, as the fixture's: tqdm pads the percentage to three places.
    middle = next(ln for ln in lines if re.search(r":  [1-9][0-9]% ", ln))
    assert _shape(middle).split("[")[0] == _shape(real).split("[")[0]
    progress = parsers.parse_load_progress(lines, None)
    assert (progress.stage, progress.percent) == ("weights", 100.0)


async def test_a_loader_without_a_bar_loads_in_silence(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    await launch(world, head, extra="--load-format sharded_state ")

    # The output reaches serve.log through the shell's redirection: wait for the line after
    # the weights in the file itself.
    async def loaded() -> bool:
        return "Loading weights took" in load_log(world)

    await eventually(loaded)
    assert "% Completed" not in load_log(world)


async def test_without_log_stats_the_metrics_are_the_real_servers_other_families() -> None:
    """`--disable-log-stats`: no `vllm:` family; what is left is among the real server's own
    (tests/fixtures/vllm-log-stats)."""
    real = (FIXTURES / "vllm-log-stats" / "metrics-disable-log-stats.txt").read_text()
    theirs = {f.name for f in text_string_to_metric_families(real)}
    server = SimVllmServer("tiny-qwen3", ModelBehaviour(), log_stats=False)
    port = await server.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as reply,
        ):
            ours = {f.name for f in text_string_to_metric_families(await reply.text())}
    finally:
        await server.stop()
    assert ours and not any(name.startswith("vllm:") for name in ours)
    assert ours <= theirs, ours - theirs


async def test_a_placement_group_never_ready_ends_with_vllms_own_error() -> None:
    """The real-Ray world's helper gives up on the group with the specs it asked for; the
    simulated serve then prints what vLLM 0.32.0's `_wait_until_pg_ready` raises (ray_utils.py
    478-505), from the one copy of that text, and the warnings it printed while waiting."""
    specs = [{"GPU": 1.0}, {"GPU": 1.0}]
    # What the helper prints (sparkd_sim/bin/ray-placement), from a stand-in for it.
    out = [real_ray.WARNING + "short of GPUs", real_ray.TIMEOUT + json.dumps(specs)]
    script = "printf '%s\\n' " + " ".join(shlex.quote(line) for line in out) + "; exit 1"

    class Stub:
        def __init__(self) -> None:
            self._processes: set[object] = set()

        def _enter(self, container_id: str) -> list[str]:
            return ["sh", "-c", script, "stand-in"]

        def _env(self, extra: dict[str, str]) -> dict[str, str]:
            return {"PATH": os.environ["PATH"]}

        def _end(self, process: object) -> None:
            self._processes.discard(process)

    warned: list[str] = []
    head = Container(
        id="c0", name="head", image="img", command=[], labels={}, env={}, mounts=[], restart="no"
    )
    said = await real_ray.RealPlacement(Stub(), head).acquire(2, warned.append)  # type: ignore[arg-type]
    assert warned == ["short of GPUs"]
    assert said == placement_timeout(specs)
    assert isinstance(said, list) and said[0].startswith(
        "ValueError: Cannot provide a placement group requiring 2.0 GPUs "
        "(placement_group_specs=[{'GPU': 1.0}, {'GPU': 1.0}]) within 1800 seconds."
    )

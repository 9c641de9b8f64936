"""The simulator held to what real vLLM 0.32.0's Ray executor printed on a real two-node Ray
2.60 cluster (tests/fixtures/vllm-ray-executor, taken by the real-executor tier,
tests/realexec): the actors' process titles and the engine core's placement-group line."""

from __future__ import annotations

import re
from pathlib import Path

import asyncssh

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import ENGINE_MARKERS
from sparkd_sim.world import World
from tests.sim.steps import (
    HEAD,
    clean_up,
    ray_head_command,
    ray_worker_command,
    serve_command,
)
from tests.sim.test_load_real import launch, load_log, stage
from tests.support.sim import eventually, run

CAPTURE = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-ray-executor"
TOP = f"docker top {HEAD} -eo pid,etimes,times,args"
# What vLLM and Ray title their processes: `VLLM::<name>` (vLLM `set_process_title`) and
# `ray::<class>[.<method>]` for an actor (Ray `_changeproctitle`); Ray's own daemons
# (`ray::IDLE`, `ray::DashboardAgent`, ...) are titled the same way.
_TITLED = ("VLLM::", "ray::")


def shape(line: str) -> str:
    """A line with its numbers (PIDs, times, line numbers) made wildcards."""
    return re.sub(r"\d+(\.\d+)?", "N", line)


def captured_titles() -> set[tuple[str, str]]:
    """(node, title) of every vLLM or Ray process the real run showed."""
    rows = (CAPTURE / "titles.txt").read_text().splitlines()
    return {(node, title) for node, _, title in (r.partition("\t") for r in rows if r)}


def captured_ps(node: str) -> list[str]:
    """The args of each process in `ps -eo pid,args` of a node (its header dropped)."""
    lines = (CAPTURE / f"ps-{node}.txt").read_text().splitlines()[1:]
    return [line.split(None, 1)[1] for line in lines if line.strip()]


# Ray's own processes on a node: its idle workers and its agents (ray 2.60), not vLLM's.
RAYS_OWN = {"ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent"}


def all_titles() -> set[str]:
    found = {t for _, t in captured_titles()}
    for node in ("head", "worker1"):
        found |= {a for a in captured_ps(node) if a.startswith(_TITLED)}
    return found


def actor_classes() -> set[str]:
    """The vLLM actor classes the real run showed: `ray::[<name>:]<class>[.<method>]`."""
    actors = {t[len("ray::") :] for t in all_titles() if t.startswith("ray::")} - {
        t[len("ray::") :] for t in RAYS_OWN
    }
    return {t.rpartition(":")[2].split(".")[0] for t in actors}


def test_sparkd_counts_the_real_engine_and_actor_titles_and_not_rays_own() -> None:
    titles = all_titles()
    assert titles >= RAYS_OWN
    engine = titles - RAYS_OWN
    assert {"VLLM::EngineCore", "ray::RayWorkerProc", "ray::RayWorkerProc.run"} <= engine
    assert all(any(m in t for m in ENGINE_MARKERS) for t in engine), engine
    assert not any(any(m in t for m in ENGINE_MARKERS) for t in RAYS_OWN)


async def test_the_simulated_titles_have_the_real_ones_shape(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    classes = actor_classes()
    assert classes == {"RayWorkerProc"}
    await launch(world, head)

    async def running() -> bool:
        return await stage(world) == "running"

    await eventually(running)
    rows = parsers.parse_docker_top((await run(head, TOP)).stdout)
    simulated = {r.args for r in rows if r.args.startswith(_TITLED)}
    actors = {t for t in simulated if t.startswith("ray::")}
    assert actors, simulated
    # An actor between methods is `ray::<class>`, in one `ray::<class>.<method>`.
    assert all(re.fullmatch(r"ray::(\w+)(\.\w+)?", t) for t in actors), actors
    assert {re.sub(r"\.\w+$", "", t)[len("ray::") :] for t in actors} <= classes
    # The engine core's title, exactly as captured.
    assert "VLLM::EngineCore" in simulated
    assert ("head", "VLLM::EngineCore") in captured_titles()


async def test_the_engine_core_logs_the_placement_as_the_real_one_does(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    real = [
        ln
        for ln in (CAPTURE / "serve.log").read_text().splitlines()
        if "No current placement group found" in ln
    ]
    assert len(real) == 1
    await launch(world, head)

    async def running() -> bool:
        return await stage(world) == "running"

    await eventually(running)
    lines = [ln for ln in load_log(world).splitlines() if "placement group" in ln]
    assert [shape(ln) for ln in lines] == [shape(real[0])]


def test_sparkd_reads_the_real_ray_prefixed_load() -> None:
    """Ray colours its prefix (`\\x1b[36m(RayWorkerProc pid=N)\\x1b[0m `) before tqdm's `\\r`:
    the real bar still reads as the weights' progress, the real start as ready."""
    raw = (CAPTURE / "serve.log").read_bytes().decode()
    upto = raw[: raw.index("Loading weights took")]
    weights = parsers.parse_load_progress(parsers.log_lines(upto), None)
    assert (weights.stage, weights.percent) == ("weights", 100.0)
    assert parsers.parse_load_progress(parsers.log_lines(raw), None).stage == "ready"


async def test_a_launch_one_node_short_waits_as_the_real_one_did(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    """Launched while Ray has the head node alone, then the worker's Ray started: the same
    placement lines, in the same order, as real vLLM 0.32.0 printed (placement-wait.log)."""
    real = (CAPTURE / "placement-wait.log").read_text().splitlines()
    await clean_up(world, head, worker)
    assert (await run(head, ray_head_command(world))).exit_status == 0
    assert (await run(head, serve_command(world))).exit_status == 0

    def placement() -> list[str]:
        return [ln for ln in load_log(world).splitlines() if "[ray_utils.py" in ln]

    async def waiting() -> bool:
        return any("Waiting for creating a placement group" in ln for ln in placement())

    await eventually(waiting)
    assert (await run(worker, ray_worker_command(world))).exit_status == 0

    async def placed() -> bool:
        return sum("in a node" in ln for ln in placement()) == 2

    await eventually(placed)
    # The real worker joined before vLLM's second wait line (at 30 s); on a slow machine the
    # simulated one may join after it, a line of the same shape.
    ours = [engine_shape(ln) for ln in placement()]
    ours = [ln for i, ln in enumerate(ours) if not (i and "Waiting" in ln and ln == ours[i - 1])]
    assert ours == [engine_shape(ln) for ln in real]


def engine_shape(line: str) -> str:
    """`shape`, with Ray's node ids made wildcards too, from the engine core's prefix on."""
    line = line[line.index("(EngineCore") :]
    return shape(re.sub(r"\b[0-9a-f]{56}\b", "ID", line))

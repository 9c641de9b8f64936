"""Invariants 4, 7 and 9 against the simulated world, at the real ratios of its timing: only
actions that can apply, silent stages capped on their own, one Ray read per look during a load."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from sparkd.shell.ssh import SshPool
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.blocked import healthy_after, relaunch_held
from tests.support.daemon import controller, converge, converged, cycle_until, cycles, mutations

NEW_TAG = "vllm/vllm-openai:v0.33.0"


def launches(world: World, since: float) -> list[str]:
    return [r.command for r in mutations(world, "spark-a", since) if "vllm serve" in r.command]


def docker_runs(world: World, host: str, since: float) -> list[str]:
    return [r.command for r in mutations(world, host, since) if r.command.startswith("docker run")]


async def test_a_hung_capture_burning_cpu_is_restarted_after_its_cap_not_load_timeout(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(seed_world, pool, tmp_path / "state")
    model = ctl.cluster.model
    await converge(ctl, cycles=200)
    since = time.time()
    await seed_world.fault("hang-capture", "spark-a")
    await seed_world.fault("crash-model", "spark-a")
    plans = await cycle_until(ctl, "silent stage")
    restarted_at = time.time()
    restart = [a for p in plans for a in p.actions if "silent stage" in a.reason]
    assert len(restart) == 1 and "CUDA-graph capture" in restart[0].reason
    # The hung launch, then the one that replaced it (run in the same cycle).
    hung_launch = [r for r in mutations(seed_world, "spark-a", since) if "vllm serve" in r.command]
    assert len(hung_launch) == 2
    took = restarted_at - hung_launch[0].at
    # Its CPU kept rising, so load_stall never fired; its own cap did, long before the
    # load's timeout.
    assert not any("load stalled" in a.reason for p in plans for a in p.actions)
    assert model.graph_capture_timeout < took < model.load_timeout, took
    final = await converge(ctl, cycles=300)
    assert final[-1].phase == "healthy"
    assert len(launches(seed_world, since)) == 2


async def test_an_orphaned_engine_holds_the_launch_until_ray_takes_it_away(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl, since = await converged(seed_world, pool, tmp_path / "state", cycles=200)
    await seed_world.fault("orphan-engine", "spark-a")
    plans = await cycle_until(ctl, "engine processes still hold the GPUs")
    assert "VLLM::EngineCore" in plans[-1].reason
    plans += await converge(ctl, cycles=300)
    # No launch while the engine held the GPUs: Ray went first (head, then the worker),
    # and the one launch after it loaded.
    kinds = [a.kind for p in plans for a in p.actions]
    assert kinds.index("restart_ray") < kinds.index("start_model"), kinds
    assert kinds.count("start_model") == 1, kinds
    assert len(docker_runs(seed_world, "spark-a", since)) == 1
    assert len(docker_runs(seed_world, "spark-b", since)) == 1
    assert len(launches(seed_world, since)) == 1
    assert plans[-1].phase == "healthy"


async def test_nothing_starts_on_a_full_disk_until_space_is_freed(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl, since = await converged(seed_world, pool, tmp_path / "state", cycles=200)
    await seed_world.fault("full-disk", "spark-a", "65536")
    await relaunch_held(seed_world, ctl, since, "disk full on spark-a (65536 bytes free)", 20)
    await healthy_after(seed_world, ctl, "heal", "spark-a", limit=300)
    assert len(launches(seed_world, since)) == 1


async def test_a_new_tag_rolls_once_ray_then_model_when_every_host_has_it(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    await converge(controller(seed_world, pool, tmp_path / "state"), cycles=200)
    since = time.time()
    await seed_world.fault("pull-image", "spark-a", NEW_TAG)
    # The operator moves the config to the new tag, pulled on one host so far.
    ctl = controller(seed_world, pool, tmp_path / "state", cluster={"ray": {"image": NEW_TAG}})
    plans = await cycles(ctl, 20)
    assert all(p.actions == () for p in plans), [p.reason for p in plans if p.actions]
    assert f"image {NEW_TAG} missing on spark-b" in plans[-1].reason
    assert "waits until the image" in plans[-1].reason
    assert mutations(seed_world, since=since) == []
    await healthy_after(seed_world, ctl, "pull-image", "spark-b", NEW_TAG, limit=400)
    assert len(docker_runs(seed_world, "spark-a", since)) == 1
    assert len(docker_runs(seed_world, "spark-b", since)) == 1
    assert len(launches(seed_world, since)) == 1
    assert all(NEW_TAG in run for run in docker_runs(seed_world, "spark-a", since))


async def test_a_load_on_a_ready_ray_reads_ray_once_per_look(tmp_path: Path, pool: SshPool) -> None:
    timing = dataclasses.replace(Timing.fast(), model_load=20.0)
    async with World(tmp_path / "world", scenario="seed-morning", timing=timing) as world:
        ctl = controller(world, pool, tmp_path / "state")
        await converge(ctl, cycles=300)
        await world.fault("crash-model", "spark-a")
        last = (await cycle_until(ctl, "loading"))[-1]
        since, looks = time.time(), 0
        # Two kinds of look may read `ray status` on a loaded machine, by design: one made
        # after a look that did not find Ray ready (to count the GPUs again), and one whose
        # dashboard read went silent (`ray status` then reads the GCS instead, which names no
        # node's IP: sparkd.shell.observe).
        unsure: list[str] = []
        silent: list[str] = []
        for _ in range(20):
            if not last.learned.ray_ready:
                unsure.append(last.reason)
            last = plan = await ctl.cycle()
            seen = ctl.view.snapshot
            if seen is None or seen.ray is None or not seen.ray.ips_known:
                silent.append(plan.reason)
            looks += 1
            if plan.phase != "loading":
                break
        until = time.time()
        assert looks >= 10, plan.reason
        calls = [
            r
            for r in world.commands("spark-a")
            if since <= r.at <= until and r.command.split()[:1] == ["ray"]
        ]
        statuses = [r for r in calls if r.command.startswith("ray status")]
        assert len(calls) <= looks + len(unsure), [r.command for r in calls]
        assert len(statuses) <= len(unsure) + len(silent), (
            [r.command for r in statuses],
            unsure,
            silent,
        )
        # Most looks read the node list alone.
        assert len(unsure) + len(silent) < looks / 2, (unsure, silent)

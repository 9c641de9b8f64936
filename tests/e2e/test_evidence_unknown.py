"""Evidence belongs to its process, unknown never acts: against the simulated world.

A `vllm serve` restarted by hand loads in peace; Docker down or hung on a host that answers is
its own finding (the model is still probed, nothing is done); a renamed data interface is an
unknown link, not a healthy one. Each is checked in the world's own command log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sparkd.model.plan import Plan
from sparkd.runtime.controller import Controller
from sparkd.shell.ssh import SshPool
from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.blocked import healthy_after
from tests.support.daemon import controller, converge, converged, cycles, eventually, mutations

# The real load (30 s init, 600 s of shards, 120 s of graph capture) against the real
# probe_interval (60 s), scaled to the tests' probe_interval (1.2 s): a load spans ~12 probes.
LOAD_SCALE = 1.2 / 60.0
# The model's own load_stall and load_timeout (600 s and 3600 s) at that scale.
LOAD_CAPS = {"load_stall": 600.0 * LOAD_SCALE, "load_timeout": 3600.0 * LOAD_SCALE}


def real_load_ratio() -> Timing:
    real = Timing.realistic()
    return dataclasses.replace(
        Timing.fast(),
        model_init=real.model_init * LOAD_SCALE,
        model_load=real.model_load * LOAD_SCALE,
        graph_capture=real.graph_capture * LOAD_SCALE,
    )


@pytest.fixture
async def long_load_world(tmp_path: Path) -> AsyncIterator[World]:
    async with World(
        tmp_path / "world",
        scenario="healthy",
        timing=real_load_ratio(),
        spec_labels=sparkd_spec_labels,
    ) as world:
        yield world


async def test_a_serve_restarted_by_hand_loads_with_its_own_grace(
    long_load_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(long_load_world, pool, tmp_path / "s", cluster={"model": LOAD_CAPS})
    await converge(ctl, cycles=400)
    # Process ages have a resolution of one second: the last probe and readiness are a few
    # seconds older than the newcomer (with real ratios, a probe interval is 60 s).
    await asyncio.sleep(3.0)
    start = time.time()
    await long_load_world.fault("hand-restart-serve", "spark-a")
    # The operator's own `vllm serve` is in the log too: only what comes after it counts.
    await eventually(lambda: bool(mutations(long_load_world, since=start)), within=10)
    since = time.time()
    plans = await converge(ctl, cycles=600)
    assert mutations(long_load_world, since=since) == [], [p.reason for p in plans]
    assert "loading" in [p.phase for p in plans]
    assert plans[-1].phase == "healthy"


async def degraded_by(
    world: World, pool: SshPool, state: Path, fault: str, host: str, looks: int, pause: float
) -> tuple[Controller, float, list[Plan]]:
    """A converged controller, the wall clock then, and its `looks` plans after `fault` on `host`,
    the last one degraded."""
    ctl, since = await converged(world, pool, state, cycles=200)
    await world.fault(fault, host)
    plans = await cycles(ctl, looks, pause=pause)
    assert plans[-1].phase == "degraded", plans[-1].reason
    return ctl, since, plans


async def test_docker_down_on_the_head_keeps_probing_and_acts_on_nothing(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl, since, plans = await degraded_by(
        healthy_world, pool, tmp_path / "s", "docker-down", "spark-a", 12, 0.2
    )
    last = plans[-1]
    assert "spark-a (head) is up but Docker is not answering" in last.reason
    assert "Cannot connect to the Docker daemon" in last.reason
    assert "unreachable" not in last.reason
    probed = [p for p in plans if "probe reasoning_only" in p.reason]
    assert probed, [p.reason for p in plans]
    assert (ctl.view.last_probe_success_at or 0.0) > since
    assert mutations(healthy_world, since=since) == []
    healed = await healthy_after(healthy_world, ctl, "heal", "spark-a", limit=200)
    assert all(p.actions == () for p in healed), [p.reason for p in healed]
    assert mutations(healthy_world, since=since) == []


async def test_docker_hung_on_a_worker_is_not_an_unreachable_host(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl, since, plans = await degraded_by(
        healthy_world, pool, tmp_path / "s", "docker-hung", "spark-b", 6, 0.2
    )
    last = plans[-1]
    assert "spark-b (worker) is up but Docker is not answering (docker failed (timed out))" in (
        last.reason
    )
    assert "probe reasoning_only" in last.reason
    assert mutations(healthy_world, since=since) == []
    healed = await healthy_after(healthy_world, ctl, "heal", "spark-b", limit=200)
    assert all(p.actions == () for p in healed), [p.reason for p in healed]


async def test_a_renamed_data_interface_is_reported_not_healthy(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    _, since, plans = await degraded_by(
        healthy_world, pool, tmp_path / "s", "rename-iface", "spark-b", 4, 0.1
    )
    assert 'Device "enp1s0f0np0" does not exist.' in plans[-1].reason
    assert mutations(healthy_world, since=since) == []

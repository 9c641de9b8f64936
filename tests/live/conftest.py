"""Fixtures for sparkd's own read path against the simulated world, over real SSH on loopback."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import Observed
from sparkd.settings import load_settings
from sparkd.shell.observe import observe
from sparkd.shell.ssh import SshPool
from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim.timing import Timing
from sparkd_sim.world import Scenario, World

# Short SSH limits for tests that wait for a timeout on purpose; the world answers in
# milliseconds, so these only ever expire when a host or tool really is silent.
QUICK_SSH = {"connect_timeout": 0.5, "command_timeout": 1.5}


# Worlds of this test run get loopback addresses of their own (127.N.0.2 up), away from the
# default 127.0.0.x of any other world running on the machine: every world's model listens on
# port 30000 of its head's address, and a probe must never reach another world's model.
FIRST_ADDRESS = f"127.{20 + os.getpid() % 200}.0.2"


def live_world(directory: Path, scenario: Scenario, **options: Any) -> World:
    options.setdefault("timing", Timing.fast())
    return World(directory, scenario=scenario, first_address=FIRST_ADDRESS, **options)


def cluster_of(world: World, **sections: dict[str, Any]) -> ClusterSpec:
    """The world's generated cluster config, with some fields of some sections replaced
    (e.g. `ssh={"command_timeout": 1.0}`)."""
    cluster = load_settings(world.config_path).clusters[0]
    updates = {
        name: getattr(cluster, name).model_copy(update=fields) for name, fields in sections.items()
    }
    return cluster.model_copy(update=updates)


async def observe_until(
    cluster: ClusterSpec,
    pool: SshPool,
    condition: Callable[[Observed], bool],
    within: float = 5.0,
    **kwargs: Any,
) -> Observed:
    """Observe repeatedly until `condition` holds of a snapshot; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        observed = await observe(cluster, pool, **kwargs)
        if condition(observed):
            return observed
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s; last: {observed}")
        await asyncio.sleep(0.02)


def serving(cluster: ClusterSpec) -> Callable[[Observed], bool]:
    def check(observed: Observed) -> bool:
        return observed.endpoint is not None and observed.endpoint.serves(cluster.model.served_name)

    return check


@pytest.fixture
async def pool() -> AsyncIterator[SshPool]:
    # Reconnect quickly: tests wait out faults in fractions of a second.
    ssh_pool = SshPool(reconnect_initial=0.05, reconnect_max=0.2)
    yield ssh_pool
    await ssh_pool.close()


@pytest.fixture
async def seed_world(tmp_path: Path) -> AsyncIterator[World]:
    async with live_world(tmp_path / "world", "seed-morning") as world:
        yield world


@pytest.fixture
async def healthy_world(tmp_path: Path) -> AsyncIterator[World]:
    """The `healthy` scenario, stamped with sparkd's own spec hashes (no drift)."""
    async with live_world(tmp_path / "world", "healthy", spec_labels=sparkd_spec_labels) as world:
        yield world


@dataclass(frozen=True)
class Live:
    world: World
    cluster: ClusterSpec


@pytest.fixture
async def healthy(healthy_world: World, pool: SshPool) -> Live:
    """The healthy world and its cluster, once sparkd sees the model serving."""
    cluster = cluster_of(healthy_world)
    await observe_until(cluster, pool, serving(cluster), probe_due=lambda _: False)
    return Live(healthy_world, cluster)

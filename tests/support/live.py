"""Helpers for sparkd's own read path against the simulated world, over real SSH on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import HostErrorKind, Observed
from sparkd.settings import load_settings
from sparkd.shell.observe import observe
from sparkd.shell.ssh import SshPool
from sparkd_sim.timing import Timing
from sparkd_sim.world import Scenario, World
from tests.support.addresses import run_octet

# Short SSH limits for tests that wait for a timeout on purpose; the world answers in
# milliseconds, so these only ever expire when a host or tool really is silent.
QUICK_SSH = {"connect_timeout": 0.5, "command_timeout": 1.5}


# Worlds of this test run get loopback addresses of their own (127.N.0.2 up), away from the
# default 127.0.0.x of any other world running on the machine: every world's model listens on
# port 30000 of its head's address, and a probe must never reach another world's model.
FIRST_ADDRESS = f"127.{run_octet()}.0.2"


def fast_timing(**changes: float) -> Timing:
    """The fast timing with some of its delays changed (e.g. `reboot_downtime=1.0`)."""
    return dataclasses.replace(Timing.fast(), **changes)


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


def kinds(observed: Observed) -> dict[str, HostErrorKind | None]:
    """Each host's error kind in a snapshot (None where it was read)."""
    return {h.name: h.error.kind if h.error is not None else None for h in observed.hosts}


def serving(cluster: ClusterSpec) -> Callable[[Observed], bool]:
    def check(observed: Observed) -> bool:
        return observed.endpoint is not None and observed.endpoint.serves(cluster.model.served_name)

    return check


@dataclass(frozen=True)
class Live:
    world: World
    cluster: ClusterSpec


TIMEOUT_RC = 124  # timeout(1)'s exit status when it had to stop the command


async def released(world: World) -> bool:
    """Every held call's connection to the world closed: no part of those tools still runs."""
    return bool(world.hung_calls) and all(call.released for call in world.hung_calls)

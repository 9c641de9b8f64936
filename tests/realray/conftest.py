"""Real Ray 2.60 in the simulated containers, for the tier that checks sparkd against Ray itself.

Skipped with a message where it cannot run (ray not importable, not root, no unshare), except
under CI=true, where it must run (`make test` installs the `realray` extra).

Ray runs in real time here: the daemon gets realistic but short intervals, and the test-only
health-check settings in its config's `ray.env` (as an operator would pass them), so a dead node
drops out of Ray in seconds instead of a minute.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from sparkd.runtime.controller import Controller
from sparkd.runtime.state import StateDir
from sparkd.settings import Settings, load_settings
from sparkd.shell.execute import ExecutorTiming
from sparkd.shell.ssh import SshPool
from sparkd_sim import real_ray
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.daemon import fast_cluster
from tests.support.tiers import require_tier

# Ray's own failure detection, shortened for tests only (tests/fixtures/ray-real/README.md): a
# killed raylet is DEAD in `ray list nodes` after ~2 s instead of ~15, a hung one instead of ~64.
HEALTH_CHECK_ENV = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}
# Real Ray needs real time: a recheck a second apart, a join timeout a real join fits in
# (8-11 s measured, more on a loaded machine), a `ray` call 0.6-3 s of a core.
REAL_CLUSTER: dict[str, Any] = {
    "interval": 2.0,
    "recheck_interval": 1.0,
    "probe_interval": 2.0,
    "ray": {"join_timeout": 60.0, "env": HEALTH_CHECK_ENV},
    "policy": {"healthy_reset": 3.0},
}
REAL_EXECUTOR = ExecutorTiming(poll=0.1, serve_appear=10.0, stop_grace=5.0)


def _why_not() -> str | None:
    why = real_ray.unavailable()
    if why is None:
        probe = subprocess.run(
            ["unshare", "--pid", "--mount", "--fork", "--mount-proc", "true"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode != 0:
            why = f"unshare --pid --mount fails here: {probe.stderr.strip()}"
    return why


def require_real_ray() -> None:
    require_tier("real-Ray", _why_not())


@dataclass
class RealCluster:
    """One world with real Ray and one daemon for it, shared by a module's scenarios (a real
    2-node cluster costs ~1 GB and 11-20 s to start)."""

    world: World
    controller: Controller


def real_settings(world: World, state: Path) -> Settings:
    loaded = load_settings(world.config_path)
    clusters = []
    for cluster in loaded.clusters:
        fast = fast_cluster(
            cluster,
            ssh={"connect_timeout": 2.0, "command_timeout": 15.0},
            model={"load_stall": 10.0, "load_timeout": 60.0},
            probe={"timeout": 1.5},
        )
        changes = dict(REAL_CLUSTER)
        changes["ray"] = fast.ray.model_copy(
            update={**REAL_CLUSTER["ray"], "env": {**fast.ray.env, **HEALTH_CHECK_ENV}}
        )
        changes["policy"] = fast.policy.model_copy(update=REAL_CLUSTER["policy"])
        clusters.append(fast.model_copy(update=changes))
    return Settings.model_construct(
        daemon=loaded.daemon.model_copy(update={"state_dir": state, "listen": "127.0.0.1:0"}),
        clusters=tuple(clusters),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RealCluster]:
    require_real_ray()
    base = tmp_path_factory.mktemp("realray")
    # A block of addresses of its own, away from the other tiers' worlds.
    world = World(
        base / "world",
        scenario="seed-morning",
        timing=Timing.fast(),
        ray="real",
        first_address="127.0.91.2",
    )
    pool = SshPool(reconnect_initial=0.05, reconnect_max=0.5)
    await world.start()
    try:
        settings = real_settings(world, base / "state")
        ctl = Controller(
            settings.clusters[0], pool, StateDir(base / "state"), executor_timing=REAL_EXECUTOR
        )
        yield RealCluster(world, ctl)
    finally:
        await pool.close()
        if world.started:
            await world.stop()

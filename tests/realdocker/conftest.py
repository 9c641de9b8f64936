"""A real Docker engine (Debian's docker.io) behind each simulated host, for the tier that checks
sparkd against what Docker itself prints and does.

Skipped with a message where it cannot run (not root, docker.io or busybox-static missing),
except under CI=true, where it must run (.ci/run installs both). One world with one host (so one
dockerd) serves a module's scenarios; each scenario removes what it started.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import RayState
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue
from sparkd.shell.observe import HostReading, read_host
from sparkd.shell.ssh import HostConnection, SshFailure, SshPool
from sparkd_sim import real_docker
from sparkd_sim.real_docker import Daemon
from sparkd_sim.world import World
from tests.support.addresses import run_octet
from tests.support.live import cluster_of
from tests.support.tiers import require_tier

# A block of addresses of its own, away from the other tiers' worlds.
FIRST_ADDRESS = f"127.{run_octet()}.92.2"
# What the fact script's reading of Ray is taken to be: the image's `ray` only blocks.
NO_RAY = RayState(nodes=(), gpus_total=0.0)


def require_real_docker() -> None:
    require_tier("real-Docker", real_docker.unavailable())


@dataclass
class Tier:
    world: World
    cluster: ClusterSpec
    pool: SshPool

    @property
    def host(self) -> HostSpec:
        return self.cluster.hosts[0]

    @property
    def daemon(self) -> Daemon:
        assert self.world.real_docker is not None
        return self.world.real_docker.daemons[self.host.name]

    @property
    def conn(self) -> HostConnection:
        return self.pool.connection(self.host, self.cluster.ssh)

    async def run(self, command: str) -> tuple[int, str, str]:
        """A command on the host over SSH, as sparkd's executor sends it: (rc, stdout, stderr)."""
        try:
            result = await self.conn.run(command, timeout=30.0)
        except SshFailure as failure:
            if failure.result is None:
                raise
            result = failure.result
        return result.exit_status, result.stdout, result.stderr

    async def read(self, cluster: ClusterSpec | None = None) -> HostReading:
        """The host's facts as sparkd's observe reads them (Ray's reading reused)."""
        cluster = cluster or self.cluster
        return await read_host(cluster, self.host, self.conn, time.time(), (), NO_RAY)

    async def events(self, since: float, *filters: str) -> list[dict[str, str]]:
        """The engine's events from `since` until now: each one's action and attributes."""
        rc, out, err = await self.daemon.docker(
            "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}",
            "--format", "{{json .}}", *filters,
        )  # fmt: skip
        assert rc == 0, err
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        return [{"action": r["Action"], **r["Actor"]["Attributes"]} for r in rows]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tier(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Tier]:
    require_real_docker()
    base = tmp_path_factory.mktemp("realdocker")
    world = World(
        base / "world", hosts=1, scenario="empty", docker="real", first_address=FIRST_ADDRESS
    )
    pool = SshPool(reconnect_initial=0.05, reconnect_max=0.5)
    await world.start()
    try:
        loaded = cluster_of(world)
        # The tier's image, and no bind mount of the machine's /models (dockerd would create it).
        cluster = loaded.model_copy(
            update={"ray": loaded.ray.model_copy(update={"image": real_docker.IMAGE, "mounts": ()})}
        )
        yield Tier(world, cluster, pool)
    finally:
        await pool.close()
        if world.started:
            await world.stop()
    assert world.real_docker is not None
    assert world.real_docker.leftovers() == [], "the tier left processes or mounts behind"


@pytest_asyncio.fixture(loop_scope="module")
async def clean(tier: Tier) -> AsyncIterator[Tier]:
    """The tier with no container on its host, before and after the test."""
    await _remove_all(tier)
    yield tier
    await _remove_all(tier)


async def _remove_all(tier: Tier) -> None:
    if not tier.daemon.running:
        assert tier.world.real_docker is not None
        await tier.world.real_docker.start_daemon(tier.host.name)
    rc, ids, _ = await tier.daemon.docker("ps", "-aq")
    assert rc == 0
    if ids.split():
        await tier.daemon.docker("rm", "-f", *ids.split())


def start_ray(tier: Tier) -> str:
    return catalogue.actions.start_ray(tier.cluster, tier.host, 20).command

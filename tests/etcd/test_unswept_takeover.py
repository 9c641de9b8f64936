"""With real `sparkd run` processes: a host the new owner cannot reach at
its takeover stays unfenced, and nothing of the new owner's runs there until its sweep has.
The owner is SIGKILLed while spark-b refuses SSH; the standby takes over and sweeps spark-a
only. spark-b's Ray worker dies while it is away, so the moment it is back the new owner
wants to act on it: the first command of the new owner's that the host runs is the sweep
(the fenced no-op), the repair only after it, and the host's fence record moves to the new
token at that sweep. The checker after."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sparkd.shell.catalogue.fence import FENCE_DIR
from sparkd_sim.owned import OwnedCommand
from sparkd_sim.world import World
from tests.etcd.conftest import EtcdServer
from tests.support.daemon import eventually
from tests.support.ha import (
    TTL,
    Instance,
    check_invariants,
    cluster_name,
    is_sweep,
    start_owner_and_standby,
    wait_healthy,
)

pytestmark = pytest.mark.etcd


def fence_token(world: World, host: str, cluster: str) -> int | None:
    """The token the host's fence record holds for the cluster, if any."""
    path = Path(world.host(host).state.home) / FENCE_DIR / cluster
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


async def test_a_host_away_at_the_takeover_runs_nothing_before_its_sweep(
    seed_world: World, etcd: EtcdServer, tmp_path: Path
) -> None:
    a = Instance("ops-a", seed_world, etcd, tmp_path)
    b = Instance("ops-b", seed_world, etcd, tmp_path)
    cluster = cluster_name(seed_world)
    away = seed_world.host("spark-b")

    def by_b(host: str) -> list[OwnedCommand]:
        return [
            c
            for c in seed_world.owned_commands()
            if c.owner.instance == b.name and c.host == seed_world.host(host).ssh.address
        ]

    try:
        await start_owner_and_standby(a, b, cluster)
        await wait_healthy(a, within=120)
        old = fence_token(seed_world, "spark-b", cluster)
        assert old is not None
        await seed_world.fault("unreachable", "spark-b")
        await a.kill()

        async def b_owns() -> bool:
            return await b.role(cluster) == "owner"

        await eventually(b_owns, within=2 * TTL + 2)
        await eventually(lambda: any(is_sweep(c) for c in by_b("spark-a")), within=10)
        token = by_b("spark-a")[0].owner.token
        assert token > old
        await seed_world.fault("kill-container", "spark-b", "sparkd-sparks-ray-worker")
        # Several of b's looks with spark-b away: it stays unswept, its record the old owner's.
        await asyncio.sleep(3.0)
        assert by_b("spark-b") == []
        assert fence_token(seed_world, "spark-b", cluster) == old

        await seed_world.fault("heal", "spark-b")
        await wait_healthy(b, within=120)
        ran = by_b("spark-b")
        assert ran and is_sweep(ran[0]) and not ran[0].refused, ran[:1]
        assert {c.owner.token for c in ran} == {token}
        repairs = [c for c in ran if "ray" in c.command and not is_sweep(c)]
        assert repairs and repairs[0].at >= ran[0].ended, "a repair before the sweep"
        assert fence_token(seed_world, "spark-b", cluster) == token
        assert away.reachability == "ok"
        assert (await check_invariants(seed_world, [a, b], etcd)).ran > 0
    finally:
        await a.stop()
        await b.stop()

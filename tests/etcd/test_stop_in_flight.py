"""With an action in flight: SIGTERM reaches the owner while its
repair's command is on its way to the host. The owner takes no new action, lets the one in
flight finish under its token (the host runs it: nothing is refused), then releases the
cluster; the standby acquires within a second of that release, long before the lease could
have expired (the production TTL), and only then acts. Two `sparkd run` processes, a real
etcd, the checker after."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from sparkd_sim.world import World
from tests.etcd.conftest import EtcdServer
from tests.support.daemon import eventually
from tests.support.ha import (
    PRODUCTION_TIMINGS,
    Instance,
    check_invariants,
    check_never_two_actors,
    cluster_name,
    kill_worker,
    stamp,
    start_owner_and_standby,
    wait_healthy,
)

pytestmark = pytest.mark.etcd

# How late the repair's command reaches the host: well inside the test config's 3 s command
# timeout, long enough for SIGTERM to arrive while it is on its way.
LATE = 1.5


async def test_a_graceful_stop_lets_the_action_in_flight_finish_then_hands_over(
    seed_world: World, etcd: EtcdServer, tmp_path: Path
) -> None:
    a = Instance("ops-a", seed_world, etcd, tmp_path, timings=PRODUCTION_TIMINGS)
    b = Instance("ops-b", seed_world, etcd, tmp_path, timings=PRODUCTION_TIMINGS)
    cluster = cluster_name(seed_world)
    try:
        await start_owner_and_standby(a, b, cluster)
        await wait_healthy(a, within=120)
        worker = seed_world.host("spark-b").ssh
        await seed_world.fault("late-delivery", "spark-b", str(LATE))
        await eventually(lambda: kill_worker(seed_world), within=30)
        await eventually(lambda: worker.delayed == 1, within=30, poll=0.005)
        asked = a.signal(signal.SIGTERM)
        assert a.proc is not None
        assert await asyncio.wait_for(a.proc.wait(), 30) == 0

        events = a.events()
        started = [e for e in events if e.get("event") == "action_start" and stamp(e) < asked]
        assert started and started[-1]["action"] == "start_ray_worker", started[-1:]
        ended = [e for e in events if e.get("event") == "action" and stamp(e) > asked]
        assert [(e["action"], e["result"]) for e in ended] == [("start_ray_worker", "ok")]
        released = [e for e in events if e.get("event") == "released"]
        assert released and stamp(released[-1]) >= stamp(ended[0]), "released mid-action"
        # Nothing new after the signal: the one action, then the release.
        assert not [e for e in events if e.get("event") == "action_start" and stamp(e) > asked]
        # The command in flight ran on the host under a's token.
        late = [
            c
            for c in seed_world.owned_commands()
            if c.owner.instance == a.name and c.host == worker.address and c.at > asked
        ]
        assert late and not [c for c in late if c.refused], late

        async def b_owns() -> bool:
            return await b.role(cluster) == "owner"

        await eventually(b_owns, within=10)
        acquired = [e for e in b.events() if e.get("event") == "acquired"][-1]
        assert acquired["was"] == a.name
        assert stamp(acquired) - stamp(released[-1]) < 1.0
        await wait_healthy(b, within=60)
        check_never_two_actors(seed_world, a, b)
        assert (await check_invariants(seed_world, [a, b], etcd)).ran > 0
    finally:
        await a.stop()
        await b.stop()

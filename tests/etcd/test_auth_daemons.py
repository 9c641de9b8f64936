"""With real `sparkd run` processes: etcd with auth on and simple
tokens that expire after one second, shorter than the renewal interval, so every renewal of
the owner's finds its token gone. Two instances log in with a user and a password file. Over
many token lifetimes the owner stays the owner under one fencing token, no renewal round
fails, the standby never acquires, and the owner repairs what breaks (its memory and intent
writes go through too); then a graceful stop hands over at once, so the standby's watch,
opened with a token long expired, still saw the release: the standby renews so seldom that no
renewal round of its own can have come before its takeover. The checker after."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkd_sim.world import World
from tests.etcd.conftest import EtcdServer, require_etcd
from tests.etcd.test_client import etcdctl
from tests.support.daemon import eventually
from tests.support.ha import (
    Instance,
    check_invariants,
    cluster_name,
    kill_worker,
    stamp,
    start_owner_and_standby,
    wait_healthy,
)

pytestmark = pytest.mark.etcd

TOKEN_TTL = 1
# Renewals every 2 s: each finds the 1 s token expired (renew + 2 x timeout <= TTL - margin).
TIMINGS = "lease_ttl = 6\nrenew_interval = 2.0\nrequest_timeout = 0.5\nmargin = 1.0\n"
WATCHED = 12.0
# The standby's first round is its only renewal for minutes: a takeover before the next one
# came through its watch. A time bound cannot tell them apart: the watch's round logs in first
# (bcrypt; 1.0-1.5 s a login on a loaded two-core box), a renewal round may fall due at once.
STANDBY_RENEW = 300.0
STANDBY_TIMINGS = (
    f"lease_ttl = {int(STANDBY_RENEW) + 10}\nrenew_interval = {STANDBY_RENEW}\n"
    "request_timeout = 0.5\nmargin = 1.0\n"
)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(require_etcd(), tmp_path / "auth")
    server.extra = ["--auth-token", "simple", "--auth-token-ttl", str(TOKEN_TTL)]
    server.start()
    try:
        etcdctl(server.url, "user", "add", "root:s3cret-root")
        etcdctl(server.url, "user", "grant-role", "root", "root")
        etcdctl(server.url, "auth", "enable")
        yield server
    finally:
        server.kill()


def logged_in(instance: Instance, password: Path) -> Instance:
    text = instance.config.read_text()  # [ha] is the config's last section
    instance.config.write_text(text + f'user = "root"\npassword_file = "{password}"\n')
    return instance


async def test_renewals_outlive_expiring_auth_tokens(
    seed_world: World, secured: EtcdServer, tmp_path: Path
) -> None:
    password = tmp_path / "etcd-password"
    password.write_text("s3cret-root\n")
    password.chmod(0o600)
    a, b = (
        logged_in(Instance(f"ops-{n}", seed_world, secured, tmp_path, timings=t), password)
        for n, t in (("a", TIMINGS), ("b", STANDBY_TIMINGS))
    )  # fmt: skip
    cluster = cluster_name(seed_world)
    try:
        # b's first round begins after this: its next renewal round not before STANDBY_RENEW on.
        launched = time.time()
        await start_owner_and_standby(a, b, cluster)
        await wait_healthy(a, within=120)
        first = (await a.status())["ha"]["clusters"][cluster]
        failures = (await a.metrics())["sparkd_ha_renew_failures_total"]
        began = time.time()
        seen: list[tuple[object, object, object]] = []
        killed: float | None = None
        while time.time() - began < WATCHED:
            mine, theirs = await asyncio.gather(a.status(), b.status())
            if mine.get("ha") and theirs.get("ha"):
                ours, others = mine["ha"]["clusters"][cluster], theirs["ha"]["clusters"][cluster]
                seen.append((ours["role"], ours["token"], others["role"]))
            if killed is None and time.time() - began > WATCHED / 2:
                killed = time.time() if await kill_worker(seed_world) else None
            await asyncio.sleep(0.1)
        assert seen and set(seen) == {("owner", first["token"], "standby")}, set(seen)
        assert (await a.metrics())["sparkd_ha_renew_failures_total"] == failures
        assert killed is not None, "the worker was never running to kill"
        since = killed

        # The repair itself, not `healthy`: a status from before a look saw the kill says so too.
        def repaired() -> bool:
            return any(
                e.get("event") == "action" and e.get("action") == "start_ray_worker"
                and e.get("result") == "ok" and stamp(e) > since
                for e in a.events()
            )  # fmt: skip

        await eventually(repaired, within=60)
        await wait_healthy(a, within=60)

        a.signal(signal.SIGTERM)
        assert a.proc is not None
        assert await asyncio.wait_for(a.proc.wait(), 20) == 0

        async def b_owns() -> bool:
            return await b.role(cluster) == "owner"

        await eventually(b_owns, within=10)
        # The revoke went through (a's lease gone at once, not expired later) ...
        assert any(e.get("event") == "released" for e in a.events()), "a never released"
        acquired = [e for e in b.events() if e.get("event") == "acquired"][-1]
        # ... and b heard it through the watch: before its next renewal round could begin.
        assert stamp(acquired) < launched + STANDBY_RENEW, (launched, acquired)
        checked = await check_invariants(seed_world, [a, b], secured, login=("root", password))
        assert checked.ran > 0
    finally:
        await a.stop()
        await b.stop()

"""Every way a host can fail sparkd, produced by the world's faults and classified in the
snapshot: the planner decides on these kinds, so each must come out right over real SSH."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest

from sparkd.model.observed import Observed
from sparkd.shell.observe import observe
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.live import (
    QUICK_SSH,
    cluster_of,
    fast_timing,
    kinds,
    live_world,
    observe_until,
)
from tests.support.worlds import both_servers

REBOOT_DOWNTIME = 1.0


@pytest.fixture
async def slow_reboot_world(tmp_path: Path) -> AsyncIterator[World]:
    """Reboots keep SSH down long enough to observe the host while it is away."""
    timing = fast_timing(reboot_downtime=REBOOT_DOWNTIME)
    async with live_world(tmp_path / "world", "seed-morning", timing=timing) as world:
        yield world


async def test_a_rebooting_host_refuses_then_returns_with_a_new_boot_id(
    slow_reboot_world: World, pool: SshPool
) -> None:
    world = slow_reboot_world
    cluster = cluster_of(world)
    old_boot = world.hosts["spark-b"].state.boot_id
    await world.fault("reboot", "spark-b")
    down = await observe(cluster, pool)
    assert kinds(down) == {"spark-a": None, "spark-b": "refused"}

    def back(observed: Observed) -> bool:
        host = observed.host("spark-b")
        return host is not None and host.reachable

    up = await observe_until(cluster, pool, back, within=REBOOT_DOWNTIME + 3)
    worker = up.host("spark-b")
    assert worker is not None
    assert worker.boot_id == world.hosts["spark-b"].state.boot_id != old_boot


@both_servers
async def test_an_unreachable_host_is_refused(seed_world: World, pool: SshPool) -> None:
    await seed_world.fault("unreachable", "spark-b")
    observed = await observe(cluster_of(seed_world), pool)
    assert kinds(observed) == {"spark-a": None, "spark-b": "refused"}


@both_servers
async def test_a_blackholed_host_times_out_without_delaying_the_head(
    seed_world: World, pool: SshPool
) -> None:
    connect = 2.0
    cluster = cluster_of(seed_world, ssh={"connect_timeout": connect, "command_timeout": 3.0})
    await seed_world.fault("blackhole", "spark-b")
    since, started = time.time(), time.monotonic()
    observed = await observe(cluster, pool)
    elapsed = time.monotonic() - started

    assert kinds(observed) == {"spark-a": None, "spark-b": "timeout"}
    head = observed.host("spark-a")
    assert head is not None and head.boot_id == seed_world.hosts["spark-a"].state.boot_id
    assert observed.ray is not None  # the head's own sections arrived in full
    # The silent worker costs its connect timeout, and the hosts are read concurrently: the
    # head's command reached it before that timeout ran out (read one after the other, worker
    # first, it could not have). An order, not a speed: no bound on how long the read took.
    assert elapsed >= connect, elapsed
    head_read = [
        r.at for r in seed_world.commands("spark-a") if r.source == "ssh" and r.at >= since
    ]
    assert head_read and head_read[0] - since < connect, (head_read, since)


@both_servers
async def test_an_established_connection_gone_silent_times_out(
    seed_world: World, pool: SshPool
) -> None:
    cluster = cluster_of(seed_world, ssh=QUICK_SSH)
    assert kinds(await observe(cluster, pool)) == {"spark-a": None, "spark-b": None}
    await seed_world.fault("blackhole", "spark-b")
    observed = await observe(cluster, pool)
    assert kinds(observed) == {"spark-a": None, "spark-b": "timeout"}


async def test_a_changed_host_key_is_refused_as_host_key(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    lines = seed_world.known_hosts_path.read_text().splitlines()
    worker = seed_world.hosts["spark-b"]
    prefix = f"[{worker.address}]:{worker.port} "
    swapped = [prefix + impostor if line.startswith(prefix) else line for line in lines]
    assert swapped != lines
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("\n".join(swapped) + "\n")

    cluster = cluster_of(seed_world, ssh={"known_hosts_file": known_hosts})
    observed = await observe(cluster, pool)
    assert kinds(observed) == {"spark-a": None, "spark-b": "host_key"}


async def test_a_key_the_hosts_do_not_accept_is_auth(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    key_file = tmp_path / "id_other"
    key_file.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    key_file.chmod(0o600)

    cluster = cluster_of(seed_world, ssh={"key_file": key_file})
    observed = await observe(cluster, pool)
    assert kinds(observed) == {"spark-a": "auth", "spark-b": "auth"}
    assert observed.ray is None and observed.endpoint is None

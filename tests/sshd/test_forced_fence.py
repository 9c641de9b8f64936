"""The forced-command wrapper with `[ha]` as a real OpenSSH sshd runs it: the owner's fenced
commands pass and run under the wrapper's own compare-and-set; an older token is refused with
exit 76 over SSH, as sparkd's executor sees it, and nothing runs; a bare mutation is refused."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkd.model import exits
from sparkd.model.cluster import ClusterSpec
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue, forced
from sparkd.shell.catalogue.fence import FenceToken
from sparkd.shell.fencing import HostFence, HostRefused
from sparkd.shell.ssh import HostConnection, SshFailure, SshPool
from tests.support.sshd import cluster_behind, install_forced_command, running_sshd

pytestmark = pytest.mark.sshd
ETCD = 31337


@dataclass(frozen=True)
class Fenced:
    cluster: ClusterSpec
    host: HostSpec
    calls: Path
    home: Path


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Fenced]:
    tools = tmp_path / "bin"
    tools.mkdir()
    calls = tmp_path / "calls"
    for tool in ("docker", "systemctl", "kill"):
        (tools / tool).write_text(f'#!/bin/sh\nprintf "%s\\n" "{tool} $*" >> {calls}\n')
        (tools / tool).chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = f"SetEnv PATH={tools}:/usr/local/bin:/usr/bin:/bin HOME={home}\n"
    with running_sshd(tmp_path, env) as sshd:
        cluster = cluster_behind(sshd)
        host = cluster.head
        install_forced_command(tmp_path, cluster, host, fenced=True)
        yield Fenced(cluster, host, calls, home)


def token(world: Fenced, value: int, instance: str = "ops-a") -> FenceToken:
    return FenceToken(world.cluster.name, value, ETCD, instance)


async def status(conn: HostConnection, command: str) -> tuple[int, str]:
    try:
        result = await conn.run(command, timeout=30)
    except SshFailure as failure:
        assert failure.kind == "exit_nonzero" and failure.result is not None, failure
        return failure.result.exit_status, failure.result.stderr
    return result.exit_status, result.stderr


def calls(world: Fenced) -> list[str]:
    return world.calls.read_text().splitlines() if world.calls.exists() else []


async def test_behind_the_wrapper_an_older_token_is_refused_over_ssh(world: Fenced) -> None:
    cluster, host = world.cluster, world.host
    seconds = cluster.ssh.command_timeout
    kill = catalogue.actions.kill_process(cluster, 4100, "TERM", seconds)
    conn = HostConnection(host, cluster.ssh)
    try:
        assert (await status(conn, kill.command))[0] == exits.REFUSED_EXIT  # bare: refused
        code, err = await status(
            conn, catalogue.fence.fenced(kill, token(world, 12), seconds).command
        )
        assert code == 0, err
        assert calls(world) == ["kill -TERM 4100"]
        record = world.home / catalogue.fence.FENCE_DIR / cluster.name
        assert record.read_text() == f"12 {ETCD} ops-a\n"
        stale = catalogue.fence.fenced(kill, token(world, 11, "ops-b"), seconds).command
        code, err = await status(conn, stale)
        assert code == exits.FENCED_EXIT
        assert "refused token 11: a newer one is recorded" in err
        assert calls(world) == ["kill -TERM 4100"]  # nothing ran
    finally:
        await conn.close()


async def test_the_owners_sweep_and_refusal_through_the_executors_fence(world: Fenced) -> None:
    cluster, host = world.cluster, world.host
    pool = SshPool()
    current: list[FenceToken | None] = [token(world, 20)]
    refused: list[str] = []

    def lost(host_name: str, detail: str) -> None:
        refused.append(detail)
        current[0] = None

    fence = HostFence(cluster.model_copy(update={"hosts": (host,)}), pool, lambda: current[0])
    fence.on_fenced = lost
    try:
        await fence.sweep()
        assert fence.unswept() == []
        seconds = cluster.ssh.command_timeout
        remote, _ = fence.wrap(
            host, catalogue.actions.remove_container("glm-old", seconds), seconds
        )
        assert (await status(pool.connection(host, cluster.ssh), remote.command))[0] == 0
        # A newer owner sweeps the host: this one's next command is refused there.
        newer = catalogue.fence.fence_sweep(token(world, 25, "ops-b"), seconds).command
        assert (await status(pool.connection(host, cluster.ssh), newer))[0] == 0
        remote, sent = fence.wrap(
            host, catalogue.actions.remove_container("glm-two", seconds), seconds
        )
        with pytest.raises(SshFailure) as failure:
            await pool.connection(host, cluster.ssh).run(remote.command, timeout=30)
        with pytest.raises(HostRefused) as caught:
            fence.check(host, failure.value, sent)
        assert caught.value.kind == "fenced" and refused and "refused token 20:" in refused[0]
        assert "25" not in refused[0] and "ops-b" not in refused[0]  # the record stays there
        assert calls(world) == ["docker rm -f -- glm-old"]
        with pytest.raises(HostRefused):  # no longer the owner: nothing more is sent
            fence.wrap(host, catalogue.actions.remove_container("glm-3", seconds), seconds)
    finally:
        await pool.close()


async def test_an_owner_recovers_a_cluster_through_fenced_wrappers(tmp_path: Path) -> None:
    """Every command an HA owner really sends (sweep, reads, fenced actions) passes the
    `[ha]` wrapper of each host, and the cold start converges."""
    from sparkd_demo.cli import sparkd_spec_labels
    from tests.e2e.test_fencing import Owner, fenced_controller, record_path
    from tests.support.daemon import converge
    from tests.support.sshd import openssh_world

    async with openssh_world(
        tmp_path / "world", "seed-morning", spec_labels=sparkd_spec_labels
    ) as world:
        pool = SshPool(reconnect_initial=0.05, reconnect_max=0.2)
        try:
            owner = Owner(77)
            ctl = fenced_controller(world, pool, tmp_path / "state", owner)
            for host in ctl.cluster.hosts:
                key = forced.public_key(ctl.cluster.ssh)
                world.install_forced_command(
                    host.name, forced.wrapper(ctl.cluster, host, key, fenced=True)
                )
            plans = await converge(ctl)
        finally:
            await pool.close()
        assert plans[-1].phase == "healthy", plans[-1].reason
        assert owner.refused == []
        assert all(o.result == "ok" for o in ctl.view.recent)
        for host in ctl.cluster.hosts:
            assert record_path(world, host.name, ctl.cluster.name).read_text().startswith("77 ")

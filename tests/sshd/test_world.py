"""What only OpenSSH can show of the simulated world behind it. The daemon's scenarios that must
hold behind both servers take `@both_servers` in their own modules (tests/support/worlds.py): its
OpenSSH parameter carries this tier's `sshd` marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkd.shell import catalogue
from sparkd.shell.observe import observe
from sparkd.shell.ssh import SshFailure, SshPool
from sparkd_sim.openssh import OpenSshHost, descendants
from tests.support.daemon import eventually
from tests.support.live import cluster_of, kinds
from tests.support.sshd import openssh_world

pytestmark = pytest.mark.sshd


def exe(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/exe")


def state_of(pid: int) -> str | None:
    """A process's state letter (`T` when stopped), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return None
    state = stat[stat.rindex(")") + 2]
    return None if state == "Z" else state


async def test_faults_act_on_sshds_own_processes_and_stopping_leaves_none(
    tmp_path: Path, pool: SshPool
) -> None:
    async with openssh_world(tmp_path / "world", "seed-morning") as world:
        cluster = cluster_of(world)
        assert kinds(await observe(cluster, pool)) == {"spark-a": None, "spark-b": None}
        worker = world.hosts["spark-b"].ssh
        assert isinstance(worker, OpenSshHost) and worker.pid is not None
        listener = worker.pid
        # sparkd's connection: sshd's per-connection processes under the listener.
        connection = [p for p in descendants(listener) if exe(p) == exe(listener)]
        assert connection
        seen = {listener, *connection}

        await world.fault("blackhole", "spark-b")
        # A signal is delivered on the target's next trip through the kernel: soon, not now.
        await eventually(lambda: {state_of(p) for p in [listener, *connection]} == {"T"}, 2)
        await world.fault("heal", "spark-b")
        assert worker.pid == listener and state_of(listener) not in ("T", None)
        # The connection that went silent answers again: no new login was needed.
        assert kinds(await observe(cluster, pool)) == {"spark-a": None, "spark-b": None}
        assert set(connection) <= set(descendants(listener))

        # A session's command, left running by its client, ends with kill_sessions; the
        # connection stays.
        conn = pool.connection(cluster.host("spark-b"), cluster.ssh)
        with pytest.raises(SshFailure):
            await conn.run("sleep 33", timeout=0.2)
        # The client gave up once its request was sent; sshd may not have started it yet.
        await eventually(lambda: "sleep 33" in command_lines(worker), 3)
        worker.kill_sessions()
        await eventually(lambda: "sleep 33" not in command_lines(worker), 2)
        assert (await conn.run("echo ok", timeout=3)).stdout == "ok\n"

        await world.fault("unreachable", "spark-b")
        assert [state_of(p) for p in [listener, *connection]] == [None] * (1 + len(connection))
        # The first look may still find sparkd's old connection dropping (`conn_lost`); a new
        # one is refused at once.
        seen_kinds: list[dict[str, str | None]] = []

        async def refused() -> bool:
            seen_kinds.append(kinds(await observe(cluster, pool)))
            return seen_kinds[-1] == {"spark-a": None, "spark-b": "refused"}

        await eventually(refused, 3)
        assert all(k["spark-b"] in ("conn_lost", "refused") for k in seen_kinds), seen_kinds
        await world.fault("heal", "spark-b")
        assert worker.pid not in (None, listener)
        assert kinds(await observe(cluster, pool)) == {"spark-a": None, "spark-b": None}

        for host in world.hosts.values():
            assert isinstance(host.ssh, OpenSshHost) and host.ssh.pid is not None
            seen |= {host.ssh.pid, *descendants(host.ssh.pid)}
        await world.fault("blackhole", "spark-a")
    # Stopped ones included, every sshd of the world and what ran under it is gone.
    assert {p: state_of(p) for p in seen if state_of(p) is not None} == {}


def command_lines(host: OpenSshHost) -> list[str]:
    lines = []
    for pid in host.session_processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                lines.append(handle.read().replace(b"\0", b" ").decode().strip())
        except FileNotFoundError:
            continue
    return lines


async def test_a_command_outlives_its_channel_and_only_timeout_ends_it(
    tmp_path: Path, pool: SshPool
) -> None:
    """The asyncssh simulator ends a command with its channel; OpenSSH sends a command without a
    terminal no signal at all. What ends a hung tool on a real host is the `timeout -k` sparkd
    wraps around it."""
    async with openssh_world(tmp_path / "world", "empty") as world:
        cluster = cluster_of(world)
        ssh = world.hosts["spark-b"].ssh
        assert isinstance(ssh, OpenSshHost)
        conn = pool.connection(cluster.host("spark-b"), cluster.ssh)
        timed = " ".join(catalogue.remote.timed(["sleep", "30"], 1))
        for command in ("sleep 31", timed):
            with pytest.raises(SshFailure) as info:
                await conn.run(command, timeout=0.3)
            assert info.value.kind == "timeout"
        # Both run once sshd has started them, which may come after their clients gave up.
        await eventually(lambda: {"sleep 31", "sleep 30"} <= set(command_lines(ssh)), within=3)
        await eventually(lambda: "sleep 30" not in command_lines(ssh), within=3)
        assert "sleep 31" in command_lines(ssh)
        # The connection sparkd gave up the channels on serves the next command.
        assert (await conn.run("echo ok", timeout=3)).stdout == "ok\n"
        assert [r.command for r in world.commands("spark-b") if r.source == "ssh"] == [
            "sleep 31",
            timed,
            "echo ok",
        ]
    assert command_lines(ssh) == []

"""The SSH transport against real asyncssh servers on loopback: every failure kind produced for
real where loopback allows it, and constructed where it cannot (routing errors)."""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import AsyncIterator, Awaitable

import asyncssh
import pytest

from sparkd.shell.ssh import CommandResult, HostConnection, SshFailure, SshPool, classify
from tests.shell.conftest import (
    Keys,
    SshServer,
    closed_port,
    host_spec,
    ssh_spec,
    wait_until,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def conn(server: SshServer, keys: Keys) -> AsyncIterator[HostConnection]:
    connection = HostConnection(host_spec(server.port), ssh_spec(keys))
    yield connection
    await connection.close()


async def failure(pending: Awaitable[object]) -> SshFailure:
    with pytest.raises(SshFailure) as caught:
        await pending
    return caught.value


class Blackhole:
    """A TCP listener that accepts and never speaks, counting accepts."""

    def __init__(self) -> None:
        self.accepted = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.accepted += 1
            self._writers.append(writer)

        self._server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        for writer in self._writers:
            writer.close()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


@pytest.fixture
async def blackhole() -> AsyncIterator[Blackhole]:
    hole = Blackhole()
    yield hole
    await hole.stop()


# --- commands on a healthy host ---------------------------------------------------------------


async def test_run_returns_output_and_status(conn: HostConnection) -> None:
    result = await conn.run("echo hello world", timeout=5)
    assert result == CommandResult(0, "hello world\n", "", result.duration)
    assert 0 < result.duration < 5
    assert conn.connected


async def test_input_travels_on_stdin(conn: HostConnection) -> None:
    result = await conn.run("cat", timeout=5, input="secret-token\n")
    assert result.stdout == "secret-token\n"


async def test_one_connection_serves_many_runs(conn: HostConnection, server: SshServer) -> None:
    for i in range(10):
        assert (await conn.run(f"echo {i}", timeout=5)).stdout == f"{i}\n"
    results = await asyncio.gather(*(conn.run(f"echo {i}", timeout=5) for i in range(20)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]
    assert server.stats.accepted == 1
    assert server.stats.sessions == 30


async def test_concurrent_first_calls_share_one_connect(
    conn: HostConnection, server: SshServer
) -> None:
    await asyncio.gather(*(conn.run("echo hi", timeout=5) for _ in range(8)))
    assert server.stats.accepted == 1


async def test_channel_cap_is_respected(server: SshServer, keys: Keys) -> None:
    capped = HostConnection(host_spec(server.port), ssh_spec(keys, max_channels=3))
    try:
        results = await asyncio.gather(*(capped.run("sleep 0.05", timeout=5) for _ in range(12)))
    finally:
        await capped.close()
    assert all(r.stdout == "slept\n" for r in results)
    assert server.stats.peak == 3


# --- failures of the command ------------------------------------------------------------------


async def test_nonzero_exit_carries_the_result(conn: HostConnection) -> None:
    caught = await failure(conn.run("fail 3 --token=hunter2", timeout=5))
    assert caught.error.kind == "exit_nonzero"
    assert caught.result is not None
    assert caught.result.exit_status == 3
    assert caught.result.stderr == "it went wrong\n"
    assert "fail" in caught.error.detail and "3" in caught.error.detail
    assert "hunter2" not in caught.error.detail


async def test_detail_names_the_program_not_an_env_assignment(conn: HostConnection) -> None:
    caught = await failure(conn.run("API_KEY=hunter2 /usr/bin/missing --x", timeout=5))
    assert caught.error.kind == "exit_nonzero"
    assert "`missing`" in caught.error.detail
    assert "hunter2" not in caught.error.detail


async def test_killed_by_signal_is_exit_nonzero(conn: HostConnection) -> None:
    caught = await failure(conn.run("killed", timeout=5))
    assert caught.error.kind == "exit_nonzero"
    assert "KILL" in caught.error.detail
    assert caught.result is not None and caught.result.exit_status == -1


async def test_local_timeout_closes_the_channel(conn: HostConnection, server: SshServer) -> None:
    started = time.perf_counter()
    caught = await failure(conn.run("sleep 30", timeout=0.2))
    assert caught.error.kind == "timeout"
    assert "`sleep`" in caught.error.detail
    assert time.perf_counter() - started < 1.5
    # The server saw the channel go: an abandoned channel would hold one of its sessions.
    await wait_until(lambda: server.stats.active == 0)
    assert (await conn.run("echo still", timeout=5)).stdout == "still\n"


async def test_channel_closed_without_exit_status_is_conn_lost(
    conn: HostConnection, server: SshServer
) -> None:
    caught = await failure(conn.run("noexit", timeout=5))
    assert caught.error.kind == "conn_lost"
    assert caught.result is None
    # Only the channel went; the connection is still good.
    assert (await conn.run("echo ok", timeout=5)).stdout == "ok\n"
    assert server.stats.accepted == 1


async def test_connection_dropped_mid_command_then_reconnects(
    conn: HostConnection, server: SshServer
) -> None:
    await conn.run("echo warm", timeout=5)
    caught = await failure(conn.run("drop", timeout=5))
    assert caught.error.kind == "conn_lost"
    await wait_until(lambda: not conn.connected)
    assert (await conn.run("echo back", timeout=5)).stdout == "back\n"
    assert server.stats.accepted == 2


# --- failures of the connection, produced for real --------------------------------------------


async def test_closed_port_is_refused(keys: Keys) -> None:
    conn = HostConnection(host_spec(closed_port()), ssh_spec(keys))
    caught = await failure(conn.run("echo hi", timeout=5))
    assert caught.error.kind == "refused"
    assert not conn.connected


async def test_silent_listener_is_timeout(keys: Keys, blackhole: Blackhole) -> None:
    port = await blackhole.start()
    conn = HostConnection(host_spec(port), ssh_spec(keys, connect_timeout=0.3))
    started = time.perf_counter()
    caught = await failure(conn.run("echo hi", timeout=5))
    assert caught.error.kind == "timeout"
    assert "0.3s" in caught.error.detail
    assert time.perf_counter() - started < 1.5
    assert blackhole.accepted == 1


async def test_run_timeout_bounds_a_slow_connect(keys: Keys, blackhole: Blackhole) -> None:
    port = await blackhole.start()
    conn = HostConnection(host_spec(port), ssh_spec(keys, connect_timeout=5))
    started = time.perf_counter()
    caught = await failure(conn.run("echo hi", timeout=0.2))
    assert caught.error.kind == "timeout"
    assert time.perf_counter() - started < 1.0
    await conn.close()


async def test_concurrent_callers_share_a_failing_connect(keys: Keys, blackhole: Blackhole) -> None:
    port = await blackhole.start()
    conn = HostConnection(host_spec(port), ssh_spec(keys, connect_timeout=0.3))
    outcomes = await asyncio.gather(
        *(conn.run("echo hi", timeout=5) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(o, SshFailure) and o.error.kind == "timeout" for o in outcomes)
    assert blackhole.accepted == 1


async def test_rejected_key_is_auth(keys: Keys) -> None:
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    srv = await SshServer(keys, authorized=stranger).start()
    keys.trust(srv.port)
    try:
        conn = HostConnection(host_spec(srv.port), ssh_spec(keys))
        caught = await failure(conn.run("echo hi", timeout=5))
    finally:
        await srv.stop()
    assert caught.error.kind == "auth"


async def test_unknown_host_key_is_host_key(server: SshServer, keys: Keys) -> None:
    keys.trust(server.port, asyncssh.generate_private_key("ssh-ed25519"))
    conn = HostConnection(host_spec(server.port), ssh_spec(keys))
    caught = await failure(conn.run("echo hi", timeout=5))
    assert caught.error.kind == "host_key"
    # Verification failed before authentication, so no session was ever opened.
    assert server.stats.sessions == 0


async def test_empty_known_hosts_is_host_key(server: SshServer, keys: Keys) -> None:
    keys.known_hosts.write_text("")
    conn = HostConnection(host_spec(server.port), ssh_spec(keys))
    assert (await failure(conn.run("echo hi", timeout=5))).error.kind == "host_key"


async def test_missing_key_file_is_auth_naming_the_path(server: SshServer, keys: Keys) -> None:
    missing = keys.client_key.with_name("absent_key")
    conn = HostConnection(host_spec(server.port), ssh_spec(keys, key_file=missing))
    caught = await failure(conn.run("echo hi", timeout=5))
    assert caught.error.kind == "auth"
    assert str(missing) in caught.error.detail
    assert server.stats.accepted == 0


async def test_garbage_key_file_is_auth_without_its_contents(server: SshServer, keys: Keys) -> None:
    keys.client_key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nS3CR3TMATERIAL\n")
    conn = HostConnection(host_spec(server.port), ssh_spec(keys))
    caught = await failure(conn.run("echo hi", timeout=5))
    assert caught.error.kind == "auth"
    assert str(keys.client_key) in caught.error.detail
    assert "S3CR3T" not in caught.error.detail


async def test_missing_known_hosts_is_host_key_naming_the_path(
    server: SshServer, keys: Keys
) -> None:
    missing = keys.known_hosts.with_name("absent_known_hosts")
    conn = HostConnection(host_spec(server.port), ssh_spec(keys, known_hosts_file=missing))
    caught = await failure(conn.run("echo hi", timeout=5))
    assert caught.error.kind == "host_key"
    assert str(missing) in caught.error.detail


# --- reconnect and backoff --------------------------------------------------------------------


async def test_reconnects_after_the_server_restarts(keys: Keys) -> None:
    first = await SshServer(keys).start()
    keys.trust(first.port)
    conn = HostConnection(host_spec(first.port), ssh_spec(keys))
    try:
        assert (await conn.run("echo one", timeout=5)).stdout == "one\n"
        await first.stop()
        await wait_until(lambda: not conn.connected)
        second = await SshServer(keys).start(first.port)
        try:
            assert (await conn.run("echo two", timeout=5)).stdout == "two\n"
            assert second.stats.accepted == 1
        finally:
            await second.stop()
    finally:
        await conn.close()


async def test_backoff_fails_fast_grows_and_resets(server: SshServer, keys: Keys) -> None:
    clock = FakeClock()
    keys.trust(server.port, asyncssh.generate_private_key("ssh-ed25519"))
    conn = HostConnection(
        host_spec(server.port),
        ssh_spec(keys),
        reconnect_initial=1.0,
        reconnect_max=4.0,
        clock=clock,
    )

    async def attempt() -> SshFailure:
        return await failure(conn.run("echo hi", timeout=5))

    assert (await attempt()).error.kind == "host_key"
    assert server.stats.accepted == 1

    started = time.perf_counter()
    fast = await attempt()
    assert time.perf_counter() - started < 0.5
    assert fast.error.kind == "host_key"
    assert "backing off" in fast.error.detail
    assert server.stats.accepted == 1  # no new TCP connect while backing off

    # Delays double from 1 s up to the 4 s cap.
    last_attempt = clock.now
    for delay in (1.0, 2.0, 4.0, 4.0):
        clock.now = last_attempt + delay - 0.01
        assert "backing off" in (await attempt()).error.detail
        accepted = server.stats.accepted
        clock.now = last_attempt + delay + 0.01
        assert "backing off" not in (await attempt()).error.detail
        assert server.stats.accepted == accepted + 1
        last_attempt = clock.now

    # The known_hosts file is re-read on every connect: fixing it heals the host after backoff.
    keys.trust(server.port)
    clock.now += 4.0
    assert (await conn.run("echo healed", timeout=5)).stdout == "healed\n"

    # Success reset the delay: after the next failed connect the wait is 1 s again.
    keys.trust(server.port, asyncssh.generate_private_key("ssh-ed25519"))
    await server.stop()
    await wait_until(lambda: not conn.connected)
    restarted = await SshServer(keys).start(server.port)
    try:
        assert (await attempt()).error.kind == "host_key"
        clock.now += 1.01
        assert "backing off" not in (await attempt()).error.detail
    finally:
        await restarted.stop()
        await conn.close()


class FreezableProxy:
    """A TCP relay to the server that can go silent, as a host does when it hangs or vanishes."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.frozen = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(65536):
            if not self.frozen:
                sink.write(data)
                await sink.drain()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for writer in self._writers:
            writer.close()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


async def test_keepalive_notices_a_silent_host_and_run_reconnects(
    server: SshServer, keys: Keys
) -> None:
    proxy = FreezableProxy(server.port)
    port = await proxy.start()
    keys.trust(port)
    conn = HostConnection(host_spec(port), ssh_spec(keys), keepalive_interval=0.1)
    try:
        await conn.run("echo before", timeout=5)
        proxy.frozen = True
        await wait_until(lambda: not conn.connected)
        proxy.frozen = False
        assert (await conn.run("echo after", timeout=5)).stdout == "after\n"
        assert server.stats.accepted == 2
    finally:
        await conn.close()
        await proxy.stop()


async def test_close_during_connect_is_a_failure_not_a_cancellation(
    keys: Keys, blackhole: Blackhole
) -> None:
    port = await blackhole.start()
    conn = HostConnection(host_spec(port), ssh_spec(keys, connect_timeout=5))
    pending = asyncio.create_task(conn.run("echo hi", timeout=5))
    await wait_until(lambda: blackhole.accepted == 1)
    await conn.close()
    caught = await failure(pending)
    assert caught.error.kind == "conn_lost"


async def test_closed_connection_refuses_work(conn: HostConnection) -> None:
    await conn.run("echo hi", timeout=5)
    await conn.close()
    assert not conn.connected
    assert (await failure(conn.run("echo hi", timeout=5))).error.kind == "conn_lost"


# --- direct-tcpip -----------------------------------------------------------------------------


async def test_direct_channel_reaches_a_loopback_listener(conn: HostConnection) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read())
        await writer.drain()
        writer.close()

    backend = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = backend.sockets[0].getsockname()[1]
    try:
        reader, writer = await conn.open_connection("127.0.0.1", port)
        payload = bytes(range(256)) * 4096  # 1 MiB: more than one SSH window
        writer.write(payload)
        await writer.drain()
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == payload
        writer.close()
        await writer.wait_closed()
    finally:
        backend.close()
        await backend.wait_closed()


async def test_direct_channel_to_a_closed_port_is_refused(conn: HostConnection) -> None:
    caught = await failure(conn.open_connection("127.0.0.1", closed_port()))
    assert caught.error.kind == "refused"
    # A refused channel leaves the connection itself alone.
    assert (await conn.run("echo ok", timeout=5)).stdout == "ok\n"


# --- pool -------------------------------------------------------------------------------------


async def test_pool_memoises_by_address_port_and_user(server: SshServer, keys: Keys) -> None:
    pool = SshPool()
    host = host_spec(server.port)
    first = pool.connection(host, ssh_spec(keys))
    renamed = host.model_copy(update={"name": "spark-2"})
    assert pool.connection(renamed, ssh_spec(keys)) is first
    assert pool.connection(host_spec(server.port + 1), ssh_spec(keys)) is not first
    assert pool.connection(host, ssh_spec(keys, user="other")) is not first
    await first.run("echo hi", timeout=5)
    assert first.connected
    await pool.close()
    assert not first.connected
    assert pool.connection(host, ssh_spec(keys)) is not first


async def test_pool_replaces_a_connection_whose_spec_changed(server: SshServer, keys: Keys) -> None:
    pool = SshPool()
    host = host_spec(server.port)
    first = pool.connection(host, ssh_spec(keys))
    await first.run("echo hi", timeout=5)
    reloaded = ssh_spec(keys).model_copy(update={"command_timeout": 7.0})
    second = pool.connection(host, reloaded)
    assert second is not first
    assert pool.connection(host, reloaded) is second
    await pool.close()
    assert not first.connected


# --- classification of errors loopback cannot produce -----------------------------------------


def _with_cause(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (OSError(errno.EHOSTUNREACH, "Connect call failed"), "unreachable"),
        (OSError(errno.ENETUNREACH, "Connect call failed"), "unreachable"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"), "refused"),
        # Only the errno counts, not the words.
        (OSError(errno.ECONNREFUSED, "No route to host"), "refused"),
        (OSError("Multiple exceptions: [Errno 111] a, [Errno 101] b"), "unreachable"),
        (
            _with_cause(OSError("Multiple exceptions: x"), ConnectionRefusedError(111, "x")),
            "refused",
        ),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "unreachable"),
        (TimeoutError(), "timeout"),
        (OSError(errno.ETIMEDOUT, "Connection timed out"), "timeout"),
        (asyncssh.TimeoutError({}, "cmd", None, None, None, None, "", ""), "timeout"),
        (asyncssh.PermissionDenied("Permission denied"), "auth"),
        (asyncssh.HostKeyNotVerifiable("Host key is not trusted"), "host_key"),
        (asyncssh.ConnectionLost("Server not responding to keepalive"), "conn_lost"),
        (asyncssh.KeyExchangeFailed("no matching kex"), "conn_lost"),
        (asyncssh.ProtocolError("bad packet"), "conn_lost"),
        (BrokenPipeError(errno.EPIPE, "Broken pipe"), "conn_lost"),
        (ConnectionResetError(errno.ECONNRESET, "reset"), "conn_lost"),
        (asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, "Connection refused"), "refused"),
        (
            ExceptionGroup("all", [OSError(errno.ENETUNREACH, "a"), ConnectionRefusedError(111)]),
            "refused",
        ),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else value,
)
def test_classify(exc: BaseException, kind: str) -> None:
    error = classify(exc)
    assert error.kind == kind
    assert error.detail


def test_classify_passes_a_failure_through() -> None:
    failure = SshFailure(classify(OSError(errno.EHOSTUNREACH, "x")))
    assert classify(failure) == failure.error


async def test_endless_output_fails_classified_with_bounded_memory(conn: HostConnection) -> None:
    import resource

    from sparkd.shell.ssh import MAX_OUTPUT

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(SshFailure) as failure:
        await conn.run("endless", timeout=60)
    assert failure.value.error.kind == "exit_nonzero"
    assert "printed more than" in failure.value.error.detail
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    # The cap is 8 MiB of text; reading it costs a few copies of it, never the host's whim.
    assert grown_kib < 64 * 1024, f"peak RSS grew {grown_kib} KiB"
    assert MAX_OUTPUT <= 8 * 1024 * 1024
    assert (await conn.run("echo still here", timeout=5)).stdout == "still here\n"

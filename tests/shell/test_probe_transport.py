"""A probe whose SSH connection breaks under it learns nothing of the model; one whose model
closes its socket does. Over real asyncssh: an SSH channel carries no reset from its far side
(a direct-tcpip channel ends in EOF, RFC 4254 section 5.3), so a reset the probe reads is the
ops box's own transport failing, handed by asyncssh to every channel of the connection."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator

import pytest

from sparkd.core import policy
from sparkd.core.reading.classify import EngineLoad
from sparkd.model.probe import ProbeResult
from sparkd.shell import model_http
from sparkd.shell.observe import channel
from sparkd.shell.ssh import HostConnection
from tests.shell.conftest import Keys, SshServer, host_spec, ssh_spec, wait_until
from tests.toy import reference_cluster


class SilentModel:
    """A TCP listener that reads the probe's request and never answers, until told to close
    its side (as a crashing API server does)."""

    def __init__(self) -> None:
        self.requests = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._writers.append(writer)
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1

        self._server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def close_connections(self) -> None:
        for writer in self._writers:
            writer.close()

    async def stop(self) -> None:
        self.close_connections()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


@pytest.fixture
async def model() -> AsyncIterator[SilentModel]:
    silent = SilentModel()
    yield silent
    await silent.stop()


async def probing(
    server: SshServer, keys: Keys, model: SilentModel
) -> tuple[HostConnection, asyncio.Task[ProbeResult]]:
    port = await model.start()
    cluster = reference_cluster()
    cluster = cluster.model_copy(
        update={
            "model": cluster.model.model_copy(update={"port": port}),
            "probe": cluster.probe.model_copy(update={"timeout": 30.0}),
        }
    )
    conn = HostConnection(host_spec(server.port), ssh_spec(keys))
    # The cycle read /metrics already: the probe's completion is the one request.
    load = EngineLoad(running=0.0, waiting=0.0, generation_tokens=1.0)
    task = asyncio.create_task(
        model_http.probe(channel(conn, "127.0.0.1", port), cluster, None, load_before=load)
    )
    await wait_until(lambda: model.requests == 1, 5.0)
    return conn, task


async def test_a_reset_ssh_connection_is_not_a_failed_probe(
    server: SshServer, keys: Keys, model: SilentModel
) -> None:
    conn, task = await probing(server, keys, model)
    try:
        # The ops box's TCP connection to sshd reset (a firewall or NAT losing its state): the
        # server's side of it closes with a reset (SO_LINGER 0).
        (ssh,) = server.stats.connections
        sock = ssh.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        ssh.abort()
        result = await asyncio.wait_for(task, 10)
    finally:
        await conn.close()
    assert result.verdict.outcome == "not_run", result.verdict
    assert not policy.counts_as_failure(result)


async def test_a_model_closing_its_socket_is_a_failed_probe(
    server: SshServer, keys: Keys, model: SilentModel
) -> None:
    conn, task = await probing(server, keys, model)
    try:
        model.close_connections()  # the API server went away mid-request
        result = await asyncio.wait_for(task, 10)
    finally:
        await conn.close()
    assert result.verdict.outcome != "not_run", result.verdict
    assert policy.counts_as_failure(result), result.verdict

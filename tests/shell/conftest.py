"""Loopback SSH servers for the transport tests: real asyncssh servers, real keys, real sockets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
import pytest

from sparkd.model.spec import HostSpec, SshSpec

USER = "sparkd"


@dataclass
class Keys:
    client_key: Path
    known_hosts: Path
    client: asyncssh.SSHKey
    host: asyncssh.SSHKey

    def trust(self, port: int, key: asyncssh.SSHKey | None = None) -> None:
        """Write known_hosts so it holds `key` (default: the server's real key) for the port."""
        public = (key or self.host).export_public_key().decode().strip()
        self.known_hosts.write_text(f"[127.0.0.1]:{port} {public}\n")


@dataclass
class Stats:
    accepted: int = 0
    sessions: int = 0
    active: int = 0
    peak: int = 0
    connections: list[asyncssh.SSHServerConnection] = field(default_factory=list)


class _Server(asyncssh.SSHServer):
    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.stats.accepted += 1
        self.stats.connections.append(conn)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> bool:
        # Forward for real, and only ever to loopback.
        return dest_host == "127.0.0.1"


async def _handle(process: asyncssh.SSHServerProcess[str], stats: Stats) -> None:
    """A tiny remote shell: the first word picks a behaviour the tests need."""
    stats.sessions += 1
    stats.active += 1
    stats.peak = max(stats.peak, stats.active)
    try:
        words = (process.command or "").split()
        verb, args = (words[0], words[1:]) if words else ("", [])
        if verb == "echo":
            process.stdout.write(" ".join(args) + "\n")
            process.exit(0)
        elif verb == "cat":
            process.stdout.write(await process.stdin.read())
            process.exit(0)
        elif verb == "fail":
            process.stderr.write("it went wrong\n")
            process.exit(int(args[0]))
        elif verb == "sleep":  # ends early if the client closes the channel
            try:
                await asyncio.wait_for(process.channel.wait_closed(), float(args[0]))
            except TimeoutError:
                process.stdout.write("slept\n")
                process.exit(0)
        elif verb == "drop":  # the whole connection dies mid-command
            process.channel.get_connection().abort()
        elif verb == "noexit":  # the channel closes without an exit status
            process.stdout.write("partial\n")
            process.close()
        elif verb == "endless":  # a hostile host: output until the client gives up
            line = "x" * 1023 + "\n"
            try:
                for _ in range(100_000):  # 6 GiB: far past any bound, never reached
                    process.stdout.write(line * 64)
                    await process.stdout.drain()
            except (OSError, asyncssh.Error):
                pass  # the client closed the channel
        elif verb == "killed":
            process.exit_with_signal("KILL")
        else:
            process.stderr.write(f"{verb}: command not found\n")
            process.exit(127)
    finally:
        stats.active -= 1


class SshServer:
    """An asyncssh server on 127.0.0.1 that accepts only the test client key."""

    def __init__(self, keys: Keys, authorized: asyncssh.SSHKey | None = None) -> None:
        self.keys = keys
        self.authorized = authorized or keys.client
        self.stats = Stats()
        self.port = 0
        self._acceptor: asyncssh.SSHAcceptor | None = None

    async def start(self, port: int = 0) -> SshServer:
        public = self.authorized.export_public_key().decode()
        self._acceptor = await asyncssh.create_server(
            lambda: _Server(self.stats),
            "127.0.0.1",
            port,
            server_host_keys=[self.keys.host],
            authorized_client_keys=asyncssh.import_authorized_keys(public),
            process_factory=lambda p: _handle(p, self.stats),
            encoding="utf-8",
        )
        self.port = self._acceptor.get_port()
        return self

    async def stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
            self._acceptor = None
        for conn in self.stats.connections:
            conn.abort()
        self.stats.connections.clear()


@pytest.fixture(scope="session")
def key_pair() -> tuple[asyncssh.SSHKey, asyncssh.SSHKey]:
    return asyncssh.generate_private_key("ssh-ed25519"), asyncssh.generate_private_key(
        "ssh-ed25519"
    )


@pytest.fixture
def keys(tmp_path: Path, key_pair: tuple[asyncssh.SSHKey, asyncssh.SSHKey]) -> Keys:
    client, host = key_pair
    client_key = tmp_path / "id_ed25519"
    client.write_private_key(client_key)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    return Keys(client_key=client_key, known_hosts=known_hosts, client=client, host=host)


@pytest.fixture
async def server(keys: Keys) -> AsyncIterator[SshServer]:
    srv = await SshServer(keys).start()
    keys.trust(srv.port)
    yield srv
    await srv.stop()


def host_spec(port: int) -> HostSpec:
    # data_ip is never dialled: the transport only ever uses `address`.
    return HostSpec(
        name="spark-1",
        address="127.0.0.1",
        port=port,
        role="head",
        data_ip="10.99.0.1",
        interface="enp1s0f0np0",
    )


def ssh_spec(keys: Keys, **overrides: object) -> SshSpec:
    values: dict[str, object] = {
        "user": USER,
        "key_file": keys.client_key,
        "known_hosts_file": keys.known_hosts,
        "connect_timeout": 2.0,
    }
    values.update(overrides)
    return SshSpec.model_validate(values)


def closed_port() -> int:
    """A loopback port with nothing listening (bound, read, released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def wait_until(predicate: Callable[[], bool], deadline: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not predicate():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)

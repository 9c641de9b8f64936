"""A real etcd on a private loopback address, for the tier that checks sparkd's HA against it.

Skipped with a message where etcd is missing, except under CI=true, where it must be there
(.ci/run installs Debian's etcd-server). Each server binds its own 127.x.y.z address (never the
default ports, in case a packaged etcd runs) and keeps its data in the test's tmp dir.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from sparkd.ha.etcd import EtcdClient
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.ha import Instance

ETCD = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)


def require_etcd() -> str:
    if ETCD is None:
        if os.environ.get("CI") == "true":
            pytest.fail("etcd is missing: .ci/run must install etcd-server")
        pytest.skip("no etcd on this machine (apt-get install etcd-server)")
    return ETCD


def private_address() -> str:
    """A loopback address of this test's own, so a leftover server never answers for it."""
    return f"127.{random.randint(64, 250)}.{random.randint(1, 250)}.{random.randint(2, 250)}"


def free_port(address: str) -> int:
    return free_ports(address, 1)[0]


def free_ports(address: str, count: int) -> list[int]:
    """`count` distinct free ports on `address`: each socket stays bound until all are chosen,
    or the kernel may hand the same port out twice (one member's peer port was another's)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((address, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


class EtcdServer:
    """One single-member etcd process; start, kill, stop (SIGSTOP) and continue it by PID."""

    def __init__(
        self,
        binary: str,
        data_dir: Path,
        address: str | None = None,
        ports: tuple[int, int] | None = None,
    ) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.address = address or private_address()
        self.client_port, self.peer_port = ports or tuple(free_ports(self.address, 2))
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.client_port}"

    def launch(self, name: str, initial_cluster: str, token: str = "etcd-cluster") -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        peer = f"http://{self.address}:{self.peer_port}"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary, "--name", name, "--data-dir", str(self.data_dir),
                    "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", initial_cluster, "--initial-cluster-state", "new",
                    "--initial-cluster-token", token, "--logger", "zap", "--log-level", "warn",
                    *self.extra,
                ],
                stdout=log,
                stderr=log,
            )  # fmt: skip

    def start(self, within: float = 20.0) -> None:
        self.launch("s1", f"s1=http://{self.address}:{self.peer_port}")
        until_healthy([self], within)

    def check_running(self) -> None:
        """Raise, with the log's tail, if the launched process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"etcd exited: {self.log_path.read_text()[-2000:]}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as answer:
                return b'"true"' in answer.read()
        except OSError:
            return False

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


def until_healthy(members: list[EtcdServer], within: float) -> None:
    """Wait until every member answers healthy; fail at once if one has exited."""
    deadline = time.monotonic() + within
    while not all(m.healthy() for m in members):
        for member in members:
            member.check_running()
        if time.monotonic() > deadline:
            raise RuntimeError(f"etcd not healthy within {within}s")
        time.sleep(0.05)


class Startable(Protocol):
    def start(self) -> None: ...

    def kill(self) -> None: ...


S = TypeVar("S", bound=Startable)


@contextmanager
def running(server: S) -> Iterator[S]:
    """The server started, and killed when the test is done with it (or when it did not start:
    a cluster's members that did keep running otherwise)."""
    try:
        server.start()
        yield server
    finally:
        server.kill()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    with running(EtcdServer(require_etcd(), tmp_path / "etcd")) as server:
        yield server


@pytest.fixture
async def admin(etcd: EtcdServer) -> AsyncIterator[EtcdClient]:
    """A client of the test's etcd, for what a test reads or writes there behind sparkd."""
    client = EtcdClient([etcd.url], timeout=2)
    yield client
    await client.close()


async def lease_remaining(admin: EtcdClient, lease: int) -> int:
    """What etcd says is left of a lease: -1 once it is gone (revoked or expired)."""
    answer = await admin.call("lease/timetolive", {"ID": str(lease)})
    return int(answer.get("TTL", -1))


class Blackhole:
    """A TCP proxy in front of etcd on a loopback address of its own; `cut()` stops every byte
    both ways without closing anything (a partition, not a refusal), `heal()` lets them pass."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.address = private_address()
        self.port = 0
        self.open = True
        self._server: Any = None
        self._writers: list[Any] = []

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, self.address, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _client(self, reader: Any, writer: Any) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_writer]
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )

    async def _pump(self, reader: Any, writer: Any) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if self.open:  # cut: swallowed, as a partitioned network would
                writer.write(data)
                await writer.drain()
        writer.close()

    def cut(self) -> None:
        self.open = False

    def heal(self) -> None:
        self.open = True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()


class EtcdCluster:
    """Three members on one private loopback address (each its own ports and data dir)."""

    def __init__(self, binary: str, base: Path, size: int = 3) -> None:
        self.address = private_address()
        ports = free_ports(self.address, 2 * size)
        self.members = [
            EtcdServer(binary, base / f"m{i}", self.address, (ports[2 * i], ports[2 * i + 1]))
            for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    @property
    def initial(self) -> str:
        return ",".join(
            f"m{i}=http://{self.address}:{m.peer_port}" for i, m in enumerate(self.members)
        )

    def start(self, within: float = 30.0) -> None:
        for index, member in enumerate(self.members):
            member.launch(f"m{index}", self.initial, "sparkd-test")
        until_healthy(self.members, within)

    def restart(self, member: EtcdServer, within: float = 30.0) -> None:
        """A killed member started again on its data dir: it rejoins the others."""
        member.launch(f"m{self.members.index(member)}", self.initial, "sparkd-test")
        until_healthy([member], within)

    def kill(self) -> None:
        for member in self.members:
            member.kill()


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EtcdCluster]:
    with running(EtcdCluster(require_etcd(), tmp_path / "etcd3")) as cluster:
        yield cluster


@pytest.fixture
async def seed_world(tmp_path: Path) -> AsyncIterator[World]:
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as w:
        yield w


@pytest.fixture
async def pair(
    seed_world: World, etcd: EtcdServer, tmp_path: Path
) -> AsyncIterator[tuple[Instance, Instance]]:
    a = Instance("ops-a", seed_world, etcd, tmp_path)
    b = Instance("ops-b", seed_world, etcd, tmp_path)
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()

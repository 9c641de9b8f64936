"""A hostile host: an SSH server that replays a real fact-script output from the simulated world,
mutated (endless, garbage, wrong types, huge numbers, cut short). Every observation of it is a
snapshot of classified values, and the daemon's memory stays bounded."""

from __future__ import annotations

import asyncio
import random
import resource
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncssh
import pytest

from sparkd.core.deciding.planner import plan
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.shell import catalogue
from sparkd.shell.observe import observe, tool_timeout
from sparkd.shell.ssh import SshPool
from tests.support.live import Live

# Peak RSS may grow by at most this much over all the hostile observations (the output cap is
# 8 MiB of text; reading it costs a few copies, never what the host chooses).
RSS_BOUND_KIB = 96 * 1024

Mutation = Callable[[str, random.Random], str]


def garbage(text: str, rng: random.Random) -> str:
    raw = bytearray(text.encode())
    for _ in range(len(raw) // 20 + 1):
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    return raw.decode("utf-8", "replace")


def wrong_types(text: str, rng: random.Random) -> str:
    return (
        text.replace('"Names":"', '"Names":5,"x":"')
        .replace('"node_id": "', '"node_id": 7, "y": "')
        .replace('"GPU": 1.0', '"GPU": "NaN"')
    )


def huge_numbers(text: str, rng: random.Random) -> str:
    return text.replace(" 0\n", " " + "9" * 5000 + "\n").replace("1.0", "1" * 4000 + "²")


def cut_short(text: str, rng: random.Random) -> str:
    return text[: rng.randrange(len(text))]


def shuffled_lines(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    rng.shuffle(lines)
    return "\n".join(lines)


MUTATIONS: dict[str, Mutation] = {
    "garbage": garbage,
    "wrong_types": wrong_types,
    "huge_numbers": huge_numbers,
    "cut_short": cut_short,
    "shuffled_lines": shuffled_lines,
}


class HostileHost:
    """Answers every command with `reply()`; `endless` prints until the client gives up."""

    def __init__(self, host_key: asyncssh.SSHKey, client: asyncssh.SSHKey) -> None:
        self.host_key = host_key
        self.client = client
        self.reply: Callable[[], str] = lambda: ""
        self.endless = False
        self.port = 0
        self._acceptor: asyncssh.SSHAcceptor | None = None

    async def start(self) -> None:
        public = self.client.export_public_key().decode()
        self._acceptor = await asyncssh.create_server(
            asyncssh.SSHServer,
            "127.0.0.1",
            0,
            server_host_keys=[self.host_key],
            authorized_client_keys=asyncssh.import_authorized_keys(public),
            process_factory=self._answer,
            encoding="utf-8",
        )
        self.port = self._acceptor.get_port()

    async def _answer(self, process: asyncssh.SSHServerProcess[str]) -> None:
        try:
            if self.endless:
                chunk = self.reply()[:65536] or "x" * 65536
                for _ in range(10_000):
                    process.stdout.write(chunk)
                    await process.stdout.drain()
            else:
                process.stdout.write(self.reply())
            process.exit(0)
        except (OSError, asyncssh.Error):
            pass  # the client hung up: exactly what a bounded reader does

    async def stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()


@pytest.fixture
async def hostile(tmp_path: Path, healthy: Live) -> AsyncIterator[tuple[HostileHost, ClusterSpec]]:
    client = asyncssh.generate_private_key("ssh-ed25519")
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "hostile_key"
    client.write_private_key(key_file)
    server = HostileHost(host_key, client)
    await server.start()
    known = tmp_path / "hostile_known_hosts"
    public = host_key.export_public_key().decode().strip()
    known.write_text(f"[127.0.0.1]:{server.port} {public}\n")
    cluster = healthy.cluster
    hosts = tuple(
        h.model_copy(update={"address": "127.0.0.1", "port": server.port}) for h in cluster.hosts
    )
    ssh = cluster.ssh.model_copy(
        update={"key_file": key_file, "known_hosts_file": known, "command_timeout": 3.0}
    )
    try:
        yield server, cluster.model_copy(update={"hosts": hosts, "ssh": ssh})
    finally:
        await server.stop()


async def real_output(live: Live, pool: SshPool) -> str:
    cluster = live.cluster
    script = catalogue.reads.fact_script(cluster, cluster.head, tool_timeout(cluster))
    result = await pool.connection(cluster.head, cluster.ssh).run(script.command, timeout=10)
    assert "@@sparkd containers" in result.stdout and "@@sparkd ray_nodes" in result.stdout
    return result.stdout


async def test_mutated_real_output_is_classified_and_memory_stays_bounded(
    healthy: Live, pool: SshPool, hostile: tuple[HostileHost, ClusterSpec]
) -> None:
    server, cluster = hostile
    text = await real_output(healthy, pool)
    rng = random.Random(8)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hostile_pool = SshPool(reconnect_initial=0.01, reconnect_max=0.05)
    try:
        for name, mutate in MUTATIONS.items():
            for _ in range(4):
                mutated = mutate(text, rng)
                server.reply = lambda mutated=mutated: mutated
                observed = await observe(cluster, hostile_pool)
                plan(cluster, observed, Memory(), observed.observed_at)
                for host in observed.hosts:
                    assert host.reachable or host.error is not None, name
        server.endless = True
        server.reply = lambda: text
        observed = await observe(cluster, hostile_pool)
        for host in observed.hosts:
            assert host.error is not None and host.error.kind == "exit_nonzero"
            assert "printed more than" in host.error.detail
        result = plan(cluster, observed, Memory(), observed.observed_at)
        assert result.actions == ()  # nothing is done on hosts that cannot be read
    finally:
        await hostile_pool.close()
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(f"\npeak RSS grew {grown} KiB over the hostile observations (bound {RSS_BOUND_KIB})")
    assert grown < RSS_BOUND_KIB
    await asyncio.sleep(0)

"""sparkd's SSH transport, fact script and model channel against a real OpenSSH sshd."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from sparkd.core.reading import parsers
from sparkd.model.cluster import ClusterSpec
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue, model_http
from sparkd.shell.observe import opener, read_host
from sparkd.shell.ssh import HostConnection, SshFailure
from sparkd_sim.vllm_server import ModelBehaviour, SimVllmServer
from tests.support.sshd import RealSshd, cluster_behind, running_sshd

pytestmark = pytest.mark.sshd


def specs(sshd: RealSshd, **ssh: object) -> tuple[ClusterSpec, HostSpec]:
    cluster = cluster_behind(sshd, ssh, model={"port": 1})
    return cluster, cluster.head


async def test_commands_exit_codes_and_timeout(sshd: RealSshd) -> None:
    cluster, host = specs(sshd)
    conn = HostConnection(host, cluster.ssh)
    try:
        result = await conn.run("echo ready", timeout=10)
        assert result.stdout == "ready\n"
        # The connection is reused: sshd sees the second command come from the same client
        # port (`SSH_CONNECTION`: client address and port, server address and port).
        first = await conn.run('echo "$SSH_CONNECTION"', timeout=10)
        again = await conn.run('echo "$SSH_CONNECTION"', timeout=10)
        assert len(first.stdout.split()) == 4 and again.stdout == first.stdout
        with pytest.raises(SshFailure) as info:
            await conn.run("echo out; echo err >&2; exit 3", timeout=10)
        assert info.value.kind == "exit_nonzero"
        assert info.value.result is not None and info.value.result.exit_status == 3
        assert info.value.result.stderr == "err\n"
        started = time.perf_counter()
        with pytest.raises(SshFailure) as info:
            await conn.run(" ".join(catalogue.remote.timed(["sleep", "30"], 1)), timeout=10)
        assert info.value.result is not None and info.value.result.exit_status == 124
        assert time.perf_counter() - started < 5
        with pytest.raises(SshFailure) as info:
            await conn.run("sleep 30", timeout=0.5)
        assert info.value.kind == "timeout"
    finally:
        await conn.close()


async def test_host_key_and_auth_failures(sshd: RealSshd, tmp_path: object) -> None:
    cluster, host = specs(sshd, key_file=sshd.other_key_file)
    conn = HostConnection(host, cluster.ssh)
    with pytest.raises(SshFailure) as info:
        await conn.run("true", timeout=10)
    assert info.value.kind == "auth"
    await conn.close()
    wrong = sshd.known_hosts.with_name("wrong_known_hosts")
    line = sshd.known_hosts.read_text().split()
    import asyncssh

    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    wrong.write_text(f"{line[0]} {other[0]} {other[1]}\n")
    cluster, host = specs(sshd, known_hosts_file=wrong)
    conn = HostConnection(host, cluster.ssh)
    with pytest.raises(SshFailure) as info:
        await conn.run("true", timeout=10)
    assert info.value.kind == "host_key"
    await conn.close()


async def test_direct_tcpip_probe_and_refusal(sshd: RealSshd) -> None:
    server = SimVllmServer("/models/Qwen3.5-122B-A10B-FP8", ModelBehaviour())
    port = await server.start()
    cluster, host = specs(sshd)
    cluster = cluster.model_copy(
        update={
            "model": cluster.model.model_copy(update={"port": port, "tunnel_host": "127.0.0.1"})
        }
    )
    conn = HostConnection(host, cluster.ssh)
    try:
        result = await model_http.probe(opener(conn, cluster), cluster, None)
        assert result.verdict.outcome == "reasoning_only"
        assert result.verdict.completion_tokens == 50
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            closed = sock.getsockname()[1]
        closed_cluster = cluster.model_copy(
            update={"model": cluster.model.model_copy(update={"port": closed})}
        )
        refused = await model_http.probe(opener(conn, closed_cluster), closed_cluster, None)
        assert refused.verdict.outcome == "refused"
        endpoint, _ = await model_http.read_endpoint(
            opener(conn, closed_cluster), closed_cluster, None, 5
        )
        assert endpoint.status == "refused"
        assert (await conn.run("echo still-usable", timeout=10)).stdout == "still-usable\n"
    finally:
        await conn.close()
        await server.stop()


def this_boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as handle:
        return handle.read().strip()


async def test_fact_script_on_a_host_without_docker_is_an_error(sshd: RealSshd) -> None:
    """This machine runs no Docker engine and has no GPU: sparkd must say so, not see an empty
    host."""
    cluster, host = specs(sshd)
    conn = HostConnection(host, cluster.ssh)
    try:
        reading = await read_host(cluster, host, conn, time.time(), ())
        result = await conn.run(
            catalogue.reads.fact_script(cluster, host, 5).command + "exit 0\n", timeout=30
        )
    finally:
        await conn.close()
    sections = parsers.parse_sections(result.stdout)
    assert sections["boot_id"].ok
    assert sections["boot_id"].body.strip() == this_boot_id()
    assert not sections["containers"].ok
    if reading.facts.error is None:
        # A docker CLI without its daemon (.ci/run installs docker.io for the real-Docker tier
        # and keeps its service off): the host answers, Docker does not.
        assert reading.facts.docker_error is not None
        assert "Cannot connect to the Docker daemon" in reading.facts.docker_error
    else:
        # No docker CLI at all.
        assert reading.facts.error.kind == "exit_nonzero"
        detail = reading.facts.error.detail
        assert "containers" in detail or "running" in detail


async def test_aes_gcm_is_negotiated_and_an_sshd_without_it_still_serves(
    sshd: RealSshd, tmp_path: Path
) -> None:
    cluster, host = specs(sshd)
    conn = HostConnection(host, cluster.ssh)
    try:
        assert (await conn.run("echo ok", timeout=10)).stdout == "ok\n"
        raw = conn._conn
        assert raw is not None and raw.get_extra_info("send_cipher") == "aes128-gcm@openssh.com"
    finally:
        await conn.close()
    (tmp_path / "chacha").mkdir()
    with running_sshd(tmp_path / "chacha", "Ciphers chacha20-poly1305@openssh.com\n") as only:
        cluster, host = specs(only)
        conn = HostConnection(host, cluster.ssh)
        try:
            assert (await conn.run("echo ok", timeout=10)).stdout == "ok\n"
            raw = conn._conn
            assert raw is not None
            assert raw.get_extra_info("send_cipher") == "chacha20-poly1305@openssh.com"
        finally:
            await conn.close()

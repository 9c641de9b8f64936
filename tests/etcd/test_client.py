"""The gateway client against a real etcd: leases, the create-if-absent txn, rotation, watch."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from sparkd.ha.etcd import EtcdClient, EtcdError, EtcdUnavailable
from tests.etcd.conftest import EtcdServer, free_port, private_address

pytestmark = pytest.mark.etcd


async def test_lease_and_create_if_absent(admin: EtcdClient) -> None:
    lease, ttl = await admin.grant(3)
    assert ttl >= 3
    first = await admin.create("t/owner/c1", b"a", lease)
    assert first.created
    held, _ = await admin.get("t/owner/c1")
    assert held is not None
    assert (held.value, held.lease, held.create_revision) == (b"a", lease, first.revision)
    other, _ = await admin.grant(3)
    second = await admin.create("t/owner/c1", b"b", other)
    assert not second.created
    assert second.holder is not None and second.holder.lease == lease
    assert await admin.keepalive(lease) >= 3
    await admin.revoke(lease)
    # A revoked lease takes its keys with it; its keepalive says TTL 0 (the field absent).
    assert (await admin.get("t/owner/c1"))[0] is None
    assert await admin.keepalive(lease) == 0
    third = await admin.create("t/owner/c1", b"b", other)
    assert third.created and third.revision > first.revision
    assert not await admin.delete_if("t/owner/c1", first.revision)
    assert await admin.delete_if("t/owner/c1", third.revision)


async def test_an_unanswered_lease_expires(admin: EtcdClient) -> None:
    lease, ttl = await admin.grant(2)
    assert (await admin.create("t/owner/c1", b"a", lease)).created
    await asyncio.sleep(ttl + 1.0)  # etcd's lessor checks expiry every 500 ms
    assert (await admin.get("t/owner/c1"))[0] is None
    assert await admin.keepalive(lease) == 0


async def assert_answered_by(client: EtcdClient, url: str) -> None:
    """A lease granted through the client, by the endpoint `url`; the client closed after."""
    try:
        lease, _ = await client.grant(3)
        assert lease > 0
        assert client.endpoint == url
    finally:
        await client.close()


async def test_rotates_past_a_refused_endpoint(etcd: EtcdServer) -> None:
    dead = private_address()
    await assert_answered_by(
        EtcdClient([f"http://{dead}:{free_port(dead)}", etcd.url], timeout=2), etcd.url
    )


async def test_rotates_past_a_hung_endpoint(etcd: EtcdServer, tmp_path: Path) -> None:
    """A stopped member accepts connections and answers nothing: only a timeout shows it."""
    hung = EtcdServer(etcd.binary, tmp_path / "hung")
    hung.start()
    hung.signal(signal.SIGSTOP)
    try:
        await assert_answered_by(EtcdClient([hung.url, etcd.url], timeout=0.5), etcd.url)
    finally:
        hung.kill()


async def test_unavailable_when_every_endpoint_fails(etcd: EtcdServer) -> None:
    client = EtcdClient([etcd.url], timeout=0.5)
    etcd.kill()
    try:
        with pytest.raises(EtcdUnavailable):
            await client.grant(3)
    finally:
        await client.close()


async def test_watch_sees_the_delete(admin: EtcdClient) -> None:
    lease, _ = await admin.grant(3)
    assert (await admin.create("t/owner/c1", b"a", lease)).created
    _, revision = await admin.get("t/owner/c1")

    async def first_delete() -> str:
        async for key in admin.watch_deletes("t/owner/", revision + 1):
            return key
        raise AssertionError("the watch ended without an event")

    watching = asyncio.create_task(first_delete())
    await asyncio.sleep(0.2)
    await admin.revoke(lease)
    assert await asyncio.wait_for(watching, 5) == "t/owner/c1"


async def test_rotates_past_an_endpoint_that_cuts_its_reply(etcd: EtcdServer) -> None:
    """A reply cut off mid-body (a proxy dying, a member killed while answering)."""

    async def half_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        writer.close()

    address = private_address()
    server = await asyncio.start_server(half_answer, address, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await assert_answered_by(
            EtcdClient([f"http://{address}:{port}", etcd.url], timeout=2), etcd.url
        )
    finally:
        server.close()
        await server.wait_closed()


def etcdctl(url: str, *args: str) -> None:
    import shutil
    import subprocess

    binary = shutil.which("etcdctl")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("etcdctl is missing: .ci/run must install etcd-client")
        pytest.skip("no etcdctl (apt-get install etcd-client)")
    subprocess.run(
        [binary, "--endpoints", url, *args],
        check=True, capture_output=True, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


# Until a simple token idle since the last answer is surely gone: etcd sweeps tokens once a
# second (simpleTokenTTLResolution: etcd 3.4 auth/simple_token.go, 3.5 server/auth/...), so
# one lives up to TTL + 1 s; the rest is for that sweep's goroutine on a loaded box.
TOKEN_GONE = 1 + 1 + 1.5


async def test_user_and_password_and_an_expired_token(tmp_path: Path) -> None:
    from tests.etcd.conftest import EtcdServer, require_etcd

    server = EtcdServer(require_etcd(), tmp_path / "auth")
    server.extra = ["--auth-token", "simple", "--auth-token-ttl", "1"]
    server.start()
    try:
        etcdctl(server.url, "user", "add", "root:s3cret-root")
        etcdctl(server.url, "user", "grant-role", "root", "root")
        etcdctl(server.url, "auth", "enable")
        anonymous = EtcdClient([server.url], timeout=2)
        with pytest.raises(EtcdError):
            await anonymous.get("t/owner/c1")
        await anonymous.close()
        password = tmp_path / "password"
        password.write_text("s3cret-root\n")
        client = EtcdClient([server.url], timeout=2, user="root", password_file=password)
        try:
            lease, _ = await client.grant(30)
            assert (await client.create("t/owner/c1", b"a", lease)).created
            token = client._token
            await asyncio.sleep(TOKEN_GONE)  # the simple token's TTL is 1 s
            kv, _ = await client.get("t/owner/c1")  # refreshed on "invalid auth token"
            assert kv is not None and kv.lease == lease
            assert client._token is not None and client._token != token
            # Requests that meet the same expired token share one login: etcd checks each
            # password with bcrypt, and concurrent logins on a loaded etcd each outlived the
            # request timeout, so that no request got through at all.
            logins = 0
            authenticate = client._authenticate

            async def counted(endpoint: str) -> str:
                nonlocal logins
                logins += 1
                return await authenticate(endpoint)

            client._authenticate = counted  # type: ignore[method-assign]
            await asyncio.sleep(TOKEN_GONE)
            answers = await asyncio.gather(*(client.get("t/owner/c1") for _ in range(6)))
            assert all(kv is not None and kv.lease == lease for kv, _ in answers)
            assert logins == 1
        finally:
            await client.close()
    finally:
        server.kill()

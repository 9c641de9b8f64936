"""A small etcd v3 client over etcd's gRPC-JSON gateway (`/v3/...`), on aiohttp.

Only what ownership needs: leases (grant, keepalive, revoke), range, a create-if-absent
transaction, and a watch for deletions. The gateway's JSON follows proto3: keys and values are
base64, int64 fields are strings, and default values are left out (a failed txn has no
`succeeded`, an expired lease's keepalive no `TTL`, a PUT event no `type`).

Each request goes to the current endpoint; a refused connection, a reset or a timeout moves to
the next one and tries again, once around the list, within the request timeout each.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import structlog


class EtcdUnavailable(Exception):
    """No endpoint answered in time: the outcome of a write is unknown."""


# No answer sparkd asks for comes near this (a range of the prefix's records, a transaction's
# answer, one watch message); an endpoint sending more is broken or not etcd (with `http://`,
# anyone on the path), and reading on would only grow the daemon toward its memory limit.
MAX_ANSWER = 4 << 20
READ_CHUNK = 65536
# A login may take this long even with a shorter `request_timeout`: etcd checks the password
# with bcrypt (server/auth/store.go, `bcrypt.CompareHashAndPassword`, etcd 3.5), CPU by design:
# 0.30-0.39 s on a loaded two-core box, where a 0.5 s timeout left a standby with no round at
# all. A login mostly follows an answer ("invalid auth token") from the same endpoint, so the
# endpoint is known to be up; a dead one is still found out by the request before it.
LOGIN_TIMEOUT = 2.0


class AnswerTooLarge(aiohttp.ClientPayloadError):
    """An answer or watch message over MAX_ANSWER bytes: cut off as a reset would cut it (the
    outcome of a write is unknown), so the next endpoint is tried as after a reset."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} over {MAX_ANSWER} bytes")


class EtcdError(Exception):
    """etcd answered with an error (the request was refused, not lost)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"etcd {status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class Acquired:
    """A create-if-absent txn's answer: `created`, or the key as somebody else holds it."""

    created: bool
    revision: int
    holder: KeyValue | None


def b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with `prefix` (its last byte plus one)."""
    raw = prefix.encode()
    return b64(raw[:-1] + bytes([raw[-1] + 1]))


async def _read_capped(response: aiohttp.ClientResponse) -> str:
    """The whole body, at most MAX_ANSWER bytes of it (AnswerTooLarge past that)."""
    if response.content_length is not None and response.content_length > MAX_ANSWER:
        raise AnswerTooLarge("answer")
    parts: list[bytes] = []
    total = 0
    async for chunk in response.content.iter_chunked(READ_CHUNK):
        total += len(chunk)
        if total > MAX_ANSWER:
            raise AnswerTooLarge("answer")
        parts.append(chunk)
    return b"".join(parts).decode("utf-8", "replace")


async def _messages(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The watch stream's messages (one JSON document a line), each at most MAX_ANSWER bytes:
    read as it comes, so a line that never ends is refused at the cap, not gathered whole."""
    parts: list[bytes] = []
    size = 0
    async for chunk in stream.iter_any():
        start = 0
        while (cut := chunk.find(b"\n", start)) >= 0:
            parts.append(chunk[start:cut])
            size += cut - start
            if size > MAX_ANSWER:
                raise AnswerTooLarge("watch message")
            line = b"".join(parts)
            parts, size, start = [], 0, cut + 1
            if line.strip():
                yield line
        parts.append(chunk[start:])
        size += len(chunk) - start
        if size > MAX_ANSWER:
            raise AnswerTooLarge("watch message")
    line = b"".join(parts)
    if line.strip():
        yield line


def _kv(doc: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(doc.get("key", "")).decode(errors="replace"),
        value=base64.b64decode(doc.get("value", "")),
        create_revision=int(doc.get("create_revision", 0)),
        mod_revision=int(doc.get("mod_revision", 0)),
        lease=int(doc.get("lease", 0)),
    )


class EtcdClient:
    def __init__(
        self,
        endpoints: Sequence[str],
        timeout: float,
        user: str | None = None,
        password_file: Path | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = tuple(endpoints)
        self.timeout = timeout
        self.user = user
        self.password_file = password_file
        self.current = 0
        self._session: aiohttp.ClientSession | None = None
        self._token: str | None = None
        self._login_lock = asyncio.Lock()
        # The etcd cluster's ID from the latest answer: a rebuilt etcd has another one (and
        # revisions, so fencing tokens, from 1 again).
        self.cluster_id: int | None = None
        # structlog's logger as runtime.logs configures it (ha sits below runtime).
        self.log: structlog.stdlib.BoundLogger = structlog.get_logger("sparkd").bind(
            component="etcd"
        )

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def endpoint(self) -> str:
        return self.endpoints[self.current]

    def _rotate(self) -> None:
        self.current = (self.current + 1) % len(self.endpoints)

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `/v3/<path>` to each endpoint in turn until one answers."""
        failures: list[str] = []
        for _ in self.endpoints:
            endpoint = self.endpoint
            try:
                answer = await self._authorized(endpoint, path, body)
            except (aiohttp.ClientError, TimeoutError) as exc:
                # Refused, reset, cut off mid-reply, timed out: the next endpoint may answer.
                failures.append(f"{endpoint}: {type(exc).__name__}")
                self._rotate()
                continue
            header = answer.get("result", answer).get("header") or {}
            if "cluster_id" in header:
                self.cluster_id = int(header["cluster_id"])
            return answer
        raise EtcdUnavailable("; ".join(failures))

    async def _authorized(self, endpoint: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.user is not None and self._token is None:
            await self._login(endpoint, None)
        used = self._token
        try:
            return await self._post(endpoint, path, body)
        except EtcdError as exc:
            if self.user is None or "auth token" not in exc.message:
                raise
            # Tokens expire (etcd's simple tokens after 5 minutes idle): get a new one, once.
            await self._login(endpoint, used)
            return await self._post(endpoint, path, body)

    async def _login(self, endpoint: str, expired: str | None) -> None:
        """A new token in place of `expired`, one login at a time: etcd checks the password
        with bcrypt, deliberately slow, so the renewal, the watch and the memory writes that
        all met the same expired token share one login rather than each paying for their own
        (concurrent logins on a loaded etcd took each past `request_timeout`)."""
        async with self._login_lock:
            if self._token is not None and self._token != expired:
                return  # another request logged in meanwhile
            self._token = await self._authenticate(endpoint)

    async def _authenticate(self, endpoint: str) -> str:
        assert self.password_file is not None
        password = self.password_file.read_text().strip()
        answer = await self._post(
            endpoint,
            "auth/authenticate",
            {"name": self.user, "password": password},
            auth=False,
            within=max(self.timeout, LOGIN_TIMEOUT),
        )
        return str(answer["token"])

    async def _post(
        self,
        endpoint: str,
        path: str,
        body: dict[str, Any],
        *,
        auth: bool = True,
        within: float | None = None,
    ) -> dict[str, Any]:
        headers = {"Authorization": self._token} if auth and self._token else {}
        async with asyncio.timeout(within or self.timeout):
            async with self._http().post(
                f"{endpoint}/v3/{path}", json=body, headers=headers
            ) as response:
                text = await _read_capped(response)
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            raise EtcdError(response.status, text[:200]) from None
        if response.status != 200 or not isinstance(doc, dict) or "error" in doc:
            message = doc.get("message") or doc.get("error") if isinstance(doc, dict) else text
            raise EtcdError(response.status, str(message)[:200])
        return doc

    # -- leases -------------------------------------------------------------------------

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: its ID and the TTL etcd granted (which may be longer than asked)."""
        answer = await self.call("lease/grant", {"TTL": str(ttl)})
        return int(answer["ID"]), int(answer["TTL"])

    async def keepalive(self, lease: int) -> int:
        """Renew once; the TTL granted, 0 when the lease is gone (expired or revoked)."""
        answer = await self.call("lease/keepalive", {"ID": str(lease)})
        # The gateway wraps a streaming reply as {"result": ...}.
        result = answer.get("result", answer)
        return int(result.get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        try:
            await self.call("lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if "not found" not in exc.message:
                raise

    # -- keys ---------------------------------------------------------------------------

    async def get(self, key: str) -> tuple[KeyValue | None, int]:
        """The key (None when absent) and the store's revision when it was read."""
        answer = await self.call("kv/range", {"key": b64(key)})
        kvs = answer.get("kvs") or []
        return (_kv(kvs[0]) if kvs else None), int(answer["header"]["revision"])

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        answer = await self.call("kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix)})
        return [_kv(doc) for doc in answer.get("kvs") or []], int(answer["header"]["revision"])

    async def newest(self, prefix: str, limit: int) -> list[KeyValue]:
        """The last `limit` keys under `prefix` in key order, last first."""
        answer = await self.call(
            "kv/range",
            {
                "key": b64(prefix),
                "range_end": prefix_end(prefix),
                "limit": str(limit),
                "sort_order": "DESCEND",
                "sort_target": "KEY",
            },
        )
        return [_kv(doc) for doc in answer.get("kvs") or []]

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        answer = await self.call("kv/put", body)
        return int(answer["header"]["revision"])

    async def delete(self, key: str) -> int:
        answer = await self.call("kv/deleterange", {"key": b64(key)})
        return int(answer.get("deleted", 0))

    async def create(self, key: str, value: bytes, lease: int) -> Acquired:
        """Put the key bound to `lease` only if it does not exist; else read who has it."""
        answer = await self.call(
            "kv/txn",
            {
                "compare": [
                    {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
                ],
                "success": [
                    {"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}}
                ],
                "failure": [{"request_range": {"key": b64(key)}}],
            },
        )
        revision = int(answer["header"]["revision"])
        if answer.get("succeeded", False):
            return Acquired(created=True, revision=revision, holder=None)
        holder = None
        for response in answer.get("responses") or []:
            kvs = response.get("response_range", {}).get("kvs") or []
            if kvs:
                holder = _kv(kvs[0])
        return Acquired(created=False, revision=revision, holder=holder)

    async def delete_if(self, key: str, create_revision: int) -> bool:
        """Delete the key only while it is still the one created at `create_revision`."""
        answer = await self.call(
            "kv/txn",
            {
                "compare": [
                    {
                        "key": b64(key),
                        "target": "CREATE",
                        "result": "EQUAL",
                        "create_revision": str(create_revision),
                    }
                ],
                "success": [{"request_delete_range": {"key": b64(key)}}],
            },
        )
        return bool(answer.get("succeeded", False))

    async def put_if_owner(self, owner: str, token: int, key: str, value: bytes) -> bool:
        """Put `key` only while the owner key `owner` is still the one created at `token`: a
        former owner's write changes nothing."""
        answer = await self.call(
            "kv/txn",
            {
                "compare": [
                    {
                        "key": b64(owner),
                        "target": "CREATE",
                        "result": "EQUAL",
                        "create_revision": str(token),
                    }
                ],
                "success": [{"request_put": {"key": b64(key), "value": b64(value)}}],
            },
        )
        return bool(answer.get("succeeded", False))

    async def watch_deletes(self, prefix: str, start_revision: int) -> AsyncIterator[str]:
        """Yield each key under `prefix` deleted from `start_revision` on, until the stream
        ends (etcd restarted, the connection broke, the revision was compacted)."""
        async for kind, key in self.watch(prefix, start_revision):
            if kind == "DELETE":
                yield key

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[tuple[str, str]]:
        """Yield ("PUT" or "DELETE", key) for each change under `prefix` from `start_revision`
        on, until the stream ends."""
        body = {
            "create_request": {
                "key": b64(prefix),
                "range_end": prefix_end(prefix),
                "start_revision": str(start_revision),
            }
        }
        headers = {"Authorization": self._token} if self._token else {}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout)
        async with self._http().post(
            f"{self.endpoint}/v3/watch", json=body, headers=headers, timeout=timeout
        ) as response:
            if response.status != 200:
                raise EtcdError(response.status, (await _read_capped(response))[:200])
            async for line in _messages(response.content):
                result = json.loads(line).get("result", {})
                if result.get("canceled") or result.get("compact_revision"):
                    return
                for event in result.get("events") or []:
                    # proto3 JSON leaves out the default type, PUT.
                    yield event.get("type", "PUT"), _kv(event.get("kv", {})).key

    async def guarded(
        self,
        owner: str,
        token: int,
        puts: dict[str, bytes],
        deletes: Sequence[str] = (),
        absent: str | None = None,
        ranges: Sequence[tuple[str, str]] = (),
    ) -> bool:
        """Put `puts`, delete `deletes` and each `[start, end)` of `ranges` in one transaction,
        only while the owner key `owner` is still the one created at `token` (and `absent`,
        when given, does not exist): a former owner's write changes nothing."""
        compare = [
            {
                "key": b64(owner),
                "target": "CREATE",
                "result": "EQUAL",
                "create_revision": str(token),
            }
        ]
        if absent is not None:
            compare.append(
                {"key": b64(absent), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
            )
        success: list[dict[str, Any]] = [
            {"request_put": {"key": b64(key), "value": b64(value)}} for key, value in puts.items()
        ]
        success += [{"request_delete_range": {"key": b64(key)}} for key in deletes]
        success += [
            {"request_delete_range": {"key": b64(start), "range_end": b64(end)}}
            for start, end in ranges
        ]
        answer = await self.call("kv/txn", {"compare": compare, "success": success})
        return bool(answer.get("succeeded", False))

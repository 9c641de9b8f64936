"""The API's abuse guards: the Host header check (DNS rebinding), the header deadline of each
connection, and a TCP site that caps connections, in all and per peer.

At a cap, the oldest connection still waiting for a whole request (its headers unsent, or idle
after an answer) is closed to admit the new one; only when every connection held is being
answered is the new one refused. Every local client is 127.0.0.1: refusing the newest would let
a few half-sent requests blind `/healthz` and the CLI.

The site admits a connection before aiohttp's handler sees it, which reaches into aiohttp's
`TCPSite` (its `_runner`, `_server`, `_host`, `_port`, `_backlog`, `_bound_port`): kept to
`GuardedSite`, so an aiohttp upgrade that moves them breaks here alone (and the API tests).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from sparkd.web.protocol import DAEMON

MAX_CONNECTIONS = 64
# One peer (an address) holds at most this many; the last KEPT_FOR_NEW_PEERS slots go only to a
# peer holding none, so one client cannot lock out a scraper or an operator.
MAX_PER_PEER = 16
KEPT_FOR_NEW_PEERS = 8
HEADER_TIMEOUT = 5.0
KEEPALIVE_TIMEOUT = 15.0
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def allowed_hosts(listen_host: str) -> frozenset[str]:
    names = {*LOOPBACK_NAMES, listen_host.lower()}
    for name in (socket.gethostname(), socket.getfqdn()):
        if name:
            names.add(name.lower())
    return frozenset(names)


def host_allowed(header: str, allowed: frozenset[str]) -> bool:
    """The Host header names an IP address or an allowed name (any port)."""
    host = header.strip().lower()
    if host.startswith("["):  # [v6]:port
        literal, _, _ = host[1:].partition("]")
        host = literal
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    host = host.rstrip(".")
    if host in allowed:
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def guard(allowed: frozenset[str]) -> Any:
    @web.middleware
    async def guard(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        deadlines = request.app[DEADLINES]
        deadlines.begin(request.protocol)
        try:
            host = request.headers.get("Host")
            if host is not None and not host_allowed(host, allowed):
                raise web.HTTPMisdirectedRequest(
                    text="Host header names neither this machine nor its listen address"
                )
            return await handler(request)
        finally:
            deadlines.end(request.protocol)

    return guard


class Deadlines:
    """The header deadline of each connection: armed when it opens and after each response,
    cleared while a request is handled; past it the connection is closed."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._timers: dict[RequestHandler, asyncio.TimerHandle] = {}
        self.expired = 0

    def arm(self, handler: RequestHandler) -> None:
        old = self._timers.pop(handler, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[handler] = loop.call_later(self.timeout, self._expire, handler)

    def waiting(self) -> list[RequestHandler]:
        """The connections waiting for a whole request, the longest-waiting first (a timer is
        re-inserted each time it is armed)."""
        return list(self._timers)

    def begin(self, handler: RequestHandler | None) -> None:
        timer = self._timers.pop(handler, None) if handler is not None else None
        if timer is not None:
            timer.cancel()

    def end(self, handler: RequestHandler | None) -> None:
        if handler is not None and handler.transport is not None:
            self.arm(handler)

    def _expire(self, handler: RequestHandler) -> None:
        self._timers.pop(handler, None)
        if handler.transport is not None:
            self.expired += 1
            handler.force_close()


DEADLINES: web.AppKey[Deadlines] = web.AppKey("deadlines")


def peer_of(peername: object) -> str:
    """The client's address, one spelling per address (an IPv4-mapped IPv6 one as IPv4)."""
    host = peername[0] if isinstance(peername, tuple) and peername else ""
    try:
        address = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return str(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


PeerOf = Callable[[asyncio.BaseTransport], str | None]


def tcp_peer(transport: asyncio.BaseTransport) -> str | None:
    return peer_of(transport.get_extra_info("peername"))


class Admission:
    """The caps of one site's connections: counted when a connection is made (many are accepted
    before any of them is), a connection closed to make room stops counting at once."""

    def __init__(self, app: web.Application, runner: web.BaseRunner) -> None:
        self._app = app
        self._runner = runner
        self.deadlines = app[DEADLINES]
        self.refused = 0
        self._logged_at: dict[str, float] = {}
        self.peers: dict[str, int] = {}
        # Every admitted connection not yet closed or evicted, by its aiohttp handler.
        self.held: dict[RequestHandler, _Capped] = {}
        self.evicted = 0

    def protocol(self, peer: PeerOf) -> asyncio.Protocol:
        server = self._runner.server
        assert server is not None
        return _Capped(self, server(), peer)

    def admit(self, conn: _Capped) -> None:
        self.held[conn.handler] = conn
        self.peers[conn.peer] = self.peers.get(conn.peer, 0) + 1

    def release(self, conn: _Capped) -> None:
        if self.held.pop(conn.handler, None) is None:
            return  # evicted already
        left = self.peers.pop(conn.peer, 1) - 1
        if left > 0:
            self.peers[conn.peer] = left

    def make_room(self, peer: str) -> bool:
        """Whether a new connection from `peer` may be admitted, once the oldest waiting one
        (of the same peer at a per-peer cap, of any at the total cap) is closed if need be."""
        while True:
            total = len(self.held)
            held = self.peers.get(peer, 0)
            if held >= MAX_PER_PEER or (held and total >= MAX_CONNECTIONS - KEPT_FOR_NEW_PEERS):
                victim = self._oldest_waiting(peer)
            elif total >= MAX_CONNECTIONS:
                victim = self._oldest_waiting(None)
            else:
                return True
            if victim is None:
                return False
            victim.evict()
            self.evicted += 1
            self._note("api_connections_evicted", evicted_total=self.evicted)

    def _oldest_waiting(self, peer: str | None) -> _Capped | None:
        for handler in self.deadlines.waiting():
            conn = self.held.get(handler)
            if conn is not None and peer in (None, conn.peer):
                return conn
        return None

    def note_refused(self, why: str) -> None:
        self.refused += 1
        self._note("api_connections_refused", why=why, refused_total=self.refused)

    def _note(self, event: str, **fields: object) -> None:
        """Logged at most once per 10 s: a flood must not flood the journal too."""
        now = time.monotonic()
        if now - self._logged_at.get(event, -10.0) > 10:
            self._logged_at[event] = now
            self._app[DAEMON].log.warning(event, cap=MAX_CONNECTIONS, **fields)


class _Capped(asyncio.Protocol):
    """Admits the connection to aiohttp's handler only while under the cap (and, on the Unix
    socket, only from a permitted peer)."""

    def __init__(self, admission: Admission, handler: RequestHandler, peer: PeerOf) -> None:
        self.admission = admission
        self.handler = handler
        self.peer_of = peer
        self.admitted = False
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = self.peer_of(transport)
        why = "peer not permitted" if peer is None else "at the cap"
        if peer is None or not self.admission.make_room(peer):
            assert isinstance(transport, asyncio.Transport)
            transport.abort()
            self.admission.note_refused(why)
            return
        self.peer = peer
        self.admitted = True
        self.admission.admit(self)
        self.handler.connection_made(transport)
        self.admission.deadlines.arm(self.handler)

    def evict(self) -> None:
        """Closed to make room: no longer counted, though its close completes later."""
        self.admission.release(self)
        self.admission.deadlines.begin(self.handler)
        self.handler.force_close()

    def data_received(self, data: bytes) -> None:
        if self.admitted:
            self.handler.data_received(data)

    def eof_received(self) -> None:
        if self.admitted:
            self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted:
            self.admitted = False
            self.admission.release(self)
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.admitted:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.handler.resume_writing()


class GuardedSite(web.TCPSite):
    """A TCP site with a connection cap and a header deadline per connection."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, app: web.Application) -> None:
        super().__init__(runner, host, port)
        self.admission = Admission(app, runner)

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: self.admission.protocol(tcp_peer), self._host, self._port, backlog=self._backlog
        )
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]


def runner_options() -> dict[str, Any]:
    """For web.AppRunner: header sizes and the idle keep-alive limit."""
    return {
        "access_log": None,
        "keepalive_timeout": KEEPALIVE_TIMEOUT,
        "max_line_size": 8190,
        "max_field_size": 8190,
    }

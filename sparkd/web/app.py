"""The aiohttp app: GET /metrics, /healthz, /status, /events;
POST /clusters/{name}/pause|resume|reconcile|rollout/retry|rollout/back.

The control endpoints need `Authorization: Bearer <token>`, checked in constant time against
the file named by `daemon.control_token_file`, read per request so a rotated token applies at
once. Without a configured token they answer 403 and say how to enable them.

Abuse limits: at most MAX_CONNECTIONS connections (more are reset at once), MAX_PER_PEER of one
address, the last KEPT_FOR_NEW_PEERS for addresses holding none; a request's headers
must arrive within HEADER_TIMEOUT of the connection opening (or of the previous response) and its
body within BODY_TIMEOUT, bodies are at most MAX_BODY bytes of JSON nested at most MAX_JSON_DEPTH
deep, and the Host header must name a loopback name, an IP address, this machine or the listen
address (a browser tricked by DNS rebinding sends the attacker's name).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client.aiohttp import make_aiohttp_handler

from sparkd import __version__
from sparkd.core.text import printable
from sparkd.model.plan import ActionOutcome
from sparkd.model.snapshot import SnapshotDocument
from sparkd.shell.secrets import SecretFileError, read_secret, redact, redact_json
from sparkd.web.rollout import rollout_json

if TYPE_CHECKING:
    from sparkd.runtime.controller import Controller
    from sparkd.runtime.daemon import Daemon

DAEMON: web.AppKey[Daemon] = web.AppKey("daemon")
MAX_EVENTS = 1000
MAX_CONNECTIONS = 64
# One peer (an address) holds at most this many; the last KEPT_FOR_NEW_PEERS slots go only to a
# peer holding none, so one client cannot lock out a scraper or an operator.
MAX_PER_PEER = 16
KEPT_FOR_NEW_PEERS = 8
HEADER_TIMEOUT = 5.0
BODY_TIMEOUT = 5.0
KEEPALIVE_TIMEOUT = 15.0
MAX_BODY = 16 * 1024
MAX_JSON_DEPTH = 8
MAX_TEXT = 1000
# A pause longer than this is an indefinite one: leave out for_seconds.
MAX_PAUSE_SECONDS = 90 * 86400
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def outcome_json(
    outcome: ActionOutcome, wall_of: Callable[[float], float] = lambda at: at
) -> dict[str, Any]:
    """`wall_of` turns the outcome's daemon-time stamps into wall clock, for people."""
    return {
        **outcome.action.public(),
        "result": outcome.result,
        "detail": outcome.detail,
        "started_at": wall_of(outcome.started_at),
        "finished_at": wall_of(outcome.finished_at),
    }


def _window(controller: Controller) -> dict[str, Any] | None:
    window = controller.maintenance_at(controller.wall_clock())
    if window is None:
        return None
    return {"reason": window.reason, "start": window.start, "end": window.end}


def cluster_json(controller: Controller) -> dict[str, Any]:
    view = controller.view
    memory = controller.memory
    plan = view.plan
    snapshot = (
        SnapshotDocument.of(view.snapshot, memory).model_dump(mode="json")
        if view.snapshot is not None
        else None
    )
    return {
        "cluster": controller.cluster.name,
        "phase": plan.phase if plan is not None else None,
        "reason": plan.reason if plan is not None else "no cycle finished yet",
        "converged": plan.converged if plan is not None else False,
        # The failure classes below vLLM the plan recognised (core.triage.TABLE).
        "triage": list(plan.triage) if plan is not None else [],
        "paused": memory.paused.model_dump(mode="json") if memory.paused is not None else None,
        "blocked": memory.blocked.model_dump(mode="json") if memory.blocked is not None else None,
        "maintenance": _window(controller),
        "dry_run": controller.dry_run,
        "plan": plan.public() if plan is not None else None,
        "in_flight": view.in_flight.public() if view.in_flight is not None else None,
        "recent_actions": [outcome_json(o, controller.clock.wall_of) for o in view.recent],
        "cycles": view.cycles,
        "last_cycle_at": view.last_cycle_at,
        "last_error": view.last_error,
        "persist_error": controller.persist_error,
        # How far the ops box's wall clock stepped against the monotonic clock sparkd measures
        # durations on (null: no step); pauses and windows follow the wall clock.
        "clock_step_seconds": view.clock_step,
        "probes": {
            "reasoning_only_ratio": view.reasoning_only_ratio,
            "window": len(view.probe_window),
            "last_success_at": view.last_probe_success_at,
        },
        "snapshot": snapshot,
        "rollout": rollout_json(controller),
    }


async def healthz(request: web.Request) -> web.Response:
    health = request.app[DAEMON].health()
    return web.json_response(health, status=200 if health["status"] == "ok" else 503)


async def status(request: web.Request) -> web.Response:
    daemon = request.app[DAEMON]
    return web.json_response(
        redact_json(
            {
                "version": __version__,
                "started_at": daemon.started_at,
                "clusters": [cluster_json(c) for c in daemon.controllers.values()],
            }
            | ({"ha": daemon.ha.status()} if daemon.ha is not None else {})
        )
    )


async def events(request: web.Request) -> web.Response:
    daemon = request.app[DAEMON]
    cluster = request.query.get("cluster")
    try:
        limit = min(MAX_EVENTS, max(1, int(request.query.get("limit", "100"))))
    except ValueError:
        raise web.HTTPBadRequest(text="limit must be a whole number") from None
    # Off the event loop: a slow disk or a long file must not stall every cluster's cycle.
    try:
        found, skipped = await asyncio.to_thread(daemon.state.read_events_counted, limit, cluster)
    except OSError as exc:
        raise web.HTTPServiceUnavailable(
            text=f"events unreadable: {exc.strerror or type(exc).__name__}"
        ) from None
    # Lines of the events file that could not be read (torn, not UTF-8), skipped on the way.
    return web.json_response(redact_json({"events": found, "skipped_lines": skipped}))


async def _authorize(request: web.Request) -> None:
    token_file = request.app[DAEMON].settings.daemon.control_token_file
    if token_file is None:
        raise web.HTTPForbidden(
            text="control endpoints are disabled: set daemon.control_token_file to a file "
            "holding a bearer token"
        )
    try:
        # Off the loop: a file on a hung mount must not stall every request.
        token = await asyncio.to_thread(read_secret, token_file)
    except SecretFileError as exc:
        raise web.HTTPForbidden(text=f"control token unavailable: {exc}") from None
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    expected = (token or "").encode()
    try:
        presented = value.strip().encode("utf-8")
    except UnicodeEncodeError:  # bytes that were not UTF-8 arrive as surrogates
        raise web.HTTPBadRequest(text="Authorization header is not UTF-8") from None
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented, expected):
        raise web.HTTPUnauthorized(text="bad or missing bearer token")


def _controller(request: web.Request) -> Controller:
    name = request.match_info["name"]
    controller = request.app[DAEMON].controllers.get(name)
    if controller is None:
        raise web.HTTPNotFound(text=f"no cluster named {name!r}")
    return controller


def json_depth(raw: str) -> int:
    """How deeply arrays and objects nest, counted without parsing (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in raw:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        async with asyncio.timeout(BODY_TIMEOUT):
            raw = await request.read()
    except TimeoutError:
        raise web.HTTPRequestTimeout(text=f"body not received within {BODY_TIMEOUT:g}s") from None
    try:
        text = raw.decode("utf-8")
        if json_depth(text) > MAX_JSON_DEPTH:
            raise web.HTTPBadRequest(text=f"body nests deeper than {MAX_JSON_DEPTH} levels")
        body = json.loads(text)
    except ValueError:  # also not UTF-8, and integers too long to parse
        raise web.HTTPBadRequest(text="body must be JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="body must be a JSON object")
    return body


def _text(body: dict[str, Any], key: str, default: str) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise web.HTTPBadRequest(text=f"{key} must be a string of at most {MAX_TEXT} characters")
    # A client's text is shown by `sparkd status` on someone else's terminal.
    return printable(value)


async def pause(request: web.Request) -> web.Response:
    await _authorize(request)
    controller = _controller(request)
    body = await _body(request)
    reason = _text(body, "reason", "")
    if not reason.strip():
        raise web.HTTPBadRequest(text="pause needs a reason")
    by = _text(body, "by", "api")
    duration = body.get("for_seconds")
    until = None
    if duration is not None:
        if (
            not isinstance(duration, int | float)
            or isinstance(duration, bool)
            or (isinstance(duration, float) and not math.isfinite(duration))
            or not 0 < duration <= MAX_PAUSE_SECONDS
        ):
            raise web.HTTPBadRequest(
                text=f"for_seconds must be a number of seconds, more than 0 and at most "
                f"{MAX_PAUSE_SECONDS} (leave it out for a pause without an end)"
            )
        until = controller.wall_clock() + float(duration)
    reason, by = redact(reason.strip()), redact(str(by))
    if request.app[DAEMON].ha is not None:
        return await _through_etcd(request, controller, True, reason, by, until)
    saved = controller.pause(reason, by, until)
    return web.json_response(_applied(controller, saved))


async def resume(request: web.Request) -> web.Response:
    await _authorize(request)
    controller = _controller(request)
    body = await _body(request)
    by = _text(body, "by", "api")
    if request.app[DAEMON].ha is not None:
        return await _through_etcd(request, controller, False, "", by, None)
    saved = controller.resume(by)
    return web.json_response(_applied(controller, saved))


async def _through_etcd(
    request: web.Request,
    controller: Controller,
    paused: bool,
    reason: str,
    by: str,
    until: float | None,
) -> web.Response:
    """With [ha] a pause or resume is recorded in etcd, whichever instance was asked: the owner
    applies it (at once when that is this one); without etcd it is refused, not half-made."""
    from sparkd.ha.control import Control
    from sparkd.ha.etcd import EtcdError, EtcdUnavailable

    ha = request.app[DAEMON].ha
    assert ha is not None
    name = controller.cluster.name
    control = Control(paused=paused, reason=reason, by=by, at=controller.wall_clock(), until=until)
    try:
        revision = await ha.request(name, control)
    except (EtcdUnavailable, EtcdError, OSError) as exc:
        raise web.HTTPServiceUnavailable(
            text=f"no etcd: the {'pause' if paused else 'resume'} was not recorded ({exc})"
        ) from None
    body = _applied(controller, controller.persist_error is None)
    body["ha"] = {"recorded": "etcd", "revision": revision, "role": ha.role(name)}
    return web.json_response(body)


def _applied(controller: Controller, saved: bool) -> dict[str, Any]:
    """The cluster after an operator's change, and whether the change is on disk: when it is
    not, it holds only until the daemon restarts."""
    body = cluster_json(controller)
    body["persisted"] = saved
    if not saved:
        body["warning"] = (
            f"applied, but not persisted ({controller.persist_error}); "
            "it is lost if sparkd restarts before the state dir takes writes again"
        )
    redacted: dict[str, Any] = redact_json(body)
    return redacted


def _owned(request: web.Request, controller: Controller) -> None:
    """With [ha] a rollout retry or back is made only where the cluster is owned: it edits this
    instance's memory alone, which the owner never hears and a standby would act on at takeover."""
    ha = request.app[DAEMON].ha
    name = controller.cluster.name
    if ha is not None and not ha.may_act(name):
        raise web.HTTPConflict(
            text=f"not the owner of {name} (owner: {ha.holder(name) or 'unknown'}); "
            "ask the instance that owns it"
        )


async def rollout_retry(request: web.Request) -> web.Response:
    """Roll the desired spec out again after a rollback (409 when none holds)."""
    await _authorize(request)
    controller = _controller(request)
    _owned(request, controller)
    body = await _body(request)
    if not controller.rollout_retry(redact(_text(body, "by", "api"))):
        raise web.HTTPConflict(text=f"{controller.cluster.name}: no rollback holds")
    return web.json_response(_applied(controller, controller.persist_error is None))


async def rollout_back(request: web.Request) -> web.Response:
    """Go to the last-good spec now (409 without one other than the desired spec)."""
    await _authorize(request)
    controller = _controller(request)
    _owned(request, controller)
    body = await _body(request)
    if not controller.rollout_back(redact(_text(body, "by", "api"))):
        raise web.HTTPConflict(
            text=f"{controller.cluster.name}: no last-good spec other than the desired one"
        )
    return web.json_response(_applied(controller, controller.persist_error is None))


async def reconcile(request: web.Request) -> web.Response:
    await _authorize(request)
    controller = _controller(request)
    body = await _body(request)
    controller.reconcile(_text(body, "by", "api"))
    return web.json_response({"cluster": controller.cluster.name, "reconcile": "requested"})


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


def _guard(allowed: frozenset[str]) -> Any:
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


class _Capped(asyncio.Protocol):
    """Admits the connection to aiohttp's handler only while under the cap, counted when the
    connection is made (many are accepted before any of them is)."""

    def __init__(self, site: GuardedSite, handler: RequestHandler) -> None:
        self.site = site
        self.handler = handler
        self.admitted = False
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        total = len(self.site.runner_server().connections)
        self.peer = peer_of(transport.get_extra_info("peername"))
        held = self.site.peers.get(self.peer, 0)
        if (
            total >= MAX_CONNECTIONS
            or held >= MAX_PER_PEER
            or (held and total >= MAX_CONNECTIONS - KEPT_FOR_NEW_PEERS)
        ):
            assert isinstance(transport, asyncio.Transport)
            transport.abort()
            self.site.note_refused()
            return
        self.admitted = True
        self.site.peers[self.peer] = held + 1
        self.handler.connection_made(transport)
        self.site.deadlines.arm(self.handler)

    def data_received(self, data: bytes) -> None:
        if self.admitted:
            self.handler.data_received(data)

    def eof_received(self) -> None:
        if self.admitted:
            self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted:
            self.admitted = False
            left = self.site.peers.pop(self.peer, 1) - 1
            if left > 0:
                self.site.peers[self.peer] = left
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
        self._app = app
        self.deadlines = app[DEADLINES]
        self.refused = 0
        self._refused_logged_at = 0.0
        self.peers: dict[str, int] = {}

    def runner_server(self) -> web.Server:
        server = self._runner.server
        assert server is not None
        return server

    def note_refused(self) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._refused_logged_at > 10:
            self._refused_logged_at = now
            self._app[DAEMON].log.warning(
                "api_connections_refused", cap=MAX_CONNECTIONS, refused_total=self.refused
            )

    def _protocol(self) -> asyncio.Protocol:
        return _Capped(self, self.runner_server()())

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol, self._host, self._port, backlog=self._backlog
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


def make_app(daemon: Daemon) -> web.Application:
    allowed = allowed_hosts(daemon.settings.daemon.listen_host)
    app = web.Application(client_max_size=MAX_BODY, middlewares=[_guard(allowed)])
    app[DAEMON] = daemon
    app[DEADLINES] = Deadlines(HEADER_TIMEOUT)
    app.router.add_get("/metrics", make_aiohttp_handler(daemon.metrics.registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/status", status)
    app.router.add_get("/events", events)
    app.router.add_post("/clusters/{name}/pause", pause)
    app.router.add_post("/clusters/{name}/resume", resume)
    app.router.add_post("/clusters/{name}/reconcile", reconcile)
    app.router.add_post("/clusters/{name}/rollout/retry", rollout_retry)
    app.router.add_post("/clusters/{name}/rollout/back", rollout_back)
    return app

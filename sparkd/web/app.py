"""The aiohttp app: GET /metrics, /healthz, /status, /events;
POST /clusters/{name}/pause|resume|reconcile|rollout/retry|rollout/back (web.control).

The control endpoints need `Authorization: Bearer <token>` (web.auth).

Abuse limits (web.guard, web.body): at most MAX_CONNECTIONS connections (more are reset at
once), MAX_PER_PEER of one address, the last KEPT_FOR_NEW_PEERS for addresses holding none; a
request's headers must arrive within HEADER_TIMEOUT of the connection opening (or of the
previous response) and its body within BODY_TIMEOUT, bodies are at most MAX_BODY bytes of JSON
nested at most MAX_JSON_DEPTH deep, and the Host header must name a loopback name, an IP
address, this machine or the listen address (a browser tricked by DNS rebinding sends the
attacker's name).
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from sparkd import __version__
from sparkd.runtime.status_json import cluster_json
from sparkd.runtime.store import EventsUnreadable
from sparkd.shell.secrets import redact_json
from sparkd.web.body import MAX_BODY
from sparkd.web.control import pause, reconcile, resume, rollout_back, rollout_retry
from sparkd.web.guard import (
    DEADLINES,
    HEADER_TIMEOUT,
    Deadlines,
    allowed_hosts,
    guard,
)
from sparkd.web.protocol import DAEMON, DaemonApi

MAX_EVENTS = 1000


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
    try:
        found, skipped = await daemon.read_events(limit, cluster)
    except OSError as exc:
        raise web.HTTPServiceUnavailable(
            text=f"events unreadable: {exc.strerror or type(exc).__name__}"
        ) from None
    except EventsUnreadable as exc:
        raise web.HTTPServiceUnavailable(text=f"events unreadable: {exc}") from None
    # Lines of the events file (or records in etcd) that could not be read, skipped on the way.
    return web.json_response(redact_json({"events": found, "skipped_lines": skipped}))


def make_app(daemon: DaemonApi) -> web.Application:
    allowed = allowed_hosts(daemon.settings.daemon.listen_host)
    app = web.Application(client_max_size=MAX_BODY, middlewares=[guard(allowed)])
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

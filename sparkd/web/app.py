"""The aiohttp app: GET /metrics, /healthz, /status, /events;
POST /clusters/{name}/pause|resume|reconcile.

The control endpoints need `Authorization: Bearer <token>`, checked in constant time against
the file named by `daemon.control_token_file`, read per request so a rotated token applies at
once. Without a configured token they answer 403 and say how to enable them.
"""

from __future__ import annotations

import hmac
import math
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from sparkd import __version__
from sparkd.model.plan import ActionOutcome
from sparkd.model.snapshot import SnapshotDocument
from sparkd.shell.secrets import SecretFileError, read_secret, redact, redact_json

if TYPE_CHECKING:
    from sparkd.runtime.controller import Controller
    from sparkd.runtime.daemon import Daemon

DAEMON: web.AppKey[Daemon] = web.AppKey("daemon")
MAX_EVENTS = 1000


def outcome_json(outcome: ActionOutcome) -> dict[str, Any]:
    return {
        **outcome.action.public(),
        "result": outcome.result,
        "detail": outcome.detail,
        "started_at": outcome.started_at,
        "finished_at": outcome.finished_at,
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
        "paused": memory.paused.model_dump(mode="json") if memory.paused is not None else None,
        "blocked": memory.blocked.model_dump(mode="json") if memory.blocked is not None else None,
        "maintenance": _window(controller),
        "dry_run": controller.dry_run,
        "plan": plan.public() if plan is not None else None,
        "in_flight": view.in_flight.public() if view.in_flight is not None else None,
        "recent_actions": [outcome_json(o) for o in view.recent],
        "cycles": view.cycles,
        "last_cycle_at": view.last_cycle_at,
        "last_error": view.last_error,
        "probes": {
            "reasoning_only_ratio": view.reasoning_only_ratio,
            "window": len(view.probe_window),
            "last_success_at": view.last_probe_success_at,
        },
        "snapshot": snapshot,
    }


async def healthz(request: web.Request) -> web.Response:
    ok, reason = request.app[DAEMON].healthy()
    return web.json_response(
        {"status": "ok" if ok else "unhealthy", "reason": reason}, status=200 if ok else 503
    )


async def status(request: web.Request) -> web.Response:
    daemon = request.app[DAEMON]
    return web.json_response(
        redact_json(
            {
                "version": __version__,
                "started_at": daemon.started_at,
                "clusters": [cluster_json(c) for c in daemon.controllers.values()],
            }
        )
    )


async def events(request: web.Request) -> web.Response:
    daemon = request.app[DAEMON]
    cluster = request.query.get("cluster")
    try:
        limit = min(MAX_EVENTS, max(1, int(request.query.get("limit", "100"))))
    except ValueError:
        raise web.HTTPBadRequest(text="limit must be a whole number") from None
    found = daemon.state.read_events(MAX_EVENTS if cluster else limit)
    if cluster:
        found = [e for e in found if e.get("cluster") == cluster][:limit]
    return web.json_response(redact_json({"events": found}))


def _authorize(request: web.Request) -> None:
    token_file = request.app[DAEMON].settings.daemon.control_token_file
    if token_file is None:
        raise web.HTTPForbidden(
            text="control endpoints are disabled: set daemon.control_token_file to a file "
            "holding a bearer token"
        )
    try:
        token = read_secret(token_file)
    except SecretFileError as exc:
        raise web.HTTPForbidden(text=f"control token unavailable: {exc}") from None
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    expected = (token or "").encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), expected):
        raise web.HTTPUnauthorized(text="bad or missing bearer token")


def _controller(request: web.Request) -> Controller:
    name = request.match_info["name"]
    controller = request.app[DAEMON].controllers.get(name)
    if controller is None:
        raise web.HTTPNotFound(text=f"no cluster named {name!r}")
    return controller


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="body must be JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="body must be a JSON object")
    return body


async def pause(request: web.Request) -> web.Response:
    _authorize(request)
    controller = _controller(request)
    body = await _body(request)
    reason = body.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise web.HTTPBadRequest(text="pause needs a reason")
    by = body.get("by") if isinstance(body.get("by"), str) else "api"
    duration = body.get("for_seconds")
    until = None
    if duration is not None:
        if not isinstance(duration, int | float) or not math.isfinite(duration) or duration <= 0:
            raise web.HTTPBadRequest(text="for_seconds must be a positive number")
        until = controller.wall_clock() + float(duration)
    controller.pause(redact(reason.strip()), redact(str(by)), until)
    return web.json_response(cluster_json(controller))


async def resume(request: web.Request) -> web.Response:
    _authorize(request)
    controller = _controller(request)
    body = await _body(request)
    controller.resume(str(body.get("by", "api")))
    return web.json_response(cluster_json(controller))


async def reconcile(request: web.Request) -> web.Response:
    _authorize(request)
    controller = _controller(request)
    body = await _body(request)
    controller.reconcile(str(body.get("by", "api")))
    return web.json_response({"cluster": controller.cluster.name, "reconcile": "requested"})


def make_app(daemon: Daemon) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app[DAEMON] = daemon
    app.router.add_get("/metrics", make_aiohttp_handler(daemon.metrics.registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/status", status)
    app.router.add_get("/events", events)
    app.router.add_post("/clusters/{name}/pause", pause)
    app.router.add_post("/clusters/{name}/resume", resume)
    app.router.add_post("/clusters/{name}/reconcile", reconcile)
    return app

"""POST /clusters/{name}/pause|resume|reconcile|rollout/retry|rollout/back: an operator's
requests, authorized, with bounded bodies, answered with the cluster as it is afterwards."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sparkd.runtime.status_json import cluster_json
from sparkd.shell.secrets import redact, redact_json
from sparkd.web.auth import authorize
from sparkd.web.body import json_body, text_field
from sparkd.web.protocol import DAEMON

if TYPE_CHECKING:
    from sparkd.runtime.controller import Controller

# A pause longer than this is an indefinite one: leave out for_seconds.
MAX_PAUSE_SECONDS = 90 * 86400


def _controller(request: web.Request) -> Controller:
    name = request.match_info["name"]
    controller = request.app[DAEMON].controllers.get(name)
    if controller is None:
        raise web.HTTPNotFound(text=f"no cluster named {name!r}")
    return controller


async def pause(request: web.Request) -> web.Response:
    await authorize(request)
    controller = _controller(request)
    body = await json_body(request)
    reason = text_field(body, "reason", "")
    if not reason.strip():
        raise web.HTTPBadRequest(text="pause needs a reason")
    by = text_field(body, "by", "api")
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
    saved = controller.requests.pause(reason, by, until)
    return web.json_response(_applied(controller, saved))


async def resume(request: web.Request) -> web.Response:
    await authorize(request)
    controller = _controller(request)
    body = await json_body(request)
    by = text_field(body, "by", "api")
    if request.app[DAEMON].ha is not None:
        return await _through_etcd(request, controller, False, "", by, None)
    saved = controller.requests.resume(by)
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
    daemon = request.app[DAEMON]
    ha = daemon.ha
    name = controller.cluster.name
    if ha is not None and not ha.may_act(name):
        raise web.HTTPConflict(
            text=f"not the owner of {name} (owner: {ha.holder(name) or 'unknown'}); "
            "ask the instance that owns it"
        )
    if not daemon.memory_current(name):
        # Just taken over: the memory from etcd replaces this instance's at its next look,
        # and an edit made before that would be lost with it.
        raise web.HTTPServiceUnavailable(
            text=f"{name}: taking over, its memory from etcd is not in yet; ask again",
            headers={"Retry-After": "1"},
        )


async def rollout_retry(request: web.Request) -> web.Response:
    """Roll the desired spec out again after a rollback (409 when none holds)."""
    return await _rollout_edit(
        request, lambda c, by: c.requests.rollout_retry(by), "no rollback of the desired spec holds"
    )


async def rollout_back(request: web.Request) -> web.Response:
    """Go to the last-good spec now (409 without one other than the desired spec)."""
    return await _rollout_edit(
        request,
        lambda c, by: c.requests.rollout_back(by),
        "no last-good spec other than the desired one",
    )


async def _rollout_edit(
    request: web.Request, edit: Callable[[Controller, str], bool], refused: str
) -> web.Response:
    """A rollout retry or back, made only where the cluster is owned; 409 (`refused`) when the
    controller has nothing to make it on."""
    await authorize(request)
    controller = _controller(request)
    _owned(request, controller)
    body = await json_body(request)
    if not edit(controller, redact(text_field(body, "by", "api"))):
        raise web.HTTPConflict(text=f"{controller.cluster.name}: {refused}")
    return web.json_response(_applied(controller, controller.persist_error is None))


async def reconcile(request: web.Request) -> web.Response:
    await authorize(request)
    controller = _controller(request)
    body = await json_body(request)
    controller.requests.reconcile(text_field(body, "by", "api"))
    return web.json_response({"cluster": controller.cluster.name, "reconcile": "requested"})

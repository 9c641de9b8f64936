"""Ray's node list and cluster status from the head's dashboard, over a channel per request.

The `ray` CLI costs the head 0.6-3 s of a core a call (a Python start and Ray's imports); the
dashboard serves the same facts for a few milliseconds. Reached through the head's SSH
connection (a direct-tcpip channel to `127.0.0.1:ray.dashboard_port`, where `ray start
--dashboard-host=127.0.0.1` binds it), like the model. When the dashboard does not answer
readably, the caller reads the CLI instead.

With Ray's token auth on (`RAY_AUTH_MODE=token`), every read carries `Authorization: Bearer
<token>` from `ray.auth_token_file`. Ray refuses a read without the header (401) or with
another token (403); such a refusal is `DashboardRefused`, which the caller says in Ray's
reading rather than falling back to the CLI in silence.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

import h11

from sparkd.core import ray_json
from sparkd.core.text import printable
from sparkd.model.observed import RayState
from sparkd.shell.model_http import (
    BodyTooLarge,
    ChannelRefused,
    ChannelUnavailable,
    Opener,
    request,
)

DASHBOARD_HOST = "127.0.0.1"
# The filter applies before the limit, as with `ray list nodes --filter state=ALIVE`: DEAD
# records (one per restart, for the life of the head) never push an ALIVE node out.
NODES_PATH = "/api/v0/nodes?" + urlencode(
    [
        ("limit", str(ray_json.NODES_LIMIT)),
        ("filter_keys", "state"),
        ("filter_predicates", "="),
        ("filter_values", "ALIVE"),
    ]
)
STATUS_PATH = "/api/cluster_status"
# The same status as text, as `ray status` prints it: under autoscaler v2 the only one there is.
FORMATTED_STATUS_PATH = "/api/cluster_status?format=1"
# A node list is a few kB; the cluster status grows with the nodes and resources.
MAX_ANSWER = 1 << 20
# Ray's token middleware answers these two statuses, with a one-line text body (ray 2.60
# python/ray/_private/authentication/http_token_authentication.py `token_auth_middleware`).
REFUSALS = frozenset({401, 403})
# Enough of the refusal's body to say which one it was, never a whole answer.
MAX_REFUSAL_TEXT = 120


async def _get(opener: Opener, port: int, path: str, token: str | None = None) -> str:
    """The body of a 200 answer; anything else raises `DashboardSilent` saying what happened."""
    authority = f"{DASHBOARD_HOST}:{port}"
    # Ray compares the whole header value with `Bearer <token>` (ray 2.60
    # dashboard/authentication_utils.py `validate_request_token`).
    headers = [("Authorization", f"Bearer {token}")] if token else []
    try:
        response = await request(
            opener, "GET", authority, path, max_bytes=MAX_ANSWER, headers=headers
        )
    except ChannelRefused:
        raise DashboardSilent("dashboard refused the connection") from None
    except ChannelUnavailable as exc:
        raise DashboardSilent(f"no channel to the dashboard: {exc}") from None
    except (BodyTooLarge, h11.ProtocolError, OSError, EOFError) as exc:
        raise DashboardSilent(f"dashboard answer unreadable: {type(exc).__name__}") from None
    if response.status in REFUSALS:
        said = response.body[:MAX_REFUSAL_TEXT].decode("utf-8", errors="replace")
        said = printable(said).strip() or f"HTTP {response.status}"
        hint = "no ray.auth_token_file" if token is None else "ray.auth_token_file's token"
        raise DashboardRefused(
            f"the dashboard refused sparkd's read ({hint}): HTTP {response.status} {said}"
        )
    if response.status != 200:
        raise DashboardSilent(f"dashboard answered HTTP {response.status} to {path.split('?')[0]}")
    return response.body.decode("utf-8", errors="replace")


class DashboardSilent(Exception):
    """The dashboard gave no usable answer (off, still starting, failing, or garbled)."""


class DashboardRefused(DashboardSilent):
    """Ray's token auth refused the read: a configuration problem, said in Ray's reading."""


async def read_ray(
    opener: Opener, port: int, ray_status: bool, seconds: float, token: str | None = None
) -> RayState | DashboardSilent:
    """The node list, and with `ray_status` the GPUs Ray can place on beside it (a node is
    listed ALIVE a few seconds before its GPU counts). A node list that cannot be had is
    `DashboardSilent`; a cluster status that cannot be had leaves `gpus_usable` unset, as a
    failed `ray status` beside `ray list nodes` does. A status with no report in it (autoscaler
    v2 never writes one) is asked again formatted, as `ray status` prints it."""
    paths = [NODES_PATH, STATUS_PATH] if ray_status else [NODES_PATH]
    try:
        async with asyncio.timeout(seconds):
            answers = await asyncio.gather(
                *(_get(opener, port, path, token) for path in paths), return_exceptions=True
            )
            nodes = answers[0]
            status = answers[1] if ray_status else None
            if isinstance(status, str) and ray_json.report_absent(status):
                try:
                    status = await _get(opener, port, FORMATTED_STATUS_PATH, token)
                except DashboardSilent as silent:
                    status = silent
    except TimeoutError:
        return DashboardSilent(f"dashboard did not answer within {seconds:.0f} s")
    if isinstance(nodes, BaseException):
        if isinstance(nodes, DashboardSilent):
            return nodes
        raise nodes
    ray = ray_json.parse_nodes(nodes)
    if ray is None:
        return DashboardSilent("dashboard node list unreadable")
    if ray_status:
        if isinstance(status, BaseException) and not isinstance(status, DashboardSilent):
            raise status
        usable = _usable(status) if isinstance(status, str) else None
        if usable is not None:
            ray = ray.model_copy(update={"gpus_usable": usable})
    return ray


def _usable(body: str) -> float | None:
    """The GPUs Ray can place on, from the structured status or the formatted one."""
    usable = ray_json.parse_cluster_status(body)
    return usable if usable is not None else ray_json.parse_formatted_status(body)

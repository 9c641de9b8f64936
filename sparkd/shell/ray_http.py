"""Ray's node list and cluster status from the head's dashboard, by a fixed command on the head.

The `ray` CLI costs the head 0.6-3 s of a core a call (a Python start and Ray's imports); the
dashboard serves the same facts for a few milliseconds. Each read is one of the catalogue's
fixed GETs (`catalogue.reads.dashboard_get`: Python's standard library on the head host's loopback,
where `ray start --dashboard-host=127.0.0.1` binds it, a few tens of ms of a core), run over the
head's SSH connection like any other command. The key gets no channel to the dashboard's port:
one would also reach Ray's job API (`POST /api/jobs/` runs code as root in the head's
container). When the dashboard does not answer readably, the caller reads the CLI instead.

With Ray's token auth on (`RAY_AUTH_MODE=token`), every read carries `Authorization: Bearer
<token>` from `ray.auth_token_file` (sent on the command's stdin, never on a command line).
Ray refuses a read without the header (401) or with another token (403); such a refusal is
`DashboardRefused`, which the caller says in Ray's reading rather than falling back to the CLI
in silence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from sparkd.core.reading import ray_json
from sparkd.core.text import printable
from sparkd.model.exits import (
    DASHBOARD_FAILED_EXIT,
    DASHBOARD_REFUSED_EXIT,
    DASHBOARD_TOO_LARGE_EXIT,
    REFUSED_EXIT,
    TIMED_OUT_EXIT,
)
from sparkd.model.observed import RayState
from sparkd.shell import catalogue
from sparkd.shell.catalogue.reads import (
    DASHBOARD_HOST,
    FORMATTED_STATUS_PATH,
    NODES_PATH,
    STATUS_PATH,
)

__all__ = [
    "DASHBOARD_HOST",
    "FORMATTED_STATUS_PATH",
    "MAX_ANSWER",
    "NODES_PATH",
    "STATUS_PATH",
    "DashboardRefused",
    "DashboardSilent",
    "Ran",
    "Runner",
    "read_ray",
]

MAX_ANSWER = catalogue.reads.DASHBOARD_MAX_ANSWER
# Ray's token middleware answers these two statuses, with a one-line text body (ray 2.60
# python/ray/_private/authentication/http_token_authentication.py `token_auth_middleware`).
REFUSALS = frozenset({401, 403})
# Enough of the refusal's body to say which one it was, never a whole answer.
MAX_REFUSAL_TEXT = 120


class Ran(NamedTuple):
    """A finished command: its exit status (None when it could not be run at all, `stdout`
    then saying why) and its output."""

    exit_status: int | None
    stdout: str


# Runs one catalogue command on the head (its stdin included) within the given seconds.
Runner = Callable[[catalogue.remote.Remote, float], Awaitable[Ran]]


def _answer(path: str, ran: Ran, token: str | None) -> str:
    """The body of a 200 answer; anything else raises `DashboardSilent` saying what happened."""
    status, out = ran
    where = path.split("?")[0]
    if status is None:
        raise DashboardSilent(f"dashboard read not run: {printable(out)[:MAX_REFUSAL_TEXT]}")
    if status == DASHBOARD_REFUSED_EXIT:
        raise DashboardSilent("dashboard refused the connection")
    if status == DASHBOARD_TOO_LARGE_EXIT:
        raise DashboardSilent("dashboard answer unreadable: larger than the cap")
    if status == DASHBOARD_FAILED_EXIT:
        said = printable(out.strip().removeprefix("!"))[:64] or "failed"
        raise DashboardSilent(f"dashboard answer unreadable: {said}")
    if status == TIMED_OUT_EXIT:
        raise DashboardSilent(f"dashboard did not answer {where}")
    if status == REFUSED_EXIT:
        raise DashboardSilent(
            "the forced command refused the dashboard read (exit 126): reinstall it "
            "(sparkd commands --forced-command)"
        )
    head, newline, body = out.partition("\n")
    words = head.split(" ")
    if status != 0 or not newline or len(words) != 2 or words[0] != "HTTP":
        raise DashboardSilent(f"dashboard read failed (exit {status}) for {where}")
    if not words[1].isdigit():
        raise DashboardSilent(f"dashboard answer unreadable for {where}")
    code = int(words[1])
    if code in REFUSALS:
        said = printable(body[:MAX_REFUSAL_TEXT]).strip() or f"HTTP {code}"
        hint = "no ray.auth_token_file" if token is None else "ray.auth_token_file's token"
        raise DashboardRefused(f"the dashboard refused sparkd's read ({hint}): HTTP {code} {said}")
    if code != 200:
        raise DashboardSilent(f"dashboard answered HTTP {code} to {where}")
    return body


async def _get(run: Runner, port: int, path: str, seconds: float, token: str | None) -> str:
    ran = await run(catalogue.reads.dashboard_get(port, path, seconds, token), seconds)
    return _answer(path, ran, token)


class DashboardSilent(Exception):
    """The dashboard gave no usable answer (off, still starting, failing, or garbled)."""


class DashboardRefused(DashboardSilent):
    """Ray's token auth refused the read: a configuration problem, said in Ray's reading."""


async def read_ray(
    run: Runner, port: int, ray_status: bool, seconds: float, token: str | None = None
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
                *(_get(run, port, path, seconds, token) for path in paths), return_exceptions=True
            )
            nodes = answers[0]
            status = answers[1] if ray_status else None
            if isinstance(status, str) and ray_json.report_absent(status):
                try:
                    status = await _get(run, port, FORMATTED_STATUS_PATH, seconds, token)
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

"""Ray's dashboard read over real loopback HTTP by the command the head runs
(catalogue.reads.dashboard_get, run here): real Ray 2.60's answers (tests/fixtures/ray-http) read as
Ray, and a dashboard that is off, failing, slow, garbled or too large read as silent (the
caller then asks `ray status`), never as an exception."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sparkd.model.observed import RayState
from sparkd.shell import catalogue, ray_http
from tests.support.ray_reads import run_here

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ray-http"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def real(path: str) -> str:
    """The last body real Ray gave to `path` (filtered node list) in the killed-worker capture."""
    for line in reversed((FIXTURES / "E_kill_worker.jsonl").read_text().splitlines()):
        sample: dict[str, Any] = json.loads(line)
        if sample["path"].split("?")[0] == path and (
            "nodes" not in path or "filter" in sample["path"]
        ):
            body: str = sample["body"]
            return body
    raise AssertionError(path)


def answering(
    nodes: Handler, status: Handler
) -> Callable[[], Awaitable[tuple[web.AppRunner, int]]]:
    async def start() -> tuple[web.AppRunner, int]:
        app = web.Application()
        app.router.add_get("/api/v0/nodes", nodes)
        app.router.add_get("/api/cluster_status", status)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port: int = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner, port

    return start


def text(body: str, status: int = 200) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=body, status=status, content_type="application/json")

    return handle


async def read(nodes: Handler, status: Handler, settling: bool = True) -> Any:
    runner, port = await answering(nodes, status)()
    try:
        return await ray_http.read_ray(run_here, port, settling, 2.0)
    finally:
        await runner.cleanup()


async def test_real_answers_read_as_ray() -> None:
    seen: list[str] = []

    async def nodes(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        return web.Response(text=real("/api/v0/nodes"), content_type="application/json")

    ray = await read(nodes, text(real("/api/cluster_status")))
    assert isinstance(ray, RayState)
    assert [n.alive for n in ray.nodes] == [True] and ray.gpus_total == 1.0
    assert ray.gpus_usable == 1.0 and ray.ips_known
    assert seen == [ray_http.NODES_PATH]
    # A converged look asks the node list only.
    ray = await read(text(real("/api/v0/nodes")), text("not asked", 500), settling=False)
    assert isinstance(ray, RayState) and ray.gpus_usable is None


async def test_a_failing_cluster_status_leaves_the_usable_gpus_unknown() -> None:
    for status in (text("{}", 500), text("<html>", 200), text('{"result": false}', 200)):
        ray = await read(text(real("/api/v0/nodes")), status)
        assert isinstance(ray, RayState) and ray.gpus_usable is None


async def slow(request: web.Request) -> web.Response:
    await asyncio.sleep(4)  # past the read's 2 s
    return web.Response(text="late")


@pytest.mark.parametrize(
    "nodes",
    [
        text('{"result": false, "msg": "GCS unavailable", "data": {}}', 500),
        text("Too many requests", 429),
        text("<html>Bad Gateway</html>"),
        text('{"result": true, "data": {"result": {"result": [{"node_ip": "1"}]}}}'),
        slow,
        text("[" + "0," * ray_http.MAX_ANSWER + "0]"),
    ],
    ids=["500", "429", "html", "shape", "slow", "too_large"],
)
async def test_a_dashboard_that_does_not_answer_readably_is_silent(nodes: Handler) -> None:
    ray = await read(nodes, text(real("/api/cluster_status")))
    assert isinstance(ray, ray_http.DashboardSilent), ray


async def test_nothing_listening_is_silent() -> None:
    runner, port = await answering(text(""), text(""))()
    await runner.cleanup()
    ray = await ray_http.read_ray(run_here, port, True, 2.0)
    assert isinstance(ray, ray_http.DashboardSilent) and "refused" in str(ray)


def _v2(path: str, formatted: bool = False) -> str:
    """The last body real Ray gave to `path` with autoscaler v2 on (V2_head_start)."""
    for line in reversed((FIXTURES / "V2_head_start.jsonl").read_text().splitlines()):
        sample: dict[str, Any] = json.loads(line)
        if (
            sample["path"].split("?")[0] == path
            and sample["path"].endswith("format=1") == formatted
            and sample["status"] == 200
        ):
            body: str = sample["body"]
            return body
    raise AssertionError(path)


async def test_under_autoscaler_v2_the_usable_gpus_come_from_the_formatted_status() -> None:
    """v2 writes no report: `clusterStatus` is null for ever, which read as 0 usable GPUs and
    held the model in "Ray settling" for ever. The formatted status is asked then."""
    asked: list[str] = []

    async def status(request: web.Request) -> web.Response:
        asked.append(request.path_qs)
        formatted = request.query.get("format") == "1"
        body = _v2("/api/cluster_status", formatted)
        return web.Response(text=body, content_type="application/json")

    ray = await read(text(_v2("/api/v0/nodes")), status)
    assert isinstance(ray, RayState) and ray.gpus_total == 1.0
    assert ray.gpus_usable == 1.0
    assert asked == [ray_http.STATUS_PATH, ray_http.FORMATTED_STATUS_PATH]
    # Under v1 the report is there: the formatted status is not asked.
    asked.clear()
    ray = await read(text(real("/api/v0/nodes")), text(real("/api/cluster_status")))
    assert isinstance(ray, RayState) and ray.gpus_usable == 1.0


AUTH = json.loads((FIXTURES.parent / "ray-token-auth" / "answers.json").read_text())


def token_auth(token: str, inner: Handler) -> Handler:
    """Ray 2.60's `token_auth_middleware` (tests/fixtures/ray-token-auth: its statuses and
    bodies) in front of `inner`."""

    async def handle(request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        if not header:
            return web.Response(status=401, text=AUTH["missing"]["body"])
        if header != f"Bearer {token}":
            return web.Response(status=403, text=AUTH["invalid"]["body"])
        return await inner(request)

    return handle


async def read_with(token: str | None, served: str) -> Any:
    nodes = token_auth(served, text(real("/api/v0/nodes")))
    status = token_auth(served, text(real("/api/cluster_status")))
    runner, port = await answering(nodes, status)()
    try:
        return await ray_http.read_ray(run_here, port, True, 2.0, token)
    finally:
        await runner.cleanup()


async def test_token_goes_as_bearer_header() -> None:
    ray = await read_with("s3cret-token", "s3cret-token")
    assert isinstance(ray, RayState) and ray.gpus_usable == 1.0


@pytest.mark.parametrize(("token", "case"), [(None, "missing"), ("another-token", "invalid")])
async def test_token_refusal_is_said(token: str | None, case: str) -> None:
    ray = await read_with(token, "s3cret-token")
    assert isinstance(ray, ray_http.DashboardRefused)
    expected = AUTH[case]
    assert f"HTTP {expected['status']} {expected['body']}" in str(ray)
    assert "another-token" not in str(ray) and "s3cret" not in str(ray)


@pytest.mark.parametrize(
    ("ran", "said"),
    [
        (ray_http.Ran(126, ""), "forced command refused"),
        (ray_http.Ran(124, ""), "did not answer"),
        (ray_http.Ran(127, ""), "exit 127"),
        (ray_http.Ran(None, "timeout: `timeout` did not finish within 2s"), "not run"),
        (ray_http.Ran(5, "!TimeoutError\n"), "TimeoutError"),
        (ray_http.Ran(0, "HTTP 200"), "failed"),
        (ray_http.Ran(0, "HTTP x\n{}"), "unreadable"),
    ],
    ids=["wrapper", "timeout", "no_python", "ssh", "socket", "no_body", "status"],
)
async def test_a_read_that_did_not_run_through_is_silent_saying_why(
    ran: ray_http.Ran, said: str
) -> None:
    """An old wrapper that does not admit the reads, a host without python3, a timed-out or
    garbled read: silent (the CLI is read instead), never a refusal of Ray's."""

    async def run(remote: catalogue.remote.Remote, seconds: float) -> ray_http.Ran:
        return ran

    ray = await ray_http.read_ray(run, 8265, True, 2.0)
    assert type(ray) is ray_http.DashboardSilent and said in str(ray), ray

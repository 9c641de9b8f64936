"""The simulated head's Ray dashboard serves what real Ray 2.60's does (tests/fixtures/ray-http):
the same envelope, row and report shapes, raw numbers, and refused while no head runs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from sparkd.core.reading import ray_json
from sparkd.model.exits import DASHBOARD_REFUSED_EXIT
from sparkd.shell import catalogue
from sparkd.shell.ray_http import DASHBOARD_HOST, FORMATTED_STATUS_PATH, NODES_PATH, STATUS_PATH
from sparkd_sim.world import World
from tests.sim.steps import (
    clean_up,
    ray_head_command,
    ray_status,
    ray_worker_command,
    start_ray,
)
from tests.support.shapes import json_shape
from tests.support.sim import eventually, http, run

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "ray-http"


def real(path: str, filtered: bool = True) -> dict[str, Any]:
    """The last answer real Ray gave to `path` in the killed-worker capture."""
    for line in reversed((REAL / "E_kill_worker.jsonl").read_text().splitlines()):
        sample = json.loads(line)
        if sample["path"].split("?")[0] == path and ("filter" in sample["path"]) == filtered:
            document: dict[str, Any] = json.loads(sample["body"])
            return document
    raise AssertionError(f"no real answer to {path}")


async def get(world: World, head: asyncssh.SSHClientConnection, path: str) -> dict[str, Any]:
    status, body = await http(head, DASHBOARD_HOST, world.dashboard_port, "GET", path)
    assert status == 200, body
    document: dict[str, Any] = json.loads(body)
    return document


async def get_from_fresh_ray(
    world: World,
    head: asyncssh.SSHClientConnection,
    worker: asyncssh.SSHClientConnection,
    path: str,
) -> dict[str, Any]:
    """`path` from the dashboard of a Ray started afresh on both hosts."""
    await clean_up(world, head, worker)
    await start_ray(world, head, worker)
    return await get(world, head, path)


async def test_the_node_list_has_real_rays_shape(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    served = await get_from_fresh_ray(world, head, worker, NODES_PATH)
    want = real("/api/v0/nodes")
    assert json_shape({**served, "data": None}) == json_shape({**want, "data": None})
    listing, real_listing = served["data"]["result"], want["data"]["result"]
    assert sorted(listing) == sorted(real_listing)
    row, real_row = listing["result"][0], real_listing["result"][0]
    assert sorted(row) == sorted(real_row)
    # Raw numbers, not the CLI's `22.766 GiB`; the same resource names.
    resources = row["resources_total"]
    assert all(isinstance(v, float) for v in resources.values())
    named = {k if not k.startswith("node:") or "__" in k else "node:IP" for k in resources}
    real_named = {
        k if not k.startswith("node:") or "__" in k else "node:IP"
        for r in real_listing["result"]
        for k in r["resources_total"]
    }
    assert named <= real_named
    state = ray_json.parse_nodes(json.dumps(served))
    assert state is not None and state.gpus_total == 2.0
    assert {n.ip for n in state.nodes} == {h.state.data_ip for h in world.hosts.values()}


async def test_the_cluster_status_has_real_rays_shape(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    served = await get_from_fresh_ray(world, head, worker, STATUS_PATH)
    want = real("/api/cluster_status", filtered=False)
    assert sorted(served["data"]) == sorted(want["data"])
    report, real_report = served["data"]["clusterStatus"], want["data"]["clusterStatus"]
    assert set(report) <= set(real_report)
    for part in ("autoscalerReport", "loadMetricsReport"):
        assert set(report[part]) <= set(real_report[part]), part
    usage, real_usage = report["loadMetricsReport"]["usage"], real_report["loadMetricsReport"]
    assert set(usage) - {k for k in usage if k.startswith("node:1")} <= set(real_usage["usage"])
    # Node ids camel-cased as the dashboard does to every key (`node_<id>` -> `node<Id>`).
    for got in (report, real_report):
        ids = got["autoscalerReport"]["nodeTypeMapping"]
        active = got["autoscalerReport"]["activeNodes"]
        assert sorted(active) == sorted("node" + i.title() for i in ids)
    assert ray_json.parse_cluster_status(json.dumps(served)) == 2.0


@pytest.mark.parametrize("dashboard", ["", "--include-dashboard=false"])
async def test_refused_without_a_head_or_with_the_dashboard_off(
    world: World,
    head: asyncssh.SSHClientConnection,
    worker: asyncssh.SSHClientConnection,
    dashboard: str,
) -> None:
    await clean_up(world, head, worker)
    if dashboard:
        assert (await run(head, ray_head_command(world, dashboard))).exit_status == 0
    with pytest.raises(asyncssh.ChannelOpenError, match="refused"):
        await head.open_connection(DASHBOARD_HOST, world.dashboard_port)


async def test_the_heads_own_get_answers_as_the_dashboard_does(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    """sparkd's read (catalogue.reads.dashboard_get, run by the head's shell) gets what a client on
    the head's loopback gets: the dashboard's own answer, refused while no head runs."""
    await clean_up(world, head, worker)
    read = catalogue.reads.dashboard_get(world.dashboard_port, NODES_PATH, 10.0)
    refused = await run(head, read.command, read.stdin)
    assert refused.exit_status == DASHBOARD_REFUSED_EXIT, refused
    await start_ray(world, head, worker)
    done = await run(head, read.command, read.stdin)
    assert done.exit_status == 0, done
    first, _, body = done.stdout.partition("\n")
    assert first == "HTTP 200"
    assert json_shape(json.loads(body)) == json_shape(await get(world, head, NODES_PATH))
    state = ray_json.parse_nodes(body)
    assert state is not None and state.gpus_total == 2.0


def real_v2(formatted: bool) -> dict[str, Any]:
    """The last answer real Ray gave to `/api/cluster_status` under autoscaler v2."""
    for line in reversed((REAL / "V2_head_start.jsonl").read_text().splitlines()):
        sample = json.loads(line)
        path = sample["path"]
        wanted = path.startswith(STATUS_PATH) and path.endswith("format=1") == formatted
        if wanted and sample["status"] == 200:
            document: dict[str, Any] = json.loads(sample["body"])
            return document
    raise AssertionError("no real v2 answer")


def _headings(text: str) -> list[str]:
    """A `ray status` text's layout: its titles, without the nodes and amounts under them."""
    return [line for line in text.splitlines()[1:] if line and not line.startswith(" ")]


async def test_under_autoscaler_v2_the_status_is_real_rays(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    """With `RAY_enable_autoscaler_v2=1` in the head's env, `/api/cluster_status` has no report
    (v2 writes none), `?format=1` and `ray status` list idle nodes under `Idle:`, as real Ray
    2.60's (V2_head_start), and sparkd reads the usable GPUs from the formatted one."""
    await clean_up(world, head, worker)
    v2 = ray_head_command(world).replace(" -e ", " -e RAY_enable_autoscaler_v2=1 -e ", 1)
    assert (await run(head, v2)).exit_status == 0
    assert (await run(worker, ray_worker_command(world))).exit_status == 0

    async def two_gpus() -> bool:
        return " 0.0/2.0 GPU" in (await ray_status(head)).stdout

    await eventually(two_gpus)
    served = await get(world, head, STATUS_PATH)
    assert served == real_v2(formatted=False)
    assert ray_json.report_absent(json.dumps(served))
    formatted = await get(world, head, FORMATTED_STATUS_PATH)
    want = real_v2(formatted=True)
    assert sorted(formatted) == sorted(want) and formatted["msg"] == want["msg"]
    text = formatted["data"]["clusterStatus"]
    assert _headings(text) == _headings(want["data"]["clusterStatus"])
    assert ray_json.parse_formatted_status(json.dumps(formatted)) == 2.0
    idle = text.split("Idle:\n", 1)[1].split("Pending:", 1)[0]
    assert idle.count(" 1 node_") == 2
    assert _headings((await ray_status(head)).stdout) == _headings(text)


AUTH = json.loads((REAL.parent / "ray-token-auth" / "answers.json").read_text())


async def raw_get(
    world: World, head: asyncssh.SSHClientConnection, path: str, authorization: str | None
) -> tuple[int, str, str]:
    """(status, content type, body) of one GET, with `Authorization` when given."""
    reader, writer = await head.open_connection(DASHBOARD_HOST, world.dashboard_port)
    extra = f"Authorization: {authorization}\r\n" if authorization is not None else ""
    request = f"GET {path} HTTP/1.1\r\nHost: {DASHBOARD_HOST}\r\nConnection: close\r\n"
    writer.write(f"{request}{extra}\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    header, _, body = raw.partition(b"\r\n\r\n")
    lines = header.decode().split("\r\n")
    kind = next(v for n, _, v in (x.partition(": ") for x in lines[1:]) if n == "Content-Type")
    return int(lines[0].split(" ")[1]), kind, body.decode()


async def test_token_auth_answers_as_real_rays(
    world: World,
    head: asyncssh.SSHClientConnection,
    worker: asyncssh.SSHClientConnection,
    tmp_path: Path,
) -> None:
    """With `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN_PATH` naming a mounted file in the head's
    env, the dashboard answers as Ray 2.60's token middleware does (tests/fixtures/ray-token-auth:
    401 without the header, 403 with another token, the handler's answer with the file's)."""
    (tmp_path / "auth_token").write_text("sim-ray-token\n")
    await clean_up(world, head, worker)
    command = ray_head_command(world).replace(
        " -e ",
        " -e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH=/run/ray/auth_token "
        f"-v {tmp_path}:/run/ray:ro -e ",
        1,
    )
    assert (await run(head, command)).exit_status == 0

    async def answers() -> bool:
        try:
            return (await raw_get(world, head, "/api/healthz", None))[0] != 401
        except (asyncssh.ChannelOpenError, OSError):
            return False

    await eventually(answers)
    for authorization, case in ((None, "missing"), ("Bearer another", "invalid")):
        status, kind, body = await raw_get(world, head, NODES_PATH, authorization)
        assert (status, body) == (AUTH[case]["status"], AUTH[case]["body"])
        assert kind.startswith(AUTH["content_type"])
    status, _, body = await raw_get(world, head, NODES_PATH, "Bearer sim-ray-token")
    assert status == 200 and ray_json.parse_nodes(body) is not None

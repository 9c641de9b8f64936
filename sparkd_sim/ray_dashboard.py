"""The head's Ray dashboard, as Ray 2.60 serves it (tests/fixtures/ray-http): the state API's
node list (`GET /api/v0/nodes`) and the autoscaler's cluster status (`GET /api/cluster_status`),
from the same `RayCluster` the simulated `ray` CLI prints.

One small HTTP/1.1 server per host; the world routes a channel to it only while a head with
the dashboard runs there and answers (before that, and with `--include-dashboard=false`, the
port is refused, as on a real head).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from sparkd_sim.ray_runtime import status_text
from sparkd_sim.state import RayCluster, RayNode
from sparkd_sim.timing import Timing

Answer = tuple[int, dict[str, object]]
# Ray's own default `--dashboard-port`.
DEFAULT_DASHBOARD = 8265
GIB = float(1 << 30)
MAX_REQUEST_HEAD = 16 << 10
# Ray 2.60's token auth, when the head runs with it: its middleware's statuses and bodies
# (python/ray/_private/authentication/http_token_authentication.py `token_auth_middleware`),
# and the paths it leaves open (python/ray/dashboard/http_server_head.py `public_exact_paths`,
# `public_path_prefixes`).
MISSING_TOKEN = "Unauthorized: Missing authentication token"  # noqa: S105 (a message)
INVALID_TOKEN = "Forbidden: Invalid authentication token"  # noqa: S105 (a message)
PUBLIC_PATHS = frozenset(
    {
        "/",
        "/favicon.ico",
        "/api/authentication_mode",
        "/api/authenticate",
        "/api/healthz",
        "/api/gcs_healthz",
        "/api/local_raylet_healthz",
        "/-/healthz",
    }
)
PUBLIC_PREFIXES = ("/static/",)


def refusal(cluster: RayCluster, target: str, authorization: str | None) -> tuple[int, str] | None:
    """Ray's token middleware: None lets the request through. Ray compares the whole header
    value with `Bearer <token>` (python/ray/dashboard/authentication_utils.py)."""
    path = urlsplit(target).path
    if cluster.auth_token is None or path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
        return None
    if not authorization:
        return 401, MISSING_TOKEN
    if authorization != f"Bearer {cluster.auth_token}":
        return 403, INVALID_TOKEN
    return None


def _authorization(head: bytes) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"authorization":
            return value.strip().decode("latin-1")
    return None


def _envelope(ok: bool, message: str, data: dict[str, object] | None) -> dict[str, object]:
    return {"result": ok, "msg": message, "data": data if data is not None else {}}


def _resources(node: RayNode) -> dict[str, object]:
    """The HTTP API gives raw numbers (bytes for memory), unlike the CLI's `22.766 GiB`."""
    resources: dict[str, object] = {
        "CPU": float(node.cpus),
        "memory": round(node.memory_gib * GIB, 1),
        f"node:{node.ip}": 1.0,
        "object_store_memory": round(node.object_store_gib * GIB, 1),
    }
    if node.gpus:
        resources["GPU"] = float(node.gpus)
    if node.is_head:
        resources["node:__internal_head__"] = 1.0
    return resources


def _matches(row: dict[str, object], key: str, predicate: str, value: str) -> bool:
    field = row.get(key)
    text = str(field).lower() if isinstance(field, bool) else str(field)
    equal = text.upper() == value.upper() if key == "state" else text == value
    return equal if predicate == "=" else not equal


def nodes(cluster: RayCluster, timing: Timing, query: dict[str, list[str]]) -> Answer:
    now = time.monotonic()
    try:
        limit = int(query.get("limit", ["100"])[0])
    except ValueError:
        return 500, _envelope(False, "invalid literal for int()", None)
    filters = list(
        zip(
            query.get("filter_keys", []),
            query.get("filter_predicates", []),
            query.get("filter_values", []),
            strict=False,
        )
    )
    rows = []
    for node in sorted(cluster.nodes, key=lambda n: n.node_id):
        state = node.state(now, timing)
        if state is not None:
            rows.append(node.listed(state, node.state_message(now, timing), _resources(node)))
    total = len(rows)
    kept = [r for r in rows if all(_matches(r, k, p, v) for k, p, v in filters)]
    listing = {
        "total": total,
        "num_after_truncation": total,
        "num_filtered": len(kept),
        "result": kept[:limit],
        "partial_failure_warning": "",
        "warnings": None,
    }
    return 200, _envelope(True, "", {"result": listing})


def _usage(counted: list[RayNode], gpus_in_use: float) -> dict[str, list[float]]:
    gpus = sum(n.gpus for n in counted)
    usage: dict[str, list[float]] = {
        "objectStoreMemory": [0.0, round(sum(n.object_store_gib for n in counted) * GIB, 1)],
        "memory": [0.0, round(sum(n.memory_gib for n in counted) * GIB, 1)],
        "CPU": [0.0, float(sum(n.cpus for n in counted))],
    }
    for ip in sorted({n.ip for n in counted}):
        usage[f"node:{ip}"] = [0.0, float(sum(1 for n in counted if n.ip == ip))]
    if gpus:
        usage["GPU"] = [min(gpus_in_use, gpus), float(gpus)]
    if any(n.is_head for n in counted):
        usage["node:InternalHead"] = [0.0, 1.0]
    return usage


def cluster_status(cluster: RayCluster, timing: Timing, formatted: bool = False) -> Answer:
    """`/api/cluster_status`: the report autoscaler v1 writes to Ray's KV, camel-cased; with
    `?format=1` the text `ray status` prints (ray 2.60 reporter_head.py `get_cluster_status`,
    which formats v2's status from the GCS: v2 writes no report)."""
    if formatted:
        text = status_text(cluster, timing)
        return 200, _envelope(True, "Got formatted cluster status.", {"clusterStatus": text})
    now = time.monotonic()
    head = next((n for n in cluster.nodes if n.is_head), None)
    if cluster.autoscaler_v2 or head is None or now < head.launched + head.counted_after:
        # The autoscaler has written no report yet (`ray status`: `No cluster status`).
        data: dict[str, object] = {
            "autoscalingStatus": None,
            "autoscalingError": None,
            "clusterStatus": None,
        }
        return 200, _envelope(True, "Got cluster status.", data)
    active = sorted((n for n in cluster.nodes if n.active(now, timing)), key=lambda n: n.node_id)
    counted = cluster.counted_nodes(now, timing)
    report = {
        "gcsRequestTime": 0.002,
        "time": time.time(),
        "autoscalerReport": {
            # The dashboard camel-cases every key, node ids in these included.
            "activeNodes": {"node" + n.node_id.title(): 1 for n in active},
            "idleNodes": None,
            "pendingNodes": [],
            "pendingLaunches": {},
            "failedNodes": [],
            "pendingResources": {},
            "nodeTypeMapping": {n.node_id: f"node_{n.node_id}" for n in active},
            "legacy": True,
        },
        "loadMetricsReport": {
            "usage": _usage(counted, cluster.gpus_in_use),
            "resourceDemand": [],
            "pgDemand": [],
            "requestDemand": [],
            "headIp": None,
            "usageByNode": {n.node_id: _usage([n], 0.0) for n in counted},
        },
    }
    ready: dict[str, object] = {"autoscalingStatus": None, "autoscalingError": None}
    ready["clusterStatus"] = report
    return 200, _envelope(True, "Got cluster status.", ready)


def answer(cluster: RayCluster, timing: Timing, target: str) -> Answer:
    parts = urlsplit(target)
    if parts.path == "/api/v0/nodes":
        return nodes(cluster, timing, parse_qs(parts.query))
    if parts.path == "/api/cluster_status":
        formatted = parse_qs(parts.query).get("format", ["0"])[0] == "1"
        return cluster_status(cluster, timing, formatted)
    return 404, {"message": "Not Found"}


@dataclass(eq=False)
class DashboardServer:
    """Serves the head's dashboard for whichever Ray head `find` names on its host."""

    address: str
    port: int
    find: Callable[[], RayCluster | None]
    timing: Timing
    # Ray's GCS hung (`hang-tool ray`): the state API waits on it, as `ray status` does.
    stalled: Callable[[], bool] = lambda: False
    _server: asyncio.Server | None = field(default=None, init=False)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.address, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > MAX_REQUEST_HEAD:
                return
            target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode("ascii", "replace")
            cluster = self.find()
            if cluster is None:
                return  # the head went away since the channel was routed: closed, no answer
            refused = refusal(cluster, target, _authorization(head))
            if refused is not None:
                # Answered by the middleware, before any handler waits on the GCS.
                status, text = refused
                said = text.encode()
                reason = {401: "Unauthorized", 403: "Forbidden"}[status]
                writer.write(
                    f"HTTP/1.1 {status} {reason}\r\n"
                    "Content-Type: text/plain; charset=utf-8\r\n"
                    f"Content-Length: {len(said)}\r\n"
                    "Server: Python/3.11 aiohttp/3.14.5\r\n\r\n".encode()
                    + said
                )
                await writer.drain()
                return
            if self.stalled():
                await reader.read()  # no answer, ever: until the client goes away
                return
            status, document = answer(cluster, self.timing, target)
            body = json.dumps(document).encode()
            reason = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\n"
                "Content-Type: application/json; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Server: Python/3.11 aiohttp/3.14.5\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, IndexError, OSError):
            pass
        finally:
            writer.close()

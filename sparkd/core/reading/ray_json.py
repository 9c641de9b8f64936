"""Ray's state as its dashboard serves it over HTTP (Ray 2.60, tests/fixtures/ray-http).

`GET /api/v0/nodes` is the state API `ray list nodes` asks; `GET /api/cluster_status` is the
autoscaler's report that `ray status` formats. Both answer `{"result": bool, "msg": str,
"data": {...}}`. Parsed totally: any other shape is None (unknown), never an exception.
"""

from __future__ import annotations

from typing import Any

from sparkd.core.reading import parsers
from sparkd.model.observed import RayState

# Ray's own default; the ALIVE filter applies before it (sparkd lists a few nodes).
NODES_LIMIT = 100


def _data(body: str) -> dict[str, Any] | None:
    """The `data` of a successful answer, or None."""
    document: Any = parsers.json_or_none(body)
    if not isinstance(document, dict) or document.get("result") is not True:
        return None
    data = document.get("data")
    return data if isinstance(data, dict) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_nodes(body: str) -> RayState | None:
    """`/api/v0/nodes`: `data.result` holds the rows and the counts. Rows cut by the limit
    (`num_filtered` above the rows given) are unknown: an ALIVE node may be the one cut."""
    data = _data(body)
    listing = data.get("result") if data is not None else None
    if not isinstance(listing, dict):
        return None
    rows = listing.get("result")
    filtered = _count(listing.get("num_filtered"))
    if not isinstance(rows, list) or filtered is None or filtered > len(rows):
        return None
    return parsers.ray_rows(rows)


def _field(mapping: dict[str, Any], name: str, camel: str) -> Any:
    """The dashboard turns the report's keys into camelCase; either spelling is read."""
    return mapping[camel] if camel in mapping else mapping.get(name)


def parse_cluster_status(body: str) -> float | None:
    """`/api/cluster_status`: the GPUs Ray can place on (`ray status`'s `Total Usage` line),
    from `data.clusterStatus.loadMetricsReport.usage.GPU`, `[used, total]`; a report without
    GPU is 0. No report (`clusterStatus` null) is None: the dashboard serves only what
    autoscaler v1 writes to Ray's KV, and v2 writes none, so under v2 (`RAY_enable_autoscaler_v2=1`)
    it is null for ever (ray 2.60 dashboard/modules/reporter/reporter_head.py
    `get_cluster_status`; reporter_agent.py: "Autoscaler v1 writes DEBUG_AUTOSCALING_STATUS to the
    internal KV; v2 does not"). `report_absent` tells that case; the formatted status says more.
    """
    data = _data(body)
    if data is None:
        return None
    status = _field(data, "cluster_status", "clusterStatus")
    if not isinstance(status, dict):
        return None
    report = _field(status, "load_metrics_report", "loadMetricsReport")
    usage = report.get("usage") if isinstance(report, dict) else None
    if not isinstance(usage, dict):
        return None
    gpu = usage.get("GPU")
    if gpu is None:
        return 0.0
    if not isinstance(gpu, list) or len(gpu) != 2 or parsers.gpu_count(gpu[0]) is None:
        return None
    return parsers.gpu_count(gpu[1])


def report_absent(body: str) -> bool:
    """A readable `/api/cluster_status` with no report in it (`clusterStatus` null): autoscaler
    v2, or v1 before its first report."""
    data = _data(body)
    return data is not None and _field(data, "cluster_status", "clusterStatus") is None


def parse_formatted_status(body: str) -> float | None:
    """`/api/cluster_status?format=1`: `data.clusterStatus` is the text `ray status` prints,
    formatted by the dashboard under either autoscaler (v2: from the GCS's own cluster status,
    ray 2.60 autoscaler/_private/commands.py `debug_status`); its GPU total, or 0 while Ray's
    services start (`No cluster status`)."""
    data = _data(body)
    text = _field(data, "cluster_status", "clusterStatus") if data is not None else None
    if not isinstance(text, str):
        return None
    state = parsers.parse_ray_status(text)
    return state.gpus_total if state is not None else None

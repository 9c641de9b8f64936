"""Ray's state as its dashboard serves it over HTTP (Ray 2.60, tests/fixtures/ray-http).

`GET /api/v0/nodes` is the state API `ray list nodes` asks; `GET /api/cluster_status` is the
autoscaler's report that `ray status` formats. Both answer `{"result": bool, "msg": str,
"data": {...}}`. Parsed totally: any other shape is None (unknown), never an exception.
"""

from __future__ import annotations

from typing import Any

from sparkd.core import parsers
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
    from `data.clusterStatus.loadMetricsReport.usage.GPU`, `[used, total]`. No report yet, or
    no GPU in it, is 0 (Ray's services still starting; `ray status` says `No cluster status`).
    """
    data = _data(body)
    if data is None:
        return None
    status = _field(data, "cluster_status", "clusterStatus")
    if status is None:
        return 0.0
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

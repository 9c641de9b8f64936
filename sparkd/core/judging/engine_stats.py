"""Whether vLLM exports its own metrics. Pure.

`vllm serve --disable-log-stats` makes no stat loggers (vLLM 0.32.0 `v1/engine/async_llm.py`
196-203), so `/metrics` has no `vllm:` family: requests running and the generation counter are
unknown, and with them hang detection and a timed-out probe's busy-or-hung. Both then read
unknown, never hung: this says why, once, instead of leaving every look silently unknown.
"""

from __future__ import annotations

from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import ModelEndpoint

FLAG = "--disable-log-stats"
EFFECT = "hang detection and busy-or-hung read unknown"


def flagged(extra_args: tuple[str, ...]) -> bool:
    """`--disable-log-stats` among the serve's arguments (vLLM's parser takes `_` for `-`)."""
    return any(arg.partition("=")[0].replace("_", "-") == FLAG for arg in extra_args)


def missing(cluster: ClusterSpec, endpoint: ModelEndpoint | None) -> str | None:
    """Why vLLM's `vllm:*` metrics are missing, or None when they are there or not yet known."""
    if flagged(cluster.model.extra_args):
        return f"model.extra_args has {FLAG}: vLLM exports no vllm:* metrics; {EFFECT}"
    if endpoint is not None and endpoint.vllm_metrics is False:
        return f"/metrics answers without any vllm:* family (vLLM started with {FLAG}?); {EFFECT}"
    return None

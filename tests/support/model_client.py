"""The model client reaching a simulated vLLM server on loopback, and the reference cluster with
its probe changed."""

from __future__ import annotations

import asyncio
from typing import Any

from sparkd.model.cluster import ClusterSpec
from sparkd.shell import model_http
from tests.toy import reference_cluster

MODEL = "/models/Qwen3.5-122B-A10B-FP8"


def opener_for(port: int) -> model_http.Opener:
    async def open_() -> model_http.Streams:
        try:
            return await asyncio.open_connection("127.0.0.1", port)
        except ConnectionRefusedError as exc:
            raise model_http.ChannelRefused(str(exc)) from None

    return open_


def cluster(**probe: Any) -> ClusterSpec:
    spec = reference_cluster()
    return spec.model_copy(update={"probe": spec.probe.model_copy(update=probe)})

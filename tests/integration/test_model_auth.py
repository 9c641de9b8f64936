"""The model channel with an API key: a refused key is `http_error`, and no exception text (which
can quote the request's headers) becomes a detail."""

from __future__ import annotations

import asyncio

from sparkd.shell import model_http
from sparkd_sim.vllm_server import ModelBehaviour, SimVllmServer
from tests.integration.test_model_http import MODEL, cluster, opener_for

KEY = "sk-served-1234abcd"


async def test_a_refused_key_is_http_error_and_the_right_one_is_up() -> None:
    srv = SimVllmServer(MODEL, ModelBehaviour(), api_key=KEY)
    await srv.start()
    try:
        spec = cluster()
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"port": srv.port})})
        wrong, _ = await model_http.read_endpoint(opener_for(srv.port), spec, "sk-rotated", 5)
        none, _ = await model_http.read_endpoint(opener_for(srv.port), spec, None, 5)
        right, _ = await model_http.read_endpoint(opener_for(srv.port), spec, KEY, 5)
        probe = await model_http.probe(opener_for(srv.port), spec, "sk-rotated")
    finally:
        await srv.stop()
    assert wrong.status == "http_error" and "401" in wrong.detail, wrong
    assert none.status == "http_error"
    assert "sk-rotated" not in wrong.model_dump_json()
    assert right.status == "up" and right.serves(MODEL), right
    assert probe.verdict.outcome == "http_error"


class _Echoing(Exception):
    pass


def echoing_opener(secret: str) -> model_http.Opener:
    async def open_() -> model_http.Streams:
        await asyncio.sleep(0)
        raise _Echoing(f"bad request: Authorization: Bearer {secret}; raw {secret}")

    return open_


async def test_exception_text_never_becomes_a_detail() -> None:
    spec = cluster()
    endpoint, _ = await model_http.read_endpoint(echoing_opener(KEY), spec, KEY, 5)
    probe = await model_http.probe(echoing_opener(KEY), spec, KEY)
    assert endpoint.status == "error" and "_Echoing" in endpoint.detail
    assert probe.verdict.outcome == "not_run" and "_Echoing" in probe.verdict.detail
    assert KEY not in endpoint.model_dump_json() + probe.model_dump_json()

"""The simulated vLLM server, over real HTTP on loopback, against the recorded vLLM samples."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sparkd_sim.vllm_schema import FieldNaming, parse_chat_request
from sparkd_sim.vllm_server import BUSY_SEQUENCES, ModelBehaviour, SimVllmServer
from sparkd_sim.vllm_text import (
    ANSWER_TEXT,
    AnswerStyle,
    plan_generation,
    prompt_tokens,
    reasoning_tokens,
    tokenize,
)

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples"
MODEL = "/models/Qwen3.5-122B-A10B-FP8"
PROMPT = [{"role": "user", "content": "Say hello in one sentence."}]
NAMINGS: tuple[FieldNaming, ...] = ("reasoning", "both", "reasoning_content")
REASONING_KEYS: dict[FieldNaming, set[str]] = {
    "reasoning": {"reasoning"},
    "both": {"reasoning", "reasoning_content"},
    "reasoning_content": {"reasoning_content"},
}


def sample(name: str) -> Any:
    return json.loads((SAMPLES / name).read_text())


def sample_for(naming: FieldNaming, style: AnswerStyle) -> Any:
    if naming == "both":
        return sample("vllm-chat-reasoning-only-legacy.json")
    if naming == "reasoning_content":
        return sample("vllm-chat-reasoning-content-only.json")
    if style == "answer":
        return sample("vllm-chat-answer.json")
    return sample("vllm-chat-reasoning-only.json")


def stream_sample() -> list[Any]:
    return [
        json.loads(e)
        for e in parse_sse((SAMPLES / "vllm-chat-stream-reasoning.txt").read_text())
        if e != "[DONE]"
    ]


def shape(obj: Any) -> Any:
    """Keys at every level; lists by their first element, leaves (null, str, number) alike."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    return None


def parse_sse(text: str) -> list[str]:
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            events.append(block[len("data: ") :])
    return events


def reasoning_of(message: dict[str, Any]) -> str | None:
    value = message.get("reasoning", message.get("reasoning_content"))
    return value if value is None else str(value)


@dataclass
class Served:
    server: SimVllmServer
    behaviour: ModelBehaviour
    session: aiohttp.ClientSession
    url: str

    def chat_body(self, **extra: Any) -> dict[str, Any]:
        return {"model": MODEL, "messages": PROMPT, "max_tokens": 50, "temperature": 0, **extra}

    async def chat(self, **extra: Any) -> tuple[int, str]:
        async with self.session.post(
            self.url + "/v1/chat/completions", json=self.chat_body(**extra)
        ) as resp:
            return resp.status, await resp.text()

    async def metric(self, name: str) -> float:
        async with self.session.get(self.url + "/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        for line in text.splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} not in /metrics")


async def wait_until(predicate: Callable[[], bool], within: float = 2.0) -> None:
    """Poll a condition briefly instead of sleeping for a fixed time."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    behaviour = ModelBehaviour(token_latency=0.0005, first_token_latency=0.002, slow_factor=4.0)
    server = SimVllmServer(MODEL, behaviour)
    await server.start()
    async with aiohttp.ClientSession() as session:
        yield Served(server, behaviour, session, f"http://127.0.0.1:{server.port}")
    await server.stop()


# --- pure parts ---------------------------------------------------------------------------------


def test_seed_prompt_counts_sixteen_tokens_and_tokens_join_back() -> None:
    assert prompt_tokens(PROMPT) == 16
    text = "Okay, the user wants me to say hello. That's simple!"
    assert "".join(tokenize(text)) == text


def test_reasoning_is_deterministic_varied_and_exactly_as_long_as_asked() -> None:
    long = reasoning_tokens(3000)
    assert len(long) == 3000
    assert reasoning_tokens(50) == long[:50]
    assert "".join(long[:3]) == "Okay, the"
    assert len(set(long)) > 50  # never a single repeated token


@pytest.mark.parametrize(
    ("style", "max_tokens", "finish", "completion"),
    [
        ("reasoning_only", 50, "length", 50),
        ("slow", 7, "length", 7),
        ("busy", 50, "length", 50),
        ("garbled", 50, "length", 50),
        ("empty", 50, "stop", 1),
        ("answer", 5, "length", 5),  # budget too small even for the thinking
    ],
)
def test_generation_plan(style: AnswerStyle, max_tokens: int, finish: str, completion: int) -> None:
    gen = plan_generation(style, max_tokens)
    assert (gen.finish_reason, len(gen.tokens)) == (finish, completion)


def test_answer_plan_closes_thinking_within_budget() -> None:
    gen = plan_generation("answer", 50)
    assert gen.finish_reason == "stop"
    assert gen.content == ANSWER_TEXT
    assert gen.reasoning
    assert len(gen.tokens) < 50


def test_request_validation_order_and_defaults() -> None:
    def parse(body: object, naming: FieldNaming = "reasoning") -> Any:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return parse_chat_request(raw, model_id=MODEL, max_model_len=100, naming=naming)

    ok = parse({"messages": PROMPT})  # no model: the served one; no max_tokens: what fits
    assert (ok.model, ok.max_tokens, ok.stream, ok.prompt_tokens) == (MODEL, 84, False, 16)
    assert parse({"messages": PROMPT, "max_completion_tokens": 9}).max_tokens == 9
    assert parse({"model": "x"}).status == 400  # schema before model name
    assert parse({"model": "x", "messages": PROMPT}).status == 404
    assert parse({"messages": PROMPT, "max_tokens": 0}).status == 400
    assert parse({"messages": PROMPT, "max_tokens": 85}).status == 400  # 16 + 85 > 100
    assert parse({"messages": PROMPT, "max_tokens": "5"}).status == 400
    assert parse({"messages": PROMPT, "stream_options": {"include_usage": True}}).status == 400
    assert parse({"messages": [{"content": "no role"}]}).status == 400
    assert parse([1, 2]).status == 400
    assert parse(b"{not json").status == 400


# --- chat completions over HTTP -----------------------------------------------------------------

STYLE_CASES: list[tuple[AnswerStyle, str, int]] = [
    ("reasoning_only", "length", 50),
    ("slow", "length", 50),
    ("busy", "length", 50),
    ("answer", "stop", 27),
    ("empty", "stop", 1),
    ("garbled", "length", 50),
]


@pytest.mark.parametrize("naming", NAMINGS)
@pytest.mark.parametrize(("style", "finish", "completion"), STYLE_CASES)
async def test_completion_matches_vllm_schema(
    served: Served, naming: FieldNaming, style: AnswerStyle, finish: str, completion: int
) -> None:
    served.behaviour.style = style
    served.behaviour.naming = naming
    status, text = await served.chat()
    assert status == 200
    body = json.loads(text)
    assert shape(body) == shape(sample_for(naming, style))
    choice = body["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == finish
    assert body["usage"] == {
        "prompt_tokens": 16,
        "completion_tokens": completion,
        "total_tokens": 16 + completion,
        "prompt_tokens_details": None,
    }
    assert REASONING_KEYS[naming] <= message.keys()
    assert len({message[k] for k in REASONING_KEYS[naming]}) == 1  # same text under each name
    reasoning = reasoning_of(message)
    if style == "answer":
        assert message["content"] == ANSWER_TEXT and reasoning
    elif style == "empty":
        assert message["content"] is None and reasoning is None
    elif style == "garbled":
        assert message["content"] == "!" * 50 and reasoning is None
    else:
        assert message["content"] is None
        assert reasoning is not None and reasoning.startswith("Okay, the user wants")


@pytest.mark.parametrize("naming", NAMINGS)
@pytest.mark.parametrize(("style", "finish", "completion"), STYLE_CASES)
async def test_stream_matches_vllm_sse_and_the_non_streaming_text(
    served: Served, naming: FieldNaming, style: AnswerStyle, finish: str, completion: int
) -> None:
    served.behaviour.style = style
    served.behaviour.naming = naming
    _, whole = await served.chat()
    expected = json.loads(whole)["choices"][0]["message"]
    status, text = await served.chat(stream=True, stream_options={"include_usage": True})
    assert status == 200
    events = parse_sse(text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    ref = stream_sample()
    role, *deltas, final, usage = chunks
    assert shape(role) == shape(ref[0])
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for chunk in deltas:
        assert chunk["choices"][0]["finish_reason"] is None
        assert chunk["choices"][0].keys() == ref[1]["choices"][0].keys()
    assert final["choices"][0].keys() == ref[3]["choices"][0].keys()
    assert final["choices"][0]["finish_reason"] == finish
    assert shape(usage) == shape(ref[4])
    assert usage["usage"]["completion_tokens"] == completion

    got: dict[str, str] = {}
    for chunk in [*deltas, final]:
        for key, value in chunk["choices"][0]["delta"].items():
            got[key] = got.get(key, "") + value
    assert (got.get("content") or None) == expected["content"]
    for key in REASONING_KEYS[naming]:
        assert (got.get(key) or None) == expected[key]
    assert set(got) <= REASONING_KEYS[naming] | {"content"}


async def test_stray_think_reads_as_vllm_032s_qwen3_parser_gives_it(served: Served) -> None:
    """Not streamed, split at the closer's text; streamed, everything stays in `reasoning`,
    closer included (tests/fixtures/vllm-parser, made by vLLM 0.32.0's own parser)."""
    parser = SAMPLES.parent / "vllm-parser"
    real = json.loads((parser / "qwen3-stray-think-close.json").read_text())
    served.behaviour.style = "stray_think"
    _, whole = await served.chat()
    body = json.loads(whole)
    message = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert message["content"] == real["choices"][0]["message"]["content"]
    assert "</think>" not in message["reasoning"]
    _, text = await served.chat(stream=True)
    got: dict[str, str] = {}
    for event in parse_sse(text)[:-1]:
        for key, value in json.loads(event)["choices"][0]["delta"].items():
            got[key] = got.get(key, "") + (value or "")
    assert not got.get("content")
    assert got["reasoning"].endswith("</think>\n\nHello! It's nice to meet you.")


async def test_stream_without_include_usage_has_no_usage_chunk(served: Served) -> None:
    _, text = await served.chat(stream=True)
    chunks = [json.loads(e) for e in parse_sse(text)[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_max_tokens_is_honoured(served: Served) -> None:
    _, text = await served.chat(max_tokens=7)
    body = json.loads(text)
    assert body["usage"]["completion_tokens"] == 7
    assert body["choices"][0]["message"]["reasoning"] == "".join(reasoning_tokens(7))


async def test_malformed_answers_200_with_a_body_that_is_not_json(served: Served) -> None:
    served.behaviour.style = "malformed"
    status, text = await served.chat()
    assert status == 200 and text.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    status, text = await served.chat(stream=True)
    events = parse_sse(text)
    assert status == 200 and "[DONE]" not in events
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[-1])


@pytest.mark.parametrize("naming", NAMINGS)
async def test_http_500_is_vllms_error_json(served: Served, naming: FieldNaming) -> None:
    served.behaviour.style = "http_500"
    served.behaviour.naming = naming
    status, text = await served.chat()
    body = json.loads(text)
    assert status == 500
    error = body if naming == "reasoning_content" else body["error"]
    assert (error["type"], error["code"], error["param"]) == ("InternalServerError", 500, None)


async def test_slow_stream_shows_time_to_first_token_before_the_end() -> None:
    behaviour = ModelBehaviour(
        style="slow", token_latency=0.002, first_token_latency=0.005, slow_factor=5.0
    )
    server = SimVllmServer(MODEL, behaviour)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            body = {"model": MODEL, "messages": PROMPT, "max_tokens": 40, "stream": True}
            start = time.monotonic()
            first = None
            async with session.post(
                f"http://127.0.0.1:{server.port}/v1/chat/completions", json=body
            ) as resp:
                async for line in resp.content:
                    if first is None and line.startswith(b"data: "):
                        first = time.monotonic() - start
            total = time.monotonic() - start
    finally:
        await server.stop()
    assert first is not None
    assert total >= 40 * 0.002 * 5.0  # slow_factor times the normal pace
    assert first < total / 4


# --- engine states ------------------------------------------------------------------------------


async def test_busy_counter_rises_while_a_request_goes_unanswered(served: Served) -> None:
    served.behaviour.style = "busy"
    served.behaviour.slow_factor = 200.0  # 50 tokens take ~5 s
    request = asyncio.create_task(served.chat())
    await wait_until(lambda: served.server.requests_running > BUSY_SEQUENCES)
    before = await served.metric("vllm:generation_tokens_total")
    running = await served.metric("vllm:num_requests_running")
    await asyncio.sleep(0.05)
    after = await served.metric("vllm:generation_tokens_total")
    assert not request.done()
    assert running == BUSY_SEQUENCES + 1
    assert after > before
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request


async def test_busy_load_stops_when_the_style_changes(served: Served) -> None:
    served.behaviour.style = "busy"
    await wait_until(lambda: served.server.generation_tokens_total > 0)
    served.behaviour.style = "reasoning_only"
    await asyncio.sleep(0.02)  # let the load loop see the change
    flat = served.server.generation_tokens_total
    await asyncio.sleep(0.03)
    assert served.server.generation_tokens_total == flat
    assert served.server.requests_running == 0


async def test_hung_engine_looks_up_but_never_answers(served: Served) -> None:
    served.behaviour.engine = "hung"
    async with served.session.get(served.url + "/health") as resp:
        assert resp.status == 200
    async with served.session.get(served.url + "/v1/models") as resp:
        assert resp.status == 200
    before = await served.metric("vllm:generation_tokens_total")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(served.chat(), 0.2)
    # The client gave up, but a stuck engine never processes the abort.
    await wait_until(lambda: served.server.requests_running == 1)
    assert await served.metric("vllm:num_requests_running") == 1
    assert await served.metric("vllm:generation_tokens_total") == before
    served.behaviour.engine = "ok"
    assert served.server.requests_running == 0


async def test_hung_engine_resumes_a_waiting_request(served: Served) -> None:
    served.behaviour.engine = "hung"
    request = asyncio.create_task(served.chat())
    await wait_until(lambda: served.server.requests_running == 1)
    await asyncio.sleep(0.05)
    assert not request.done()
    served.behaviour.engine = "ok"
    status, text = await asyncio.wait_for(request, 2.0)
    assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 50


async def test_dead_engine(served: Served) -> None:
    served.behaviour.engine = "dead"
    async with served.session.get(served.url + "/health") as resp:
        assert resp.status == 503
    status, text = await served.chat()
    # As real vLLM 0.32 answers (tests/fixtures/vllm-real/engine-dead-keepalive-chat-500.json).
    assert status == 500
    assert json.loads(text)["error"]["type"] == "InternalServerError"


async def test_engine_dying_mid_stream_sends_an_error_event(served: Served) -> None:
    served.behaviour.token_latency = 0.01
    async with served.session.post(
        served.url + "/v1/chat/completions", json=served.chat_body(stream=True)
    ) as resp:
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")  # the role chunk: generation has started
        served.behaviour.engine = "dead"
        events = parse_sse((await resp.read()).decode())
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == 500


async def test_engine_dying_mid_completion_is_a_500(served: Served) -> None:
    served.behaviour.token_latency = 0.01
    request = asyncio.create_task(served.chat())
    await wait_until(lambda: served.server.generation_tokens_total > 0)
    served.behaviour.engine = "dead"
    status, _ = await asyncio.wait_for(request, 2.0)
    assert status == 500


async def test_requests_running_counts_in_flight_completions(served: Served) -> None:
    served.behaviour.style = "slow"
    served.behaviour.slow_factor = 100.0
    tasks = [asyncio.create_task(served.chat()) for _ in range(3)]
    await wait_until(lambda: served.server.requests_running == 3)
    assert await served.metric("vllm:num_requests_running") == 3
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # A client that gives up aborts its request.
    await wait_until(lambda: served.server.requests_running == 0)


async def test_metrics_count_tokens_as_they_are_generated(served: Served) -> None:
    served.behaviour.token_latency = 0.005
    async with served.session.get(served.url + "/metrics") as resp:
        text = await resp.text()
    for name, kind in [
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
    ]:
        assert f"# TYPE {name} {kind}" in text
        assert f"# HELP {name} " in text
        assert f'{name}{{engine="0",model_name="{MODEL}"}}' in text
    request = asyncio.create_task(served.chat())
    await wait_until(lambda: served.server.generation_tokens_total > 0)
    assert not request.done()  # counted mid-generation, not only at the end
    await request
    assert await served.metric("vllm:generation_tokens_total") == 50
    assert await served.metric("vllm:prompt_tokens_total") == 16
    assert served.server.prompt_tokens_total == 16


# --- other routes and requests ------------------------------------------------------------------


async def test_models_list_matches_the_sample(served: Served) -> None:
    async with served.session.get(served.url + "/v1/models") as resp:
        body = await resp.json()
    assert shape(body) == shape(sample("vllm-models.json"))
    assert body["data"][0]["id"] == MODEL and body["data"][0]["root"] == MODEL
    assert body["data"][0]["max_model_len"] == 262144


async def test_health_is_an_empty_200(served: Served) -> None:
    async with served.session.get(served.url + "/health") as resp:
        assert (resp.status, await resp.read()) == (200, b"")


@pytest.mark.parametrize("naming", NAMINGS)
async def test_bad_body_and_wrong_model(served: Served, naming: FieldNaming) -> None:
    served.behaviour.naming = naming
    status, text = await served.chat(messages=None)
    error = json.loads(text)
    if naming == "reasoning_content":  # before vLLM 0.10.1: flat
        assert status == 400 and error["object"] == "error"
        assert (error["type"], error["code"], error["param"]) == ("BadRequestError", 400, None)
    else:
        assert status == 400 and set(error) == {"error"}
        assert (error["error"]["code"], error["error"]["param"]) == (400, None)
    assert "messages" in (error.get("message") or error["error"]["message"])

    status, text = await served.chat(model="other-model")
    error = json.loads(text)
    inner = error if naming == "reasoning_content" else error["error"]
    assert status == 404
    assert inner["message"] == "The model `other-model` does not exist."
    assert inner["type"] == "NotFoundError"


async def test_invalid_json_and_giant_bodies_are_refused(served: Served) -> None:
    async with served.session.post(served.url + "/v1/chat/completions", data=b"{oops") as resp:
        assert resp.status == 400
    giant = json.dumps(served.chat_body(messages=[{"role": "user", "content": "x" * (2 << 20)}]))
    async with served.session.post(served.url + "/v1/chat/completions", data=giant) as resp:
        assert resp.status == 413


async def test_unknown_route_is_a_fastapi_404(served: Served) -> None:
    async with served.session.get(served.url + "/v1/nothing") as resp:
        assert (resp.status, await resp.json()) == (404, {"detail": "Not Found"})


async def test_api_key() -> None:
    server = SimVllmServer(MODEL, ModelBehaviour(token_latency=0.0005), api_key="s3cret")
    await server.start()
    url = f"http://127.0.0.1:{server.port}"
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 5}
    try:
        async with aiohttp.ClientSession() as session:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                async with session.post(
                    url + "/v1/chat/completions", json=body, headers=headers
                ) as resp:
                    assert (resp.status, await resp.json()) == (401, {"error": "Unauthorized"})
            async with session.get(url + "/v1/models") as resp:
                assert resp.status == 401
            good = {"Authorization": "Bearer s3cret"}
            async with session.post(url + "/v1/chat/completions", json=body, headers=good) as resp:
                assert resp.status == 200
            for path in ("/health", "/metrics"):  # vLLM guards /v1 only
                async with session.get(url + path) as resp:
                    assert resp.status == 200
    finally:
        await server.stop()


async def test_stop_is_prompt_with_a_hung_request_in_flight(served: Served) -> None:
    served.behaviour.engine = "hung"
    request = asyncio.create_task(served.chat())
    streaming = asyncio.create_task(served.chat(stream=True))
    await wait_until(lambda: served.server.requests_running == 2)
    start = time.monotonic()
    await served.server.stop()
    took = time.monotonic() - start
    assert took < 0.5, took
    for task in (request, streaming):
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(task, 1.0)
    with pytest.raises(aiohttp.ClientConnectorError):
        await served.chat()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_connection_refused_until_started_on_an_explicit_port() -> None:
    port = free_port()
    server = SimVllmServer(MODEL, ModelBehaviour(), port=port)
    assert server.port == 0
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.get(f"http://127.0.0.1:{port}/health")
        assert await server.start() == port
        try:
            async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                assert resp.status == 200
        finally:
            await server.stop()
    with pytest.raises(RuntimeError):
        await server.start()


# --- a long prompt, as vLLM V1 prefills it (tests/fixtures/vllm-prefill/README.md) ------------

REAL_METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-real"


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Each metric family: its type and the label names its samples carry."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, tuple[str, frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        labels = frozenset(k for sample in family.samples for k in sample.labels)
        found[family.name] = (family.type, labels)
    return found


async def test_the_metrics_families_are_real_vllms(served: Served) -> None:
    """Every family the simulator exports is one a real vLLM 0.32.0 exports, with its type and
    label names (tests/fixtures/vllm-real/metrics-busy-4-running.txt), and those sparkd reads
    are all there."""
    real = families((REAL_METRICS / "metrics-busy-4-running.txt").read_text())
    async with served.session.get(served.url + "/metrics") as resp:
        ours = families(await resp.text())
    for name, shape in ours.items():
        assert real.get(name) == shape, (name, shape, real.get(name))
    read = {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:generation_tokens",
        "vllm:prompt_tokens",
        "vllm:kv_cache_usage_perc",
    }
    assert read <= set(ours), read - set(ours)


async def test_a_long_prompt_moves_only_the_kv_cache_while_it_is_prefilled(
    served: Served,
) -> None:
    served.behaviour.prefill_rate = 20_000.0  # 60k tokens: 3 s
    before = await served.metric("vllm:kv_cache_usage_perc")
    served.server.send_prompt(60_000)
    await asyncio.sleep(0.3)
    first = {
        name: await served.metric(name)
        for name in (
            "vllm:kv_cache_usage_perc",
            "vllm:generation_tokens_total",
            "vllm:prompt_tokens_total",
            "vllm:num_requests_running",
        )
    }
    await asyncio.sleep(0.5)
    assert await served.metric("vllm:num_requests_running") == 1
    assert await served.metric("vllm:generation_tokens_total") == 0
    assert await served.metric("vllm:prompt_tokens_total") == 0
    assert first["vllm:num_requests_running"] == 1
    assert (
        before < first["vllm:kv_cache_usage_perc"] < await served.metric("vllm:kv_cache_usage_perc")
    )
    # A request that arrives meanwhile waits behind the prefill.
    probe = asyncio.create_task(served.chat())
    deadline = time.monotonic() + 2
    while await served.metric("vllm:num_requests_waiting") != 1:
        assert time.monotonic() < deadline, "the probe never waited"
        await asyncio.sleep(0.01)
    assert await served.metric("vllm:num_requests_running") == 1
    assert not probe.done()
    status, _ = await asyncio.wait_for(probe, 10)
    assert status == 200
    # Counted when the prefill ended, with its first token.
    await wait_until(lambda: served.server.requests_running == 0, within=5)
    assert served.server.prompt_tokens_total == 60_000 + 16
    assert served.server.generation_tokens_total == 16 + 50
    assert served.server.kv_cache_usage == 0


async def test_a_hung_engine_moves_no_figure(served: Served) -> None:
    """Nothing a hung engine shows moves, the KV cache included: not even when the clients of
    its stuck requests give up (it processes no abort) until it steps again."""
    served.behaviour.token_latency = 0.01
    request = asyncio.create_task(served.chat())
    await wait_until(lambda: served.server.generation_tokens_total > 0)
    served.behaviour.engine = "hung"
    await asyncio.sleep(0.05)
    held = served.server.kv_cache_usage
    assert held > 0
    request.cancel()
    await asyncio.gather(request, return_exceptions=True)
    await asyncio.sleep(0.05)
    assert served.server.kv_cache_usage == held
    served.behaviour.engine = "ok"
    assert served.server.kv_cache_usage == 0


async def test_a_prompt_longer_than_max_model_len_is_refused(served: Served) -> None:
    with pytest.raises(ValueError, match="does not fit"):
        served.server.send_prompt(262144)

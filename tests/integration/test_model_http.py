"""The model client and the probe against the simulated vLLM server over real loopback HTTP."""

from __future__ import annotations

import asyncio
import socket
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sparkd.core.reading.classify import EngineLoad
from sparkd.model.cluster import ClusterSpec, RolloutCheck
from sparkd.shell import model_http
from sparkd_sim.vllm_server import ModelBehaviour, SimVllmServer
from tests.support.model_client import MODEL, cluster, opener_for
from tests.toy import reference_cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
async def server() -> AsyncIterator[tuple[SimVllmServer, ModelBehaviour]]:
    behaviour = ModelBehaviour()
    srv = SimVllmServer(MODEL, behaviour)
    await srv.start()
    yield srv, behaviour
    await srv.stop()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("naming", ["reasoning", "both", "reasoning_content"])
async def test_probe_reasoning_only(server: Any, stream: bool, naming: str) -> None:
    srv, behaviour = server
    behaviour.naming = naming
    result = await model_http.probe(opener_for(srv.port), cluster(stream=stream), None)
    assert result.verdict.outcome == "reasoning_only"
    assert result.verdict.completion_tokens == 50
    assert result.verdict.finish_reason == "length"
    assert result.latency_seconds is not None and result.latency_seconds > 0
    if stream:
        assert result.ttft_seconds is not None and result.ttft_seconds <= result.latency_seconds


@pytest.mark.parametrize(
    ("style", "outcome"),
    [
        ("answer", "answer"),
        ("empty", "empty"),
        ("malformed", "malformed"),
        ("http_500", "http_error"),
        ("garbled", "garbled"),
    ],
)
async def test_probe_styles(server: Any, style: str, outcome: str) -> None:
    srv, behaviour = server
    behaviour.style = style
    result = await model_http.probe(opener_for(srv.port), cluster(), None)
    assert result.verdict.outcome == outcome


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_after_a_stray_think_close_is_healthy(server: Any, stream: bool) -> None:
    srv, behaviour = server
    behaviour.style = "stray_think"
    result = await model_http.probe(opener_for(srv.port), cluster(stream=stream), None)
    assert (result.verdict.outcome, result.verdict.healthy) == ("answer", True), result.verdict
    assert "Hello! It's nice to meet you." in result.verdict.detail


async def test_busy_is_told_from_hung(server: Any) -> None:
    srv, behaviour = server
    behaviour.style = "busy"
    busy = await model_http.probe(opener_for(srv.port), cluster(timeout=0.3), None)
    assert (busy.verdict.outcome, busy.tokens_advanced, busy.busy) == ("timeout", True, True)
    assert "other request(s) in the engine" in busy.verdict.detail
    behaviour.style = "reasoning_only"
    behaviour.engine = "hung"
    hung = await model_http.probe(opener_for(srv.port), cluster(timeout=0.3), None)
    assert (hung.verdict.outcome, hung.tokens_advanced, hung.busy) == ("timeout", False, False)


async def test_an_acceptance_check_that_meets_peak_load_says_nothing_of_the_spec(
    server: Any,
) -> None:
    """A rollout's check timing out while vLLM decodes other requests is no failed check (it
    would roll the spec back); on a hung engine it still fails."""
    srv, behaviour = server
    spec = cluster(timeout=0.3)
    checks = (RolloutCheck(prompt="Say hello in one sentence."),)
    spec = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"checks": checks})})
    behaviour.style = "busy"
    [busy] = await model_http.run_checks(opener_for(srv.port), spec, None)
    assert busy.ok is None and "overloaded" in busy.detail, busy
    behaviour.style = "reasoning_only"
    behaviour.engine = "hung"
    [hung] = await model_http.run_checks(opener_for(srv.port), spec, None)
    assert hung.ok is False and "no answer in time" in hung.detail, hung


async def test_a_hung_engine_stays_hung_with_earlier_probes_stuck_in_it(server: Any) -> None:
    # A hung engine never processes aborts: each timed-out probe stays counted as running, and
    # those requests are no one's work.
    srv, behaviour = server
    behaviour.engine = "hung"
    for stuck in range(3):
        result = await model_http.probe(opener_for(srv.port), cluster(timeout=0.2), None)
        assert (result.verdict.outcome, result.busy) == ("timeout", False), result.verdict
        assert srv.requests_running == stuck + 1


async def test_a_slow_model_alone_is_not_busy(server: Any) -> None:
    # The counter rises, but only by the probe's own tokens: nobody else is being served.
    srv, behaviour = server
    behaviour.style = "slow"
    result = await model_http.probe(opener_for(srv.port), cluster(timeout=0.4), None)
    assert result.verdict.outcome == "timeout"
    assert srv.generation_tokens_total > 0
    assert (result.tokens_advanced, result.busy) == (False, False)
    assert "only the probe's request" in result.verdict.detail


class MetricsCounting(SimVllmServer):
    reads = 0

    async def _metrics(self, request: web.Request) -> web.Response:
        self.reads += 1
        return await super()._metrics(request)


@pytest.mark.parametrize(("style", "reads"), [("reasoning_only", 1), ("busy", 2), ("slow", 2)])
async def test_metrics_read_once_before_and_at_most_once_after(style: str, reads: int) -> None:
    srv = MetricsCounting(MODEL, ModelBehaviour(style=style))  # type: ignore[arg-type]
    await srv.start()
    try:
        await model_http.probe(opener_for(srv.port), cluster(timeout=0.3), None)
    finally:
        await srv.stop()
    assert srv.reads == reads


async def test_a_cycle_reads_metrics_once_and_asks_its_questions_at_once() -> None:
    # /health, /v1/models and /metrics go together; the probe starts from that /metrics read.
    srv = MetricsCounting(MODEL, ModelBehaviour())
    await srv.start()
    open_ = opener_for(srv.port)
    steps: list[str] = []

    async def counting() -> model_http.Streams:
        steps.append("open")
        streams = await open_()
        steps.append("connected")
        return streams

    try:
        endpoint, load = await model_http.read_endpoint(counting, cluster(), None, 2)
        assert endpoint.status == "up" and load is not None
        assert steps.count("open") == 3 and srv.reads == 1
        # Not one after another: all three under way before any connected. (Not by the clock:
        # a loaded machine can pause the process between two of them.)
        assert steps[:3] == ["open"] * 3, steps
        result = await model_http.probe(counting, cluster(), None, load_before=load)
    finally:
        await srv.stop()
    assert result.verdict.outcome == "reasoning_only"
    assert srv.reads == 1 and steps.count("open") == 4
    posts = [r for r in srv.served if r.method == "POST"]
    assert len(posts) == 1 and result.latency_seconds is not None
    assert result.latency_seconds >= posts[0].seconds


async def test_a_failing_request_cancels_the_others() -> None:
    started: list[str] = []

    async def refused_after_the_first() -> model_http.Streams:
        started.append("open")
        if len(started) > 1:
            raise model_http.ChannelRefused("connection refused")
        await asyncio.sleep(30)
        raise AssertionError("not cancelled")

    endpoint, load = await asyncio.wait_for(
        model_http.read_endpoint(refused_after_the_first, cluster(), None, 10), 5
    )
    assert (endpoint.status, load) == ("refused", None)


async def test_refused_when_nothing_listens() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = await model_http.probe(opener_for(port), cluster(), None)
    assert result.verdict.outcome == "refused"
    endpoint, _ = await model_http.read_endpoint(opener_for(port), cluster(), None, 2)
    assert endpoint.status == "refused"


async def test_not_run_when_the_channel_cannot_open() -> None:
    async def broken() -> model_http.Streams:
        raise model_http.ChannelUnavailable("SSH connection to spark-a lost")

    result = await model_http.probe(broken, cluster(), None)
    assert (result.verdict.outcome, result.verdict.healthy) == ("not_run", None)


async def test_observe_endpoint(server: Any) -> None:
    srv, _ = server
    endpoint, _ = await model_http.read_endpoint(opener_for(srv.port), cluster(), None, 2)
    assert endpoint.serves(MODEL)
    assert endpoint.requests_running == 0
    assert endpoint.generation_tokens_total is not None


def served_as(*flags: str) -> ClusterSpec:
    spec = reference_cluster()
    extra = (*spec.model.extra_args, *flags)
    return spec.model_copy(update={"model": spec.model.model_copy(update={"extra_args": extra})})


@pytest.mark.parametrize(
    "flags",
    [
        ("--served-model-name", "qwen"),
        ("--served-model-name=qwen",),
        ("--served-model-name", "qwen", "qwen-122b"),
    ],
)
async def test_served_model_name_is_listed_and_asked_for(flags: tuple[str, ...]) -> None:
    # vLLM started with --served-model-name lists that name, not the path, and answers 404 to
    # a request that names the path.
    srv = SimVllmServer("qwen", ModelBehaviour())
    await srv.start()
    try:
        named = served_as(*flags)
        endpoint, _ = await model_http.read_endpoint(opener_for(srv.port), named, None, 2)
        asked = await model_http.probe(opener_for(srv.port), named, None)
        by_path = await model_http.probe(opener_for(srv.port), cluster(), None)
    finally:
        await srv.stop()
    assert endpoint.serves(named.model.served_name)
    assert not endpoint.serves(named.model.id)
    assert asked.verdict.outcome == "reasoning_only"
    assert by_path.verdict.outcome == "http_error"
    assert "404" in by_path.verdict.detail


async def test_api_key_is_sent() -> None:
    srv = SimVllmServer(MODEL, ModelBehaviour(), api_key="k-123")
    await srv.start()
    try:
        denied = await model_http.probe(opener_for(srv.port), cluster(), None)
        allowed = await model_http.probe(opener_for(srv.port), cluster(), "k-123")
    finally:
        await srv.stop()
    assert denied.verdict.outcome == "http_error"
    assert allowed.verdict.outcome == "reasoning_only"


def test_vllm_metrics_parsing() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 1234.0\n'
        'vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9\n'
    )
    assert model_http.parse_vllm_metrics(text) == EngineLoad(4.0, 2.0, 1234.0)
    assert model_http.parse_vllm_metrics("") == EngineLoad()


def test_real_vllm_metrics_give_the_kv_cache_and_prompt_tokens() -> None:
    """What moves while a long prompt is prefilled (core.judging.hang) is read from a real vLLM
    0.32.0 capture (tests/fixtures/vllm-real, four requests running)."""
    text = (FIXTURES / "vllm-real" / "metrics-busy-4-running.txt").read_text()
    assert model_http.parse_vllm_metrics(text) == EngineLoad(
        running=4.0,
        waiting=0.0,
        generation_tokens=2147.0,
        prompt_tokens=288.0,
        kv_cache_usage=0.0009766221082829762,
    )


def test_the_served_models_max_model_len_is_read() -> None:
    body = (FIXTURES / "vllm-real" / "v1-models.json").read_bytes()
    assert model_http.listed_max_model_len(body, "tiny-qwen3") == 512
    assert model_http.listed_max_model_len(body, "another") is None
    boolean = b'{"data":[{"id":"m","max_model_len":true}]}'
    assert model_http.listed_max_model_len(boolean, "m") is None
    assert model_http.listed_max_model_len(b"[]", "m") is None


async def test_the_simulated_servers_metrics_parse(server: Any) -> None:
    srv, behaviour = server
    behaviour.style = "busy"
    response = await model_http.request(opener_for(srv.port), "GET", "x", "/metrics")
    load = model_http.parse_vllm_metrics(response.body.decode())
    assert load.running is not None and load.running > 0
    assert load.waiting == 0
    assert load.generation_tokens is not None


async def hostile_server(models: bytes, metrics: bytes) -> tuple[web.AppRunner, int]:
    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def listed(_: web.Request) -> web.Response:
        return web.Response(body=models, content_type="application/json")

    async def exported(_: web.Request) -> web.Response:
        return web.Response(body=metrics, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", listed)
    app.router.add_get("/metrics", exported)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


@pytest.mark.parametrize(
    ("models", "metrics"),
    [
        (b'{"data": 5}', b"vllm:num_requests_running NaN\n"),
        (b"[1, 2, 3]", b"\xff\xfe not metrics at all {{{"),
        (b'{"data": [{"id": 5}, "x", {"id": "m"}]}', b"vllm:generation_tokens_total 1e999\n"),
        (b"[" * 5000, b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{\n"),
        (b'{"data": [{"id": "' + b"\xc2\xb2" * 1000 + b'"}]}', b""),
    ],
)
async def test_a_hostile_model_server_reads_as_values(models: bytes, metrics: bytes) -> None:
    runner, port = await hostile_server(models, metrics)
    try:
        endpoint, _ = await model_http.read_endpoint(opener_for(port), cluster(), None, 5)
    finally:
        await runner.cleanup()
    assert endpoint.status == "up"
    assert all(isinstance(m, str) and len(m) <= 512 for m in endpoint.models)
    assert not endpoint.serves(MODEL)


async def endless_stream(line: bytes, total: int) -> tuple[asyncio.Server, int, list[int]]:
    """An SSE endpoint that sends `line` again and again, up to `total` bytes; `sent` says how
    many it got out before the client hung up."""
    sent = [0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        try:
            while sent[0] < total:
                writer.write(line)
                await writer.drain()
                sent[0] += len(line)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], sent


@pytest.mark.parametrize(
    "line",
    [
        b"data: " + b"x" * (512 << 10) + b"\n",  # long lines, each under the old 1 MiB cap
        b"data: " + b"y" * (64 << 10),  # one line without end
    ],
    ids=["long-lines", "endless-line"],
)
async def test_a_streamed_probe_is_bounded_in_total(line: bytes) -> None:
    total = 48 << 20
    server, port, sent = await endless_stream(line, total)
    tracemalloc.start()
    try:
        result = await model_http.probe(opener_for(port), cluster(stream=True, timeout=30.0), None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        server.close()
        await server.wait_closed()
    assert not result.verdict.healthy
    assert "stream" in result.verdict.detail
    # Cut off near the 1 MiB cap (plus what the socket buffers held), far below what was offered.
    assert sent[0] < 16 << 20, sent[0]
    assert peak < 16 << 20, peak


async def one_answer(head: bytes, body: bytes) -> tuple[asyncio.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


SSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"


@pytest.mark.parametrize(
    ("stream", "body"),
    [
        (True, b'data: {"choices": 5}\n\ndata: [DONE]\n\n'),
        (True, b'data: {"choices": [{"delta": "x"}]}\n\ndata: [DONE]\n\n'),
        (True, b'data: {"choices": [{"delta": ["x"]}]}\n\ndata: [DONE]\n\n'),
        (True, b"data: " + b"[" * 30_000 + b"\n\ndata: [DONE]\n\n"),
        (False, b"[" * 30_000),
    ],
    ids=["choices-number", "delta-text", "delta-list", "deep-chunk", "deep-body"],
)
async def test_a_model_answering_garbage_is_a_counted_failure_not_not_run(
    stream: bool, body: bytes
) -> None:
    head = SSE if stream else b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    server, port = await one_answer(head, body)
    try:
        result = await model_http.probe(opener_for(port), cluster(stream=stream), None)
    finally:
        server.close()
        await server.wait_closed()
    assert result.outcome == "malformed", result.verdict
    assert result.verdict.healthy is False


@pytest.mark.parametrize("log_stats", [True, False])
async def test_metrics_without_any_vllm_family_are_told_apart(log_stats: bool) -> None:
    # `--disable-log-stats`: /metrics still answers 200, with the process's families only.
    srv = SimVllmServer(MODEL, ModelBehaviour(), log_stats=log_stats)
    await srv.start()
    try:
        endpoint, load = await model_http.read_endpoint(opener_for(srv.port), cluster(), None, 2)
    finally:
        await srv.stop()
    assert endpoint.serves(MODEL)
    assert endpoint.vllm_metrics is log_stats
    assert (endpoint.requests_running is None) is not log_stats
    assert load is not None


def test_the_real_metrics_with_and_without_log_stats() -> None:
    # vLLM 0.32's real /metrics, and what `--disable-log-stats` leaves of it
    # (tests/fixtures/vllm-log-stats).
    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    assert model_http.has_vllm_family((fixtures / "vllm-real" / "metrics-idle.txt").read_text())
    without = (fixtures / "vllm-log-stats" / "metrics-disable-log-stats.txt").read_text()
    assert not model_http.has_vllm_family(without)
    assert model_http.parse_vllm_metrics(without) == EngineLoad()

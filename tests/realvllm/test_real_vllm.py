"""sparkd's model client against a real `vllm serve`: the probe and the endpoint read over an SSH
channel through a real sshd, the load read from the real log, and what the planner makes of the
readings. One server for the module's scenarios (a start costs 40-100 s and ~3 GB), the
destructive ones last."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from sparkd.core.deciding.planner import plan
from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import ENGINE_MARKERS
from sparkd.core.reading.classify import classify_response
from sparkd.model.memory import Memory
from sparkd.model.observed import ModelEndpoint
from sparkd.model.probe import ProbeResult
from sparkd.shell import model_http
from sparkd.shell.ssh import HostConnection
from tests.examples import EXAMPLE_SET
from tests.realvllm.conftest import Reached, args_of, cluster_for, serving
from tests.support.sshd import RealSshd
from tests.toy import Toy

pytestmark = [pytest.mark.realvllm, pytest.mark.asyncio(loop_scope="module")]
KEY = "sk-real-vllm-5e1d"


@dataclass
class Look:
    """One look during the load, as sparkd takes it: the endpoint over SSH, the log's stage."""

    at: float
    endpoint: str
    stage: str
    percent: float | None


@dataclass
class Loaded(Reached):
    looks: list[Look] = field(default_factory=list)


async def watch_load(reached: Reached, looks: list[Look]) -> None:
    server = reached.server
    while True:
        endpoint, _ = await model_http.read_endpoint(reached.opener(), reached.cluster, None, 5)
        text = server.log.read_text(errors="replace") if server.log.exists() else ""
        progress = parsers.parse_load_progress(parsers.log_lines(text), None)
        looks.append(Look(time.monotonic(), endpoint.status, progress.stage, progress.percent))
        if endpoint.serves(reached.cluster.model.served_name):
            return
        await asyncio.sleep(0.3)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plain(
    tiny_model: Path, sshd_module: RealSshd, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Loaded]:
    with serving(tiny_model, tmp_path_factory.mktemp("vllm"), 2) as server:
        cluster = cluster_for(sshd_module, server)
        conn = HostConnection(cluster.head, cluster.ssh)
        loaded = Loaded(server, cluster, conn)
        try:
            await asyncio.wait_for(watch_load(loaded, loaded.looks), 600)
            yield loaded
        finally:
            await conn.close()


def healthy_toy() -> tuple[Toy, Memory]:
    """The toy cluster converged and serving, with the memory of its launch."""
    return next(e for e in EXAMPLE_SET if e.name == "healthy-reasoning-only").build()


async def test_the_load_refuses_until_ready_and_the_real_log_reads_as_progress(
    plain: Loaded,
) -> None:
    looks = plain.looks
    assert len(looks) >= 3, looks
    # The port refuses while the model loads (vLLM listens only once ready): never 503 or
    # any other answer before it serves.
    assert {look.endpoint for look in looks[:-1]} == {"refused"}, looks
    assert looks[-1].endpoint == "up"
    stages = [look.stage for look in looks]
    order = ["starting", "weights", "graph_capture", "ready"]
    assert [order.index(s) for s in stages] == sorted(order.index(s) for s in stages), stages
    assert stages[-1] == "ready"
    text = plain.server.log.read_text(errors="replace")
    lines = parsers.log_lines(text)
    weights = [ln for ln in lines if "Loading safetensors checkpoint shards" in ln]
    assert weights and "100% Completed" in weights[-1]
    # The real ready lines, as they are printed (vLLM 0.32 has no `Uvicorn running on`).
    assert any("Application startup complete." in ln for ln in lines)
    assert any("Starting vLLM server on http://" in ln for ln in lines)
    # A ready log with a refused port is not a serving model (see the port-taken test).
    refused = ModelEndpoint(status="refused", detail="connection refused")
    assert not refused.serves(plain.cluster.model.served_name)


async def test_the_seed_probe_is_reasoning_only_and_healthy(plain: Loaded) -> None:
    result = await model_http.probe(plain.opener(), plain.cluster, None)
    verdict = result.verdict
    assert (verdict.outcome, verdict.healthy) == ("reasoning_only", True), verdict
    assert (verdict.completion_tokens, verdict.finish_reason) == (50, "length")
    assert result.http_status == 200
    assert result.latency_seconds is not None and result.latency_seconds < 30
    # What the planner makes of it on an otherwise healthy cluster: nothing to do.
    toy, memory = healthy_toy()
    seen = toy.observe().model_copy(update={"probe": result.model_copy(update={"at": toy.now})})
    decided = plan(toy.cluster, seen, memory, toy.now)
    assert decided.phase == "healthy" and not decided.actions, decided.reason


async def test_a_streamed_probe_reads_reasoning_deltas_and_the_first_token(plain: Loaded) -> None:
    cluster = plain.cluster.model_copy(
        update={"probe": plain.cluster.probe.model_copy(update={"stream": True})}
    )
    result = await model_http.probe(plain.opener(cluster), cluster, None)
    verdict = result.verdict
    assert (verdict.outcome, verdict.healthy) == ("reasoning_only", True), verdict
    assert verdict.completion_tokens == 50 and verdict.finish_reason == "length"
    assert result.ttft_seconds is not None and result.latency_seconds is not None
    assert 0 < result.ttft_seconds <= result.latency_seconds


async def test_thinking_turned_off_answers_in_content(plain: Loaded) -> None:
    body = {
        "model": plain.cluster.model.served_name,
        "messages": [{"role": "user", "content": plain.cluster.probe.prompt}],
        "max_tokens": 50,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    authority = f"{plain.server.address}:{plain.server.port}"
    response = await model_http.request(
        plain.opener(),
        "POST",
        authority,
        "/v1/chat/completions",
        body=json.dumps(body).encode(),
    )
    verdict = classify_response(response.status, response.body)
    assert (verdict.outcome, verdict.healthy, verdict.completion_tokens) == ("answer", True, 50)


async def test_every_vllm_metric_sparkd_reads_is_exported_with_its_labels(plain: Loaded) -> None:
    authority = f"{plain.server.address}:{plain.server.port}"
    before = await model_http.request(plain.opener(), "GET", authority, "/metrics")
    await model_http.probe(plain.opener(), plain.cluster, None)
    after = await model_http.request(plain.opener(), "GET", authority, "/metrics")
    assert before.status == after.status == 200
    text = after.body.decode()
    labels = f'engine="0",model_name="{plain.cluster.model.served_name}"'
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert f"{name}{{{labels}}} " in text, name
    assert f"vllm:generation_tokens_total{{{labels}}} " in text
    load_before = model_http.parse_vllm_metrics(before.body.decode())
    load_after = model_http.parse_vllm_metrics(text)
    assert load_after.running == 0 and load_after.waiting == 0
    assert load_before.generation_tokens is not None and load_after.generation_tokens is not None
    assert load_after.generation_tokens - load_before.generation_tokens == 50
    endpoint, _ = await model_http.read_endpoint(plain.opener(), plain.cluster, None, 10)
    assert endpoint.status == "up" and endpoint.health_status == 200
    assert endpoint.models == (plain.cluster.model.served_name,)
    assert endpoint.generation_tokens_total == load_after.generation_tokens


async def test_a_suspended_engine_reads_as_hung_and_health_stays_up(plain: Loaded) -> None:
    core = plain.server.engine_core()
    cluster = plain.cluster.model_copy(
        update={"probe": plain.cluster.probe.model_copy(update={"timeout": 3.0})}
    )
    os.kill(core, signal.SIGSTOP)
    try:
        result = await model_http.probe(plain.opener(cluster), cluster, None)
        endpoint, _ = await model_http.read_endpoint(plain.opener(), cluster, None, 10)
    finally:
        os.kill(core, signal.SIGCONT)
    assert result.verdict.outcome == "timeout", result.verdict
    # Requests sit in the engine and no token moves: hung, not busy.
    assert result.tokens_advanced is False, result.verdict.detail
    assert "hung" in result.verdict.detail
    assert endpoint.status == "up" and endpoint.health_status == 200
    again = await model_http.probe(plain.opener(), plain.cluster, None)
    assert again.verdict.healthy, again.verdict


async def test_a_dead_engine_answers_503_and_500_then_the_server_exits_0(plain: Loaded) -> None:
    server = plain.server
    os.kill(server.engine_core(), signal.SIGKILL)
    seen: list[tuple[int | None, str]] = []
    probes: list[ProbeResult] = []
    deadline = time.monotonic() + 30
    assert server.process is not None
    while server.process.poll() is None and time.monotonic() < deadline:
        endpoint, _ = await model_http.read_endpoint(plain.opener(), plain.cluster, None, 5)
        seen.append((endpoint.health_status, endpoint.status))
        if endpoint.status == "up":
            probes.append(await model_http.probe(plain.opener(), plain.cluster, None))
        await asyncio.sleep(0.1)
    assert server.process.returncode == 0, server.tail()
    # Between the kill and the exit: still 200 until the API server notices, then /health 503
    # and chat 500 (counted as failures), then the port closes.
    answered = [p.verdict for p in probes if p.http_status is not None]
    assert all(v.healthy or v.outcome == "http_error" for v in answered), answered
    assert all(status in (200, 503) for status, kind in seen if kind == "up"), seen
    assert seen and seen[-1] == (None, "refused"), seen
    gone, _ = await model_http.read_endpoint(plain.opener(), plain.cluster, None, 5)
    assert gone.status == "refused"
    # The planner: the serve process is gone after lasting health, so it starts the model once.
    toy, memory = healthy_toy()
    toy.serve_running = False
    toy.ready = False
    seen_now = toy.observe().model_copy(update={"endpoint": gone, "probe": None})
    decided = plan(toy.cluster, seen_now, memory, toy.now)
    starts = [a for a in decided.actions if a.kind in ("start_model", "restart_model")]
    assert len(starts) == 1, decided.reason


# -- a server with an API key and a served name ------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def keyed(
    tiny_model: Path, sshd_module: RealSshd, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Reached]:
    extra = ("--api-key", KEY, "--served-model-name", "qwen-tiny")
    with serving(tiny_model, tmp_path_factory.mktemp("keyed"), 3, *extra) as server:
        cluster = cluster_for(sshd_module, server)
        conn = HostConnection(cluster.head, cluster.ssh)
        try:
            await server.until_listening()
            yield Reached(server, cluster, conn)
        finally:
            await conn.close()


async def test_a_refused_key_is_an_http_error_and_the_served_name_is_listed(
    keyed: Reached,
) -> None:
    assert keyed.cluster.model.served_name == "qwen-tiny"
    wrong, _ = await model_http.read_endpoint(keyed.opener(), keyed.cluster, "sk-wrong", 10)
    assert wrong.status == "http_error" and wrong.health_status == 200
    assert "API key was refused" in wrong.detail
    assert "sk-wrong" not in wrong.detail
    right, _ = await model_http.read_endpoint(
        keyed.opener(), keyed.cluster, "sk-real-vllm-5e1d", 10
    )
    assert right.status == "up" and right.models == ("qwen-tiny",)
    assert right.serves(keyed.cluster.model.served_name)
    result = await model_http.probe(keyed.opener(), keyed.cluster, KEY)
    assert result.verdict.outcome == "reasoning_only" and result.verdict.healthy
    refused = await model_http.probe(keyed.opener(), keyed.cluster, "sk-wrong")
    assert refused.verdict.outcome == "http_error" and refused.http_status == 401


async def test_a_killed_api_server_leaves_its_engine_running_as_orphans(keyed: Reached) -> None:
    server = keyed.server
    engines = server.engine_pids()
    assert {args_of(p) for p in engines} >= {"VLLM::EngineCore"}, [args_of(p) for p in engines]
    os.kill(server.pid, signal.SIGKILL)
    assert server.process is not None
    server.process.wait(10)
    await asyncio.sleep(3.0)
    # The EngineCore and its worker stay, holding the memory, with no API server in front.
    left = server.members()
    assert set(engines) <= set(left), ([args_of(p) for p in engines], [args_of(p) for p in left])
    rows = "\n".join(f"{pid} 10 5 {args_of(pid)}" for pid in left if args_of(pid))
    top = parsers.parse_docker_top("PID ELAPSED TIME COMMAND\n" + rows)
    assert parsers.find_serve(top) is None
    # sparkd knows the real engine by its process title, as it reads it from `docker top`.
    engine = [r for r in top if any(marker in r.args for marker in ENGINE_MARKERS)]
    assert any(row.args == "VLLM::EngineCore" for row in engine), [r.args for r in top]
    endpoint, _ = await model_http.read_endpoint(keyed.opener(), keyed.cluster, None, 5)
    assert endpoint.status == "refused"
    # The planner: no serve, its engine still there: no launch until the engine is gone.
    toy, memory = healthy_toy()
    toy.serve_running = False
    toy.ready = False
    seen = toy.observe()
    assert seen.serve is not None
    orphans = tuple(f"pid {r.pid} ({r.args.split()[0]})" for r in engine)
    seen = seen.model_copy(
        update={
            "serve": seen.serve.model_copy(update={"orphans": orphans}),
            "endpoint": endpoint,
            "probe": None,
        }
    )
    decided = plan(toy.cluster, seen, memory, toy.now)
    assert not [a for a in decided.actions if a.kind in ("start_model", "restart_model")]
    assert "engine processes still hold the GPUs" in decided.reason, decided.reason

"""The simulated `vllm serve` against what real vLLM 0.32.0 printed (tests/fixtures/vllm-real,
captured from the real server the realvllm tier runs): the fields, metric families and log lines
sparkd reads have the same names, types and labels in both, so the fast tiers cannot drift from
the real server."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkd.core.reading import parsers
from sparkd.core.reading.classify import classify_response, classify_stream
from sparkd.shell.model_http import parse_vllm_metrics
from sparkd_sim.protocol import Done
from sparkd_sim.serve_args import parse_serve
from sparkd_sim.vllm_server import ModelBehaviour, SimVllmServer
from tests.support.shapes import json_shape
from tests.support.sim import REAL_LINES

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-real"
MODEL = "/models/Qwen3.5-122B-A10B-FP8"
PROBE = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hello in one sentence."}],
    "max_tokens": 50,
    "temperature": 0,
}
# The metric families sparkd reads (shell/model_http.parse_vllm_metrics), by type.
READ_FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:generation_tokens": "counter",
}


def real(name: str) -> str:
    return (REAL / name).read_text()


@pytest.fixture
async def sim() -> AsyncIterator[tuple[str, aiohttp.ClientSession, ModelBehaviour]]:
    behaviour = ModelBehaviour(token_latency=0.0005, first_token_latency=0.002)
    server = SimVllmServer(MODEL, behaviour)
    await server.start()
    async with aiohttp.ClientSession() as session:
        yield f"http://127.0.0.1:{server.port}", session, behaviour
    await server.stop()


def families(text: str) -> dict[str, tuple[str, set[str]]]:
    """name -> (type, label names) of the `vllm:` families."""
    found: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:"):
            labels = {k for s in family.samples for k in s.labels}
            found[family.name] = (family.type, labels)
    return found


def read_part(document: dict[str, Any]) -> Any:
    """The fields sparkd's classifier reads from a chat completion, with their JSON types."""
    choice = document["choices"][0]
    message = choice["message"]
    usage = document["usage"]
    return json_shape(
        {
            "content": message["content"],
            "reasoning": message["reasoning"],
            "has_reasoning_content": "reasoning_content" in message,
            "finish_reason": choice["finish_reason"],
            "completion_tokens": usage["completion_tokens"],
        }
    )


async def test_the_metric_families_sparkd_reads_have_the_real_names_types_and_labels(
    sim: tuple[str, aiohttp.ClientSession, ModelBehaviour],
) -> None:
    url, session, _ = sim
    async with session.get(url + "/metrics") as resp:
        ours = await resp.text()
    theirs = real("metrics-idle.txt")
    for name, kind in READ_FAMILIES.items():
        assert families(theirs)[name] == (kind, {"engine", "model_name"}), name
        assert families(ours)[name] == families(theirs)[name], name
    for text in (ours, theirs):
        load = parse_vllm_metrics(text)
        assert (load.running, load.waiting, load.generation_tokens) == (0.0, 0.0, 0.0)


async def test_the_probe_answer_has_the_real_fields_and_reads_the_same(
    sim: tuple[str, aiohttp.ClientSession, ModelBehaviour],
) -> None:
    url, session, _ = sim
    async with session.post(url + "/v1/chat/completions", json=PROBE) as resp:
        assert resp.status == 200
        ours = await resp.read()
    theirs = real("chat-probe.json").encode()
    assert read_part(json.loads(ours)) == read_part(json.loads(theirs))
    mine, real_one = classify_response(200, ours), classify_response(200, theirs)
    assert (mine.outcome, mine.healthy, mine.completion_tokens, mine.finish_reason) == (
        real_one.outcome,
        real_one.healthy,
        real_one.completion_tokens,
        real_one.finish_reason,
    )


def sse_chunks(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


async def test_the_stream_has_the_real_sequence_of_chunks(
    sim: tuple[str, aiohttp.ClientSession, ModelBehaviour],
) -> None:
    url, session, _ = sim
    body = {**PROBE, "stream": True, "stream_options": {"include_usage": True}}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        ours = sse_chunks(await resp.text())
    theirs = sse_chunks(real("chat-stream-include-usage.txt"))

    def outline(chunks: list[str]) -> list[str]:
        """Each chunk as the keys of its delta (or `usage`/`done`), runs of one kind merged."""
        kinds: list[str] = []
        for chunk in chunks:
            if chunk == "[DONE]":
                kind = "done"
            else:
                parsed = json.loads(chunk)
                if not parsed["choices"]:
                    kind = "usage"
                else:
                    choice = parsed["choices"][0]
                    kind = ",".join(sorted(choice["delta"]))
                    if choice["finish_reason"]:
                        kind += f"|{choice['finish_reason']}"
            if not kinds or kinds[-1] != kind:
                kinds.append(kind)
        return kinds

    assert (
        outline(ours)
        == outline(theirs)
        == [
            "content,role",
            "reasoning",
            "reasoning|length",
            "usage",
            "done",
        ]
    )
    assert classify_stream(200, ours).outcome == classify_stream(200, theirs).outcome


async def test_a_dead_engine_answers_as_the_real_one(
    sim: tuple[str, aiohttp.ClientSession, ModelBehaviour],
) -> None:
    url, session, behaviour = sim
    behaviour.engine = "dead"
    async with session.get(url + "/health") as resp:
        assert (resp.status, await resp.read()) == (503, b"")
    async with session.post(url + "/v1/chat/completions", json=PROBE) as resp:
        status, ours = resp.status, await resp.json()
    assert status == 500
    assert ours == json.loads(real("engine-dead-keepalive-chat-500.json"))


def test_the_real_log_reads_as_ready_and_each_line_pattern_is_real() -> None:
    lines = parsers.log_lines(real("serve.log"))
    for pattern in REAL_LINES:
        assert any(re.search(pattern, line) for line in lines), pattern
    ready_at = next(i for i, ln in enumerate(lines) if "Application startup complete." in ln)
    progress = parsers.parse_load_progress(lines[: ready_at + 1], None)
    assert progress.stage == "ready"
    weights_at = next(i for i, ln in enumerate(lines) if "100% Completed" in ln)
    assert parsers.parse_load_progress(lines[: weights_at + 1], None).stage == "weights"


def test_an_unknown_serve_argument_is_rejected_with_the_real_text_and_status() -> None:
    done = parse_serve([MODEL, "--bogus-flag", "x"], "")
    assert isinstance(done, Done)
    assert done.rc == 2
    assert done.stderr == real("serve-unknown-argument.txt")

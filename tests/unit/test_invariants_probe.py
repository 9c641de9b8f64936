"""Invariant 8: a healthy probe is an answer or a spent budget.

Reasoning with no content is healthy only when the budget ran out (`finish_reason: length`, or
`max_tokens` completion tokens) or when an answer follows a `</think>` left in it; a turn that
ended with reasoning only is a reasoning-parser or chat-template fault, a turn the server
aborted or an error streamed mid-answer is no answer, and a probe that answers slowly is
reported, never counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.reading.classify import classify_response, classify_stream, garbled
from sparkd.model.memory import Memory
from sparkd.model.probe import PROBE_OUTCOMES, ProbeResult, ProbeVerdict
from tests.toy import Toy

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples"
MAX_TOKENS = 50
COMMON = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# The real vLLM 0.32 probe answer (budget spent thinking): every other shape is made from it.
REAL = json.loads((SAMPLES / "vllm-real-chat-probe.json").read_text())
REAL_STREAM = (SAMPLES / "vllm-real-chat-stream-include-usage.txt").read_text().splitlines()

WORDS = st.sampled_from(["Hello", "there", "the user", "wants", "a greeting", "Okay", "so"])
TEXT = st.lists(WORDS, min_size=1, max_size=8).map(" ".join)
FINISH = st.sampled_from(["stop", "length", "abort", "tool_calls", None])


def real_with(
    content: str | None, reasoning: str | None, finish: str | None, tokens: int | None
) -> bytes:
    document: dict[str, Any] = json.loads(json.dumps(REAL))
    choice = document["choices"][0]
    choice["message"]["content"] = content
    choice["message"]["reasoning"] = reasoning
    choice["finish_reason"] = finish
    if tokens is None:
        document.pop("usage")
    else:
        document["usage"]["completion_tokens"] = tokens
    return json.dumps(document).encode()


def spent_or_answered(content: str | None, finish: str | None, tokens: int | None) -> bool:
    answered = bool((content or "").strip()) and finish != "abort"
    spent = finish == "length" or (tokens is not None and tokens >= MAX_TOKENS)
    return answered or (spent and finish != "abort")


@COMMON
@given(
    st.one_of(st.none(), st.just(""), TEXT),
    st.one_of(st.none(), TEXT),
    FINISH,
    st.one_of(st.none(), st.integers(1, MAX_TOKENS)),
)
def test_healthy_is_an_answer_or_a_spent_budget(
    content: str | None, reasoning: str | None, finish: str | None, tokens: int | None
) -> None:
    verdict = classify_response(200, real_with(content, reasoning, finish, tokens), MAX_TOKENS)
    if verdict.healthy:
        assert spent_or_answered(content, finish, tokens), verdict


@COMMON
@given(st.one_of(st.none(), st.just(""), st.just("\n\n")), TEXT, TEXT, FINISH, st.integers(1, 50))
def test_an_answer_after_a_closer_left_in_reasoning_is_an_answer(
    content: str | None, thought: str, answer: str, finish: str | None, tokens: int
) -> None:
    """Whatever the turn's end and length: text after the last `</think>` that a reasoning
    parser left in `reasoning` is an answer (unless the server aborted the turn)."""
    reasoning = f"{thought}</think>\n\n{answer}"
    verdict = classify_response(200, real_with(content, reasoning, finish, tokens), MAX_TOKENS)
    if garbled(reasoning) is not None:  # a word repeated over most of it: a broken kernel's
        assert verdict.outcome == "garbled", verdict
    elif finish == "abort":
        assert verdict.outcome == "aborted", verdict
    else:
        assert (verdict.outcome, verdict.healthy) == ("answer", True), verdict
        assert answer.split()[0] in verdict.detail


def stream_of(parts: list[tuple[str, str]], finish: str | None, error_at: int | None) -> list[str]:
    """The real stream's framing, with `parts` as deltas and maybe an error chunk (vLLM's
    `{"error": {...}}`) after `error_at` of them."""
    head = json.loads(REAL_STREAM[0][len("data: ") :])
    lines = [REAL_STREAM[0], ""]
    for index, (field, text) in enumerate(parts):
        if error_at == index:
            error = {"error": {"message": "EngineCore encountered an issue", "type": "Internal"}}
            lines += [f"data: {json.dumps(error)}", ""]
            break
        chunk = dict(head)
        last = index == len(parts) - 1
        chunk["choices"] = [
            {"index": 0, "delta": {field: text}, "finish_reason": finish if last else None}
        ]
        lines += [f"data: {json.dumps(chunk)}", ""]
    return [*lines, "data: [DONE]", ""]


@COMMON
@given(
    st.lists(st.tuples(st.sampled_from(["content", "reasoning"]), TEXT), min_size=1, max_size=6),
    FINISH,
    st.one_of(st.none(), st.integers(0, 5)),
)
def test_streamed_error_or_abort_is_never_healthy(
    parts: list[tuple[str, str]], finish: str | None, error_at: int | None
) -> None:
    verdict = classify_stream(200, stream_of(parts, finish, error_at), MAX_TOKENS)
    if error_at is not None and error_at < len(parts):
        assert verdict.outcome == "aborted", verdict
    if finish == "abort":
        assert not verdict.healthy, verdict


def test_real_budget_spent_thinking_is_healthy() -> None:
    verdict = classify_response(200, (SAMPLES / "vllm-real-chat-probe.json").read_bytes(), 50)
    assert (verdict.outcome, verdict.healthy) == ("reasoning_only", True)
    streamed = classify_stream(200, REAL_STREAM, 50)
    assert (streamed.outcome, streamed.healthy) == ("reasoning_only", True)


def test_turn_that_ended_with_reasoning_only_is_no_answer() -> None:
    verdict = classify_response(200, real_with(None, "Okay, hello.", "stop", 7), MAX_TOKENS)
    assert (verdict.outcome, verdict.healthy) == ("no_answer", False)
    assert "reasoning-parser or chat-template" in verdict.detail


def test_budget_told_by_token_count_when_finish_is_missing() -> None:
    verdict = classify_response(200, real_with(None, "Okay", None, MAX_TOKENS), MAX_TOKENS)
    assert verdict.outcome == "reasoning_only"
    short = classify_response(200, real_with(None, "Okay", None, 9), MAX_TOKENS)
    assert short.outcome == "no_answer"


def test_aborted_turn_is_not_healthy() -> None:
    verdict = classify_response(200, real_with("Hello th", None, "abort", 3), MAX_TOKENS)
    assert (verdict.outcome, verdict.healthy) == ("aborted", False)


def test_error_streamed_after_partial_answer_is_aborted() -> None:
    lines = stream_of([("content", "Hello"), ("content", " there")], "stop", 1)
    verdict = classify_stream(200, lines, MAX_TOKENS)
    assert (verdict.outcome, verdict.healthy) == ("aborted", False)
    assert "EngineCore encountered an issue" in verdict.detail
    older = [*lines[:2], 'data: {"object": "error", "message": "boom", "code": 500}', ""]
    assert classify_stream(200, [*older, "data: [DONE]"], MAX_TOKENS).outcome == "aborted"


def test_new_outcomes_are_public_labels() -> None:
    assert {"no_answer", "aborted"} <= set(PROBE_OUTCOMES)


def _healthy_with_latency(latency: float) -> tuple[Toy, Memory, ProbeResult]:
    toy = Toy.healthy()
    memory = Memory(
        launched_at=toy.now - 1000,
        model_ready_at=toy.now - 100,
        last_probe_at=toy.now - 60,
        healthy_since=toy.now - 60,
        launch_nodes=tuple(sorted(n.node_id for n in toy.ray_nodes if n.alive)),
    )
    probe = ProbeResult(
        at=toy.now,
        verdict=ProbeVerdict(
            outcome="reasoning_only",
            healthy=True,
            completion_tokens=MAX_TOKENS,
            finish_reason="length",
        ),
        latency_seconds=latency,
    )
    return toy, memory, probe


@COMMON
@given(st.floats(0.0, 1.0), st.integers(0, 2))
def test_slow_probe_is_degraded_never_counted(share: float, failures: int) -> None:
    toy, memory, probe = _healthy_with_latency(0.0)
    timeout = toy.cluster.probe.timeout
    probe = probe.model_copy(update={"latency_seconds": share * timeout})
    memory = memory.model_copy(update={"consecutive_failures": failures})
    observed = toy.observe().model_copy(update={"probe": probe})
    result = plan(toy.cluster, observed, memory, toy.now)
    assert result.actions == ()
    assert result.learned.probe_failures == 0
    slow = share * timeout > toy.cluster.probe.slow_share * timeout
    assert result.phase == ("degraded" if slow else "healthy"), result.reason
    assert ("degraded: slow" in result.reason) == slow


def test_probe_at_most_of_its_timeout_is_degraded_slow() -> None:
    toy, memory, probe = _healthy_with_latency(27.5)
    observed = toy.observe().model_copy(update={"probe": probe})
    result = plan(toy.cluster, observed, memory, toy.now)
    assert result.phase == "degraded"
    assert "degraded: slow: the probe took 27.50s, over 50% of its 30s timeout" in result.reason

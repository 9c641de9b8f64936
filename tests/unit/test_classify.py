"""The probe classifier on every real vLLM sample and on hand-made edge cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkd.core.classify import classify_failure, classify_response, classify_stream, is_garbled

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples"


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


@pytest.mark.parametrize(
    ("name", "outcome", "tokens", "finish"),
    [
        ("vllm-chat-reasoning-only.json", "reasoning_only", 50, "length"),
        ("vllm-chat-reasoning-only-legacy.json", "reasoning_only", 50, "length"),
        ("vllm-chat-reasoning-content-only.json", "reasoning_only", 50, "length"),
        ("vllm-chat-answer.json", "answer", 63, "stop"),
    ],
)
def test_real_samples(name: str, outcome: str, tokens: int, finish: str) -> None:
    verdict = classify_response(200, sample(name))
    assert verdict.outcome == outcome
    assert verdict.healthy is True
    assert verdict.completion_tokens == tokens
    assert verdict.finish_reason == finish


def test_real_stream_sample_is_reasoning_only() -> None:
    lines = sample("vllm-chat-stream-reasoning.txt").decode().splitlines()
    verdict = classify_stream(200, lines)
    assert verdict.outcome == "reasoning_only"
    assert verdict.completion_tokens == 50
    assert verdict.finish_reason == "length"
    assert verdict.detail.startswith("Okay, the user wants")


def response(message: dict[str, Any], tokens: int | None = 50, finish: str = "length") -> str:
    body: dict[str, Any] = {
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        ],
    }
    if tokens is not None:
        body["usage"] = {
            "prompt_tokens": 16,
            "completion_tokens": tokens,
            "total_tokens": 16 + tokens,
        }
    return json.dumps(body)


EDGE_CASES = [
    (
        "blank_content_is_absent",
        response({"content": "   \n", "reasoning": "Thinking."}),
        "reasoning_only",
    ),
    (
        "empty_string_content_with_reasoning",
        response({"content": "", "reasoning": "Hm."}),
        "reasoning_only",
    ),
    (
        "tool_calls_are_an_answer",
        response({"content": None, "tool_calls": [{"id": "c1", "type": "function"}]}),
        "answer",
    ),
    (
        "empty_tool_calls_list_is_not",
        response({"content": None, "tool_calls": []}, tokens=0),
        "empty",
    ),
    ("no_content_no_reasoning", response({"content": None}, tokens=0), "empty"),
    ("blank_reasoning_is_absent", response({"content": None, "reasoning": "  "}), "empty"),
    (
        "reasoning_with_zero_tokens_is_inconsistent",
        response({"content": None, "reasoning": "x y"}, tokens=0),
        "malformed",
    ),
    (
        "reasoning_without_usage",
        response({"content": None, "reasoning": "Okay"}, tokens=None),
        "reasoning_only",
    ),
    ("garbled_content", response({"content": "!!!!!!!!!!!!!!!!!!!!"}), "garbled"),
    ("garbled_reasoning", response({"content": None, "reasoning": "!!!!!!!!!!!!"}), "garbled"),
    ("garbled_repeated_token", response({"content": "the the the the the the the"}), "garbled"),
    ("short_answer_is_not_garbled", response({"content": "Hi!"}, finish="stop"), "answer"),
    ("not_json", "<html>502 Bad Gateway</html>", "malformed"),
    ("truncated_json", '{"choices": [{"message": {"content": "Hel', "malformed"),
    ("json_array", "[]", "malformed"),
    ("no_choices", json.dumps({"object": "chat.completion", "choices": []}), "malformed"),
    ("choice_without_message", json.dumps({"choices": [{"index": 0}]}), "malformed"),
]


@pytest.mark.parametrize(("name", "body", "outcome"), EDGE_CASES, ids=[c[0] for c in EDGE_CASES])
def test_edge_cases(name: str, body: str, outcome: str) -> None:
    assert classify_response(200, body).outcome == outcome


@pytest.mark.parametrize("status", [400, 401, 404, 500, 503])
def test_non_2xx_is_http_error(status: int) -> None:
    verdict = classify_response(status, sample("vllm-chat-answer.json"))
    assert verdict.outcome == "http_error"
    assert verdict.healthy is False
    assert f"HTTP {status}" in verdict.detail


@pytest.mark.parametrize(
    ("outcome", "healthy"), [("refused", False), ("timeout", False), ("not_run", None)]
)
def test_transport_failures(outcome: str, healthy: bool | None) -> None:
    verdict = classify_failure(outcome, "x")  # type: ignore[arg-type]
    assert verdict.outcome == outcome
    assert verdict.healthy is healthy


def test_transport_failure_rejects_response_outcomes() -> None:
    with pytest.raises(ValueError):
        classify_failure("answer")


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return "data: " + json.dumps(
        {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    )


def test_stream_with_content_and_legacy_field() -> None:
    lines = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Let me think."}),
        chunk({"content": "Hello there!"}, finish="stop"),
        'data: {"choices": [], "usage": {"completion_tokens": 9}}',
        "data: [DONE]",
    ]
    verdict = classify_stream(200, lines)
    assert (verdict.outcome, verdict.completion_tokens, verdict.finish_reason) == (
        "answer",
        9,
        "stop",
    )


def test_stream_without_done_is_malformed() -> None:
    assert classify_stream(200, [chunk({"content": "Hel"})]).outcome == "malformed"


def test_stream_bad_chunk_is_malformed() -> None:
    assert classify_stream(200, ["data: {oops", "data: [DONE]"]).outcome == "malformed"


def test_stream_http_error() -> None:
    assert classify_stream(500, []).outcome == "http_error"


@pytest.mark.parametrize(
    ("text", "garbled"),
    [("!!!!!!!!", True), ("!!!!!!!", False), ("ab ab ab ab ab ab", True), ("Hello there", False)],
)
def test_is_garbled(text: str, garbled: bool) -> None:
    assert is_garbled(text) is garbled

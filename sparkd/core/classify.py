"""Classify a sanity completion (DESIGN section 5). Pure: bytes and status codes in, verdict out.

A reasoning model that spends its whole budget thinking answers with `content: null` and its text
in `reasoning` (vLLM >= 0.11) or `reasoning_content` (older vLLM, SGLang): that is healthy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from sparkd.model.probe import HEALTHY_OUTCOMES, ProbeOutcome, ProbeVerdict

# Text shorter than this is never called garbled: "ok" or "Hi!" are fine answers.
GARBLED_MIN_CHARS = 8
GARBLED_MIN_TOKENS = 6
REASONING_FIELDS = ("reasoning", "reasoning_content")


def verdict(outcome: ProbeOutcome, detail: str = "", **extra: Any) -> ProbeVerdict:
    healthy = None if outcome == "not_run" else outcome in HEALTHY_OUTCOMES
    return ProbeVerdict(outcome=outcome, healthy=healthy, detail=detail, **extra)


def classify_failure(outcome: ProbeOutcome, detail: str = "") -> ProbeVerdict:
    """A probe that got no HTTP response: `refused`, `timeout` or `not_run`."""
    if outcome not in ("refused", "timeout", "not_run"):
        raise ValueError(f"{outcome} is not a transport failure outcome")
    return verdict(outcome, detail)


def classify_response(status: int, body: bytes | str) -> ProbeVerdict:
    """A non-streaming `/v1/chat/completions` response."""
    if not 200 <= status < 300:
        return verdict("http_error", f"HTTP {status}: {_snippet(body)}")
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return verdict("malformed", f"body is not JSON: {_snippet(body)}")
    if not isinstance(document, dict):
        return verdict("malformed", "body is not a JSON object")
    choices = document.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return verdict("malformed", "no choices in the response")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return verdict("malformed", "first choice has no message")
    finish = choices[0].get("finish_reason")
    return _classify_message(
        content=message.get("content"),
        reasoning=_reasoning(message),
        tool_calls=message.get("tool_calls"),
        usage=document.get("usage"),
        finish_reason=finish if isinstance(finish, str) else None,
    )


def classify_stream(status: int, lines: Iterable[str]) -> ProbeVerdict:
    """A streaming response, as its SSE lines (`data: {...}` ... `data: [DONE]`)."""
    if not 200 <= status < 300:
        return verdict("http_error", f"HTTP {status}")
    content: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[Any] = []
    usage: Any = None
    finish: str | None = None
    done = False
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith(":"):
            continue
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            return verdict("malformed", f"stream chunk is not JSON: {data[:80]!r}")
        if not isinstance(chunk, dict):
            return verdict("malformed", "stream chunk is not a JSON object")
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                return verdict("malformed", "stream choice is not an object")
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            text = _reasoning(delta)
            if text:
                reasoning.append(text)
            if isinstance(delta.get("tool_calls"), list):
                tool_calls.extend(delta["tool_calls"])
            if isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
    if not done:
        return verdict("malformed", "stream ended without [DONE]")
    return _classify_message(
        content="".join(content),
        reasoning="".join(reasoning),
        tool_calls=tool_calls,
        usage=usage,
        finish_reason=finish,
    )


def _classify_message(
    *, content: Any, reasoning: str, tool_calls: Any, usage: Any, finish_reason: str | None
) -> ProbeVerdict:
    tokens = _completion_tokens(usage)
    extra: dict[str, Any] = {"completion_tokens": tokens, "finish_reason": finish_reason}
    text = content.strip() if isinstance(content, str) else ""
    if isinstance(tool_calls, list) and tool_calls:
        return verdict("answer", f"{len(tool_calls)} tool call(s)", **extra)
    if text:
        if is_garbled(text):
            return verdict("garbled", f"content is one repeated unit: {text[:24]!r}", **extra)
        return verdict("answer", _snippet(text), **extra)
    if reasoning.strip():
        if is_garbled(reasoning.strip()):
            return verdict(
                "garbled", f"reasoning is one repeated unit: {reasoning.strip()[:24]!r}", **extra
            )
        if tokens == 0:
            return verdict("malformed", "reasoning text but completion_tokens is 0", **extra)
        return verdict("reasoning_only", _snippet(reasoning.strip()), **extra)
    return verdict("empty", "no content, no reasoning, no tool calls", **extra)


def is_garbled(text: str) -> bool:
    """One character or one token repeated: the signature of a broken TP/NCCL or FP4 kernel."""
    compact = "".join(text.split())
    if len(compact) >= GARBLED_MIN_CHARS and len(set(compact)) == 1:
        return True
    tokens = text.split()
    return len(tokens) >= GARBLED_MIN_TOKENS and len(set(tokens)) == 1


def _reasoning(message: Mapping[str, Any]) -> str:
    for field in REASONING_FIELDS:
        value = message.get(field)
        if isinstance(value, str) and value.strip():
            return value
    return ""


def _completion_tokens(usage: Any) -> int | None:
    if isinstance(usage, dict):
        value = usage.get("completion_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _snippet(text: bytes | str, limit: int = 80) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"

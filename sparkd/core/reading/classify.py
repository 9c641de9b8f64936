"""Classify a sanity completion. Pure: bytes and status codes in, verdict out.

A reasoning model that spends its whole budget thinking answers with `content: null` and its text
in `reasoning` (vLLM >= 0.11) or `reasoning_content` (older vLLM, SGLang): that is healthy, but
only as a spent budget (`finish_reason: length`, or `max_tokens` completion tokens). A turn that
ended (`stop`) with reasoning and no content is what every client gets from a broken reasoning
parser or chat template: `no_answer` (which a restart reproduces: core.policy does not count it).
A turn the server cut short (`abort`, or an error streamed after part of the answer) is `aborted`.

An answer that follows a `</think>` inside `reasoning` is an answer: vLLM's qwen3 reasoning parser,
streaming, leaves everything in `reasoning`, the closer included, when the model spells
`</think>` in pieces rather than as its one added token (vLLM 0.32.0 and 0.34.0,
vllm/parser/engine/streaming_parser_engine.py `_process_lex_tokens`: once token ids are fed, a
closer lexed from text alone is content of the current state, and the state is still reasoning).
Every client reads that answer after the closer; it is read from there (tests/fixtures/vllm-parser).
"""

from __future__ import annotations

import itertools
import json
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkd.core.text import printable, printable_json
from sparkd.model.probe import HEALTHY_OUTCOMES, ProbeOutcome, ProbeVerdict

# Text with fewer non-blank characters than this is never called garbled: "4", "Paris.", "Yes",
# "Hi!" are fine answers, and so is a short list of equal numbers ("0, 0, 0, 0, 0, 0").
GARBLED_MIN_CHARS = 20
# A unit of at most this many characters (`!`, `<unk>`, `<|im_start|>`, a short word), repeated at
# least GARBLED_MIN_REPEATS times in a row over at least GARBLED_MIN_COVER of the text.
GARBLED_MAX_UNIT = 32
GARBLED_MIN_REPEATS = 3
GARBLED_MIN_COVER = 0.6
# Letters from at least this many scripts, switching script between most neighbouring letters:
# the random soup of a broken kernel, not a multilingual answer (which switches per word).
SOUP_MIN_SCRIPTS = 4
SOUP_MIN_SWITCHES = 0.5
SOUP_MIN_LETTERS = 12
# Only the start of a long text is examined: garbling fills a response from its first tokens.
GARBLED_SCAN_CHARS = 4096
REASONING_FIELDS = ("reasoning", "reasoning_content")
# The closer of a reasoning block (Qwen3, DeepSeek-R1): text after the last one is the answer.
THINK_END = "</think>"
AUTH_FAILURES = (401, 403)


def verdict(outcome: ProbeOutcome, detail: str = "", **extra: Any) -> ProbeVerdict:
    healthy = None if outcome == "not_run" else outcome in HEALTHY_OUTCOMES
    return ProbeVerdict(outcome=outcome, healthy=healthy, detail=detail, **extra)


def classify_failure(outcome: ProbeOutcome, detail: str = "") -> ProbeVerdict:
    """A probe that got no HTTP response: `refused`, `timeout` or `not_run`."""
    if outcome not in ("refused", "timeout", "not_run"):
        raise ValueError(f"{outcome} is not a transport failure outcome")
    return verdict(outcome, detail)


@dataclass(frozen=True)
class EngineLoad:
    """One reading of vLLM's own /metrics, summed over its engines; None where not exported."""

    running: float | None = None
    waiting: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    kv_cache_usage: float | None = None


KV_GAUGE = "vllm:kv_cache_usage_perc"


def judge_timeout(
    before: EngineLoad | None,
    after: EngineLoad | None,
    max_tokens: int,
    *,
    waited: float | None = None,
    one_step: float | None = None,
) -> tuple[bool | None, str]:
    """Whether vLLM worked for others while a probe timed out (busy), and what was seen.

    Busy only on evidence of other work: requests besides the probe's own running or waiting
    while the generation-token counter rose, or the counter rising by more than the probe's
    max_tokens could account for, or, with no token at all, other requests in the engine while
    its KV-cache usage moved: a long prompt being prefilled ahead of the probe. The stats come
    once a step ends, so a gauge that stood still for less than one engine step can last
    (`one_step`, against the probe's `waited`) is unknown, not hung. vLLM V1 emits
    nothing for a step that only prefills part of a prompt, so no counter moves, but its
    scheduler stats (running requests, KV-cache usage) are published every step (0.32.0 and
    0.34.0 `v1/core/sched/scheduler.py` `should_emit_output`, "We must return the stats even
    if there are no request outputs this step"). A hung engine publishes nothing: its
    requests sit in the engine with every figure still (the probe's own, or earlier probes'
    left behind), and that is hung. No KV-cache gauge to tell the two apart: unknown.
    None when the counter could not be read both times."""
    if before is None or after is None:
        return None, "vLLM's /metrics unreadable: busy or hung is unknown"
    if before.generation_tokens is None or after.generation_tokens is None:
        return None, "vLLM's /metrics has no generation-token counter: busy or hung is unknown"
    generated = after.generation_tokens - before.generation_tokens
    if generated < 0:
        return None, "vLLM's token counter went back (the server restarted)"
    # Before the probe was sent every request was another's; after it timed out the probe's
    # own may still be counted (a hung engine never processes the abort).
    others = max(_queued(before), _queued(after) - 1, 0.0)
    tokens = f"{generated:g} tokens generated meanwhile"
    if others > 0 and generated > 0:
        return True, f"{others:g} other request(s) in the engine, {tokens}"
    if generated > max_tokens:
        return True, f"{tokens}, more than the probe's {max_tokens}"
    if others > 0:
        kv_before, kv_after = before.kv_cache_usage, after.kv_cache_usage
        if kv_before is None or kv_after is None:
            return None, (
                f"{others:g} other request(s) in the engine, no token generated, and no "
                f"{KV_GAUGE} to tell a long prefill ahead of the probe from a hang: unknown"
            )
        if kv_after != kv_before:
            return True, (
                f"{others:g} other request(s) in the engine, no token generated while "
                f"{KV_GAUGE} moved ({kv_before:g} -> {kv_after:g}): a long prefill ahead "
                "of the probe"
            )
        if waited is not None and one_step is not None and waited < one_step:
            return None, (
                f"{others:g} other request(s) in the engine, no token generated and {KV_GAUGE} "
                f"still at {kv_after:g} for {waited:g}s, less than one engine step can take "
                f"({one_step:g}s): busy or hung is unknown"
            )
        return False, (
            f"{others:g} other request(s) in the engine, no token generated and {KV_GAUGE} "
            f"still at {kv_after:g}: hung"
        )
    if generated > 0:
        return False, f"only the probe's request in the engine, {tokens}: slow, not busy"
    return False, "no token generated: hung"


def _queued(load: EngineLoad) -> float:
    return (load.running or 0.0) + (load.waiting or 0.0)


def classify_response(
    status: int, body: bytes | str, max_tokens: int | None = None
) -> ProbeVerdict:
    """A non-streaming `/v1/chat/completions` response; `max_tokens` is what the probe asked."""
    if status in AUTH_FAILURES:
        # What a refusing server (or a proxy before it) writes back may quote the key it was
        # sent, in an encoding the redactor might not know: none of it is kept.
        return verdict("http_error", f"HTTP {status}: the API key was refused")
    if not 200 <= status < 300:
        return verdict("http_error", f"HTTP {status}: {_snippet(body)}")
    try:
        document = printable_json(json.loads(body))
    except (ValueError, UnicodeDecodeError, RecursionError):
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
        max_tokens=max_tokens,
    )


def classify_stream(
    status: int, lines: Iterable[str], max_tokens: int | None = None
) -> ProbeVerdict:
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
            chunk = printable_json(json.loads(data))
        except (ValueError, RecursionError):
            return verdict("malformed", f"stream chunk is not JSON: {printable(data[:80])!r}")
        if not isinstance(chunk, dict):
            return verdict("malformed", "stream chunk is not a JSON object")
        failure = _stream_error(chunk)
        if failure is not None:
            # vLLM streams an error it meets mid-generation as one chunk, then `[DONE]`.
            got = len("".join(content)) + len("".join(reasoning))
            return verdict("aborted", f"error streamed after {got} characters: {failure}")
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            return verdict("malformed", "stream choices are not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                return verdict("malformed", "stream choice is not an object")
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                return verdict("malformed", "stream delta is not an object")
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
        max_tokens=max_tokens,
    )


def _stream_error(chunk: Mapping[str, Any]) -> str | None:
    """The message of an error chunk: `{"error": {"message": ...}}` (vLLM >= 0.10) or
    `{"object": "error", "message": ...}` (older vLLM); None for any other chunk."""
    inner = chunk.get("error")
    if isinstance(inner, dict):
        return _snippet(str(inner.get("message") or inner.get("type") or "error"))
    if isinstance(inner, str):
        return _snippet(inner)
    if chunk.get("object") == "error":
        return _snippet(str(chunk.get("message") or "error"))
    return None


def _classify_message(
    *,
    content: Any,
    reasoning: str,
    tool_calls: Any,
    usage: Any,
    finish_reason: str | None,
    max_tokens: int | None = None,
) -> ProbeVerdict:
    tokens = _completion_tokens(usage)
    extra: dict[str, Any] = {"completion_tokens": tokens, "finish_reason": finish_reason}
    text = content.strip() if isinstance(content, str) else ""
    thought = reasoning.strip()
    # A broken kernel garbles every token it emits, thinking and answer alike.
    for field, value in (("content", text), ("reasoning", thought)):
        why = garbled(value)
        if why is not None:
            return verdict("garbled", f"{field} {why}: {value[:24]!r}", **extra)
    if finish_reason == "abort":
        got = f"{len(text)} characters of answer" if text else "no answer"
        return verdict(
            "aborted", f"the server aborted the turn (finish_reason abort, {got})", **extra
        )
    if isinstance(tool_calls, list) and tool_calls:
        return verdict("answer", f"{len(tool_calls)} tool call(s)", **extra)
    if text:
        return verdict("answer", _snippet(text), **extra)
    after = _after_closer(thought)
    if after:
        return verdict(
            "answer", f"after a {THINK_END} left in reasoning: {_snippet(after)}", **extra
        )
    if thought:
        if tokens == 0:
            return verdict("malformed", "reasoning text but completion_tokens is 0", **extra)
        spent = finish_reason == "length" or (
            max_tokens is not None and tokens is not None and tokens >= max_tokens
        )
        if spent:
            return verdict("reasoning_only", _snippet(thought), **extra)
        ended = finish_reason or "not given"
        return verdict(
            "no_answer",
            f"the turn ended (finish_reason {ended}, {_count(tokens)} completion tokens) with "
            "reasoning and no content: a reasoning-parser or chat-template fault, every client "
            "gets an empty answer",
            **extra,
        )
    return verdict("empty", "no content, no reasoning, no tool calls", **extra)


def garbled(text: str) -> str | None:
    """Why `text` is not language, or None. Two signatures of a broken TP/NCCL or FP4 kernel:
    one short unit repeated over most of the text (`!!!!`, `<unk><unk>`, `!?!?`, `<|im_start|>`
    again and again), or a soup of letters from many scripts. Blanks are ignored, so a unit
    repeated with spaces or newlines between is still one unit."""
    compact = "".join(text[:GARBLED_SCAN_CHARS].split())
    if len(compact) < GARBLED_MIN_CHARS:
        return None
    unit, cover = _repetition(compact)
    if cover >= GARBLED_MIN_COVER:
        return f"is {unit!r} repeated over {cover:.0%} of it"
    scripts = _soup(compact)
    if scripts is not None:
        return f"is a soup of letters from {scripts} scripts"
    return None


def _repetition(compact: str) -> tuple[str, float]:
    """The repeating unit that covers most of `compact`, and the share it covers.

    For each period p, a run of positions where c[i] == c[i+p] marks a stretch that repeats a
    p-character unit; stretches holding at least GARBLED_MIN_REPEATS units count as covered."""
    n = len(compact)
    best_unit, best_cover = "", 0.0
    for period in range(1, min(GARBLED_MAX_UNIT, n // GARBLED_MIN_REPEATS) + 1):
        covered = 0
        end_covered = 0  # stretches for one period can overlap by less than a unit
        unit = ""
        start = 0
        for i in range(n - period + 1):
            if i < n - period and compact[i] == compact[i + period]:
                continue
            stretch_end = i + period  # compact[start:stretch_end] repeats the unit
            if stretch_end - start >= GARBLED_MIN_REPEATS * period:
                covered += stretch_end - max(start, end_covered)
                end_covered = stretch_end
                unit = unit or compact[start : start + period]
            start = i + 1
        if covered / n > best_cover:
            best_unit, best_cover = unit, covered / n
    return best_unit, best_cover


def _soup(compact: str) -> int | None:
    """How many scripts the letters mix, when they switch script between most neighbours."""
    scripts = [_script(ch) for ch in compact if ch.isalpha()]
    if len(scripts) < SOUP_MIN_LETTERS:
        return None
    distinct = len(set(scripts))
    switches = sum(a != b for a, b in itertools.pairwise(scripts))
    if distinct >= SOUP_MIN_SCRIPTS and switches / (len(scripts) - 1) >= SOUP_MIN_SWITCHES:
        return distinct
    return None


# Scripts that one language writes together (Japanese mixes kanji and kana in every sentence).
_SCRIPT_FAMILY = {
    "CJK": "CJK",
    "HIRAGANA": "CJK",
    "KATAKANA": "CJK",
    "HALFWIDTH": "CJK",
    "FULLWIDTH": "CJK",
    "HANGUL": "CJK",
    "IDEOGRAPHIC": "CJK",
}


def _script(letter: str) -> str:
    """A letter's script, from the first word of its Unicode name (LATIN, GREEK, CJK, ...)."""
    first = unicodedata.name(letter, "UNKNOWN").split(" ", 1)[0]
    return _SCRIPT_FAMILY.get(first, first)


def _reasoning(message: Mapping[str, Any]) -> str:
    # A blank field gives way to the other one's text, but is text itself when none has any: a
    # streamed token of only whitespace ("\n\n" between sentences) belongs to the thought.
    blank = ""
    for field in REASONING_FIELDS:
        value = message.get(field)
        if isinstance(value, str):
            if value.strip():
                return value
            blank = blank or value
    return blank


def _after_closer(thought: str) -> str:
    """The text after the last reasoning closer that a parser left in `reasoning`, or ""."""
    _, closer, after = thought.rpartition(THINK_END)
    return after.strip() if closer else ""


def _completion_tokens(usage: Any) -> int | None:
    if isinstance(usage, dict):
        value = usage.get("completion_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _count(tokens: int | None) -> str:
    return str(tokens) if tokens is not None else "unknown"


def _snippet(text: bytes | str, limit: int = 80) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = printable(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"

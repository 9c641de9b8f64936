"""vLLM's OpenAI-compatible wire format, as pure functions.

Field for field what vLLM's pydantic models serialize, nulls included (see
tests/fixtures/samples/vllm-*). The version differences that matter to a client:

- reasoning text is in `reasoning` (vLLM >= 0.16), in both `reasoning` and `reasoning_content`
  (0.11-0.15), or only in `reasoning_content` (< 0.11, and SGLang);
- errors are `{"error": {message, type, param, code}}` since vLLM 0.10.1 (vllm#22099), before that
  flat `{"object": "error", message, type, param, code}`. The flat shape goes with the oldest
  naming, the nested one with the two current ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sparkd_sim.vllm_text import FinishReason, Generation, Token, prompt_tokens

FieldNaming = Literal["reasoning", "both", "reasoning_content"]
"""vLLM >= 0.16 | 0.11-0.15 | < 0.11 and SGLang."""

Json = dict[str, Any]

ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def dumps(obj: object) -> str:
    """Compact JSON, as pydantic's `model_dump_json` writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def sse(data: object | str) -> bytes:
    """One server-sent event; `data` is a JSON body or a bare string such as `[DONE]`."""
    payload = data if isinstance(data, str) else dumps(data)
    return f"data: {payload}\n\n".encode()


# --- errors -------------------------------------------------------------------------------------


def error_body(
    message: str, err_type: str, code: int, naming: FieldNaming, param: str | None = None
) -> Json:
    if naming == "reasoning_content":
        return {
            "object": "error",
            "message": message,
            "type": err_type,
            "param": param,
            "code": code,
        }
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


@dataclass(frozen=True)
class ErrorReply:
    status: int
    body: Json


def _validation_error(errors: list[Json], naming: FieldNaming) -> ErrorReply:
    # FastAPI's request validation, turned into a 400 by vLLM's handler. The message is the
    # repr of pydantic's error list; newer vLLM types it with the HTTP phrase.
    err_type = "BadRequestError" if naming == "reasoning_content" else "Bad Request"
    return ErrorReply(400, error_body(repr(errors), err_type, 400, naming))


def _bad_request(message: str, naming: FieldNaming, param: str | None = None) -> ErrorReply:
    return ErrorReply(400, error_body(message, "BadRequestError", 400, naming, param))


def internal_error(naming: FieldNaming) -> ErrorReply:
    return ErrorReply(500, error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", 500, naming))


def model_not_found(model: str, naming: FieldNaming) -> ErrorReply:
    return ErrorReply(
        404, error_body(f"The model `{model}` does not exist.", "NotFoundError", 404, naming)
    )


UNAUTHORIZED: Json = {"error": "Unauthorized"}


# --- requests -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatRequest:
    model: str
    max_tokens: int
    stream: bool
    include_usage: bool
    prompt_tokens: int


def _field_error(kind: str, field: str, msg: str, value: object) -> Json:
    return {"type": kind, "loc": ("body", field), "msg": msg, "input": value}


_EXPECTED: dict[str, tuple[tuple[type, ...], str, str]] = {
    "model": ((str,), "string_type", "Input should be a valid string"),
    "messages": ((list,), "list_type", "Input should be a valid list"),
    "stream": ((bool,), "bool_type", "Input should be a valid boolean"),
    "max_tokens": ((int,), "int_type", "Input should be a valid integer"),
    "max_completion_tokens": ((int,), "int_type", "Input should be a valid integer"),
    "temperature": ((int, float), "float_type", "Input should be a valid number"),
    "stream_options": ((dict,), "model_type", "Input should be a valid dictionary"),
}


def _type_errors(body: Mapping[str, Any]) -> list[Json]:
    errors: list[Json] = []
    if body.get("messages") is None:
        errors.append(_field_error("missing", "messages", "Field required", dict(body)))
    for field, (types, kind, msg) in _EXPECTED.items():
        value = body.get(field)
        if value is None:
            continue
        # JSON true/false are Python bools, which are ints too; pydantic's strict-ish int and
        # float parsing rejects them for numbers, and only accepts them for `stream`.
        wrong_bool = isinstance(value, bool) and bool not in types
        if wrong_bool or not isinstance(value, types):
            errors.append(_field_error(kind, field, msg, value))
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                errors.append(
                    _field_error("union_tag_invalid", f"messages.{i}", "Invalid message", message)
                )
    return errors


def parse_chat_request(
    raw: bytes, *, model_id: str, max_model_len: int, naming: FieldNaming
) -> ChatRequest | ErrorReply:
    """Validate a chat completion body the way vLLM does for the basics, in the same order:
    schema first (400), then the model name (404), then the token budget (400)."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        pos = exc.pos if isinstance(exc, json.JSONDecodeError) else 0
        err = {"type": "json_invalid", "loc": ("body", pos), "msg": "JSON decode error"}
        return _validation_error([{**err, "input": {}, "ctx": {"error": str(exc)}}], naming)
    if not isinstance(body, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        return _validation_error(
            [{"type": "model_attributes_type", "loc": ("body",), "msg": msg, "input": body}], naming
        )
    errors = _type_errors(body)
    if body.get("stream_options") is not None and not body.get("stream"):
        msg = "Value error, Stream options can only be defined when `stream=True`."
        errors.append({"type": "value_error", "loc": ("body",), "msg": msg, "input": body})
    if errors:
        return _validation_error(errors, naming)

    model = body.get("model") or model_id  # vLLM serves the first model when none is named
    if model != model_id:
        return model_not_found(model, naming)

    n_prompt = prompt_tokens(body["messages"])
    # As vLLM: `max_completion_tokens or max_tokens`, and what fits in the context when neither.
    requested = body.get("max_completion_tokens") or body.get("max_tokens")
    if requested is None:
        requested = max_model_len - n_prompt
    if requested < 1:
        return _bad_request(f"max_tokens must be at least 1, got {requested}.", naming)
    if n_prompt + requested > max_model_len:
        msg = (
            f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has {n_prompt} "
            f"input tokens ({requested} > {max_model_len} - {n_prompt})."
        )
        return _bad_request(msg, naming, param="max_tokens")

    options = body.get("stream_options") or {}
    return ChatRequest(
        model=model_id,
        max_tokens=requested,
        stream=bool(body.get("stream")),
        include_usage=bool(options.get("include_usage")),
        prompt_tokens=n_prompt,
    )


# --- responses ----------------------------------------------------------------------------------


def models_list(model_id: str, *, created: int, max_model_len: int, perm_id: str) -> Json:
    return {
        "object": "list",
        "data": [
            {
                "id": model_id,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": model_id,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": perm_id,
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }


def _reasoning_fields(text: str | None, naming: FieldNaming) -> Json:
    if naming == "reasoning":
        return {"reasoning": text}
    if naming == "both":
        return {"reasoning": text, "reasoning_content": text}
    return {"reasoning_content": text}


def _message(content: str | None, reasoning: str | None, naming: FieldNaming) -> Json:
    if naming == "reasoning_content":
        return {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
            "tool_calls": [],
        }
    return {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [],
        **_reasoning_fields(reasoning, naming),
    }


def usage(prompt: int, completion: int) -> Json:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def chat_completion(
    gen: Generation, *, request_id: str, created: int, model: str, prompt: int, naming: FieldNaming
) -> Json:
    """A non-streaming `chat.completion` body."""
    reasoning, content = gen.parsed()
    choice: Json = {
        "index": 0,
        "message": _message(content, reasoning, naming),
        "logprobs": None,
        "finish_reason": gen.finish_reason,
        "stop_reason": None,
    }
    if naming == "reasoning":
        choice["token_ids"] = None
    body: Json = {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if naming != "reasoning_content":
        body["service_tier"] = None
        body["system_fingerprint"] = None
    body["usage"] = {**usage(prompt, len(gen.tokens)), "prompt_tokens_details": None}
    body["prompt_logprobs"] = None
    if naming == "reasoning":
        body["prompt_token_ids"] = None
    if naming != "reasoning_content":
        body["kv_transfer_params"] = None
    return body


@dataclass(frozen=True)
class ChunkHeader:
    request_id: str
    created: int
    model: str

    def chunk(self, choices: list[Json], **extra: Any) -> Json:
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


def role_chunk(header: ChunkHeader) -> Json:
    delta = {"role": "assistant", "content": ""}
    return header.chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])


def _runs(tokens: Sequence[Token]) -> list[tuple[str, str]]:
    """Consecutive visible tokens of one channel merged into one delta text."""
    runs: list[tuple[str, str]] = []
    for token in tokens:
        if token.channel == "control":
            continue
        if runs and runs[-1][0] == token.channel:
            runs[-1] = (token.channel, runs[-1][1] + token.text)
        else:
            runs.append((token.channel, token.text))
    return runs


def delta_chunks(
    header: ChunkHeader,
    tokens: Sequence[Token],
    naming: FieldNaming,
    finish_reason: FinishReason | None = None,
) -> list[Json]:
    """The chunks for one engine step's tokens. The last step's final chunk carries the finish
    reason (and `stop_reason`); a last step with nothing visible still sends `content: ""`."""
    deltas: list[Json] = []
    for channel, text in _runs(tokens):
        deltas.append(
            _reasoning_fields(text, naming) if channel == "reasoning" else {"content": text}
        )
    if finish_reason is not None and not deltas:
        deltas.append({"content": ""})
    chunks: list[Json] = []
    for i, delta in enumerate(deltas):
        choice: Json = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        if finish_reason is not None and i == len(deltas) - 1:
            choice["finish_reason"] = finish_reason
            choice["stop_reason"] = None
        chunks.append(header.chunk([choice]))
    return chunks


def usage_chunk(header: ChunkHeader, prompt: int, completion: int) -> Json:
    return header.chunk([], usage=usage(prompt, completion))

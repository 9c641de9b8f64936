"""HTTP to the model through a channel per request (an SSH direct-tcpip channel in production).

A channel per request, not a local port forward: with a forward the local connect always
succeeds and a refused backend shows up as an EOF; a direct channel is refused outright, so a
loading vLLM reads as `refused`. HTTP/1.1 framing is h11's; bodies and streams are capped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import h11
from prometheus_client.parser import text_string_to_metric_families

from sparkd.core.judging.acceptance import judge_check
from sparkd.core.judging.hang import longest_step
from sparkd.core.reading.classify import (
    EngineLoad,
    classify_failure,
    classify_response,
    classify_stream,
    judge_timeout,
)
from sparkd.core.text import printable
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import ModelEndpoint
from sparkd.model.probe import CheckResult, ProbeResult

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Opener = Callable[[], Awaitable[Streams]]

MAX_BODY = 1 << 20
# A streamed answer is capped in total like a plain body, and line by line: vLLM's chunks are
# a few hundred bytes each, 50 of them for the default probe.
MAX_STREAM_LINES = 10_000
MAX_STREAM_LINE = 64 << 10
READ_CHUNK = 65536


class ChannelRefused(Exception):
    """Nothing listens on the far side (the opener must raise this, not a generic error)."""


class ChannelUnavailable(Exception):
    """The channel could not be opened for another reason: the request was never sent."""


class BodyTooLarge(Exception):
    pass


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes


@asynccontextmanager
async def _exchange(
    opener: Opener,
    method: str,
    authority: str,
    path: str,
    body: bytes | None,
    headers: Sequence[tuple[str, str]],
) -> AsyncIterator[tuple[h11.Connection, asyncio.StreamReader]]:
    reader, writer = await opener()
    try:
        conn = h11.Connection(our_role=h11.CLIENT, max_incomplete_event_size=MAX_BODY)
        all_headers = [("Host", authority), ("Connection", "close"), *headers]
        if body is not None:
            all_headers += [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
            ]
        data = conn.send(h11.Request(method=method, target=path, headers=all_headers))
        if body is not None:
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
        await writer.drain()
        yield conn, reader
    finally:
        writer.close()


async def _next_event(
    conn: h11.Connection, reader: asyncio.StreamReader
) -> h11.Event | type[h11.PAUSED]:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event  # type: ignore[return-value]
        chunk = await reader.read(READ_CHUNK)
        conn.receive_data(chunk)  # b"" marks EOF; h11 turns a cut-off response into an error


@dataclass
class _Response:
    """One response as it is read: its status once the head is in, its body chunk by chunk,
    capped at `limit` bytes in all (`what` names the body in the error)."""

    limit: int
    what: str
    status: int = 0
    size: int = 0

    async def body(
        self, conn: h11.Connection, reader: asyncio.StreamReader
    ) -> AsyncIterator[bytes]:
        while True:
            event = await _next_event(conn, reader)
            if isinstance(event, h11.Response):
                self.status = event.status_code
            elif isinstance(event, h11.Data):
                self.size += len(event.data)
                if self.size > self.limit:
                    raise BodyTooLarge(f"{self.what} over {self.limit} bytes")
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return


async def request(
    opener: Opener,
    method: str,
    authority: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: Sequence[tuple[str, str]] = (),
    max_bytes: int = MAX_BODY,
) -> HttpResponse:
    async with _exchange(opener, method, authority, path, body, headers) as (conn, reader):
        response = _Response(max_bytes, "response body")
        parts = [chunk async for chunk in response.body(conn, reader)]
        return HttpResponse(response.status, b"".join(parts))


async def stream_lines(
    opener: Opener,
    authority: str,
    path: str,
    body: bytes,
    headers: Sequence[tuple[str, str]],
    on_first_data: Callable[[], None],
) -> tuple[int, list[str]]:
    """POST and collect an SSE response's lines, noting when the first token arrives."""
    async with _exchange(opener, "POST", authority, path, body, headers) as (conn, reader):
        response = _Response(MAX_BODY, "stream")
        lines: list[str] = []
        pending = b""
        seen_token = False
        async for chunk in response.body(conn, reader):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                if len(raw) > MAX_STREAM_LINE:
                    raise BodyTooLarge(f"stream line over {MAX_STREAM_LINE} bytes")
                line = raw.decode("utf-8", "replace")
                if not seen_token and _carries_token(line):
                    seen_token = True
                    on_first_data()
                lines.append(line)
            if len(lines) > MAX_STREAM_LINES:
                raise BodyTooLarge(f"stream over {MAX_STREAM_LINES} lines")
            if len(pending) > MAX_STREAM_LINE:
                raise BodyTooLarge(f"stream line over {MAX_STREAM_LINE} bytes")
        if pending:
            lines.append(pending.decode("utf-8", "replace"))
        return response.status, lines


def _carries_token(line: str) -> bool:
    if not line.startswith("data:") or "[DONE]" in line:
        return False
    try:
        chunk = json.loads(line[5:])
    except (ValueError, RecursionError):
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list):
        return False
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            continue
        for field in ("content", "reasoning", "reasoning_content"):
            if isinstance(delta.get(field), str) and delta[field]:
                return True
        if delta.get("tool_calls"):
            return True
    return False


def parse_vllm_metrics(text: str) -> EngineLoad:
    """vLLM's own /metrics: requests running and waiting, generation and prompt tokens, and
    KV-cache usage, each summed over engines (every series carries a `model_name` label, and
    `engine` in vLLM v1: 0.32.0 and 0.34.0 `v1/metrics/loggers.py:499`). The KV-cache gauge is
    what moves while a long prompt is prefilled and no token is counted (core.judging.hang)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in _GAUGES:
            values[family.name] = sum(s.value for s in family.samples)
        elif family.name in _COUNTERS:
            values[family.name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return EngineLoad(
        running=values.get("vllm:num_requests_running"),
        waiting=values.get("vllm:num_requests_waiting"),
        generation_tokens=values.get("vllm:generation_tokens"),
        prompt_tokens=values.get("vllm:prompt_tokens"),
        kv_cache_usage=values.get("vllm:kv_cache_usage_perc"),
    )


# The families read, as prometheus_client names them (a counter's without `_total`).
_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
_COUNTERS = ("vllm:generation_tokens", "vllm:prompt_tokens")


def has_vllm_family(text: str) -> bool:
    """Whether vLLM's own metrics are there at all: `--disable-log-stats` leaves /metrics with
    only the process's and the HTTP server's families."""
    return any(f.name.startswith("vllm:") for f in text_string_to_metric_families(text))


def describe(exc: BaseException) -> str:
    """An exception as a detail: its type and, for OS errors, the system's reason. Never its
    text: an HTTP library's message can quote the request's headers (the API key)."""
    name = type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        return f"{name}: {exc.strerror}"
    return name


def _auth(api_key: str | None) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {api_key}")] if api_key else []


async def _together(*requests: Awaitable[HttpResponse]) -> list[HttpResponse]:
    """The requests at once, each on its own channel; the first failure is raised and the others
    are cancelled (never left running behind the caller)."""
    tasks = [asyncio.ensure_future(r) for r in requests]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def read_endpoint(
    opener: Opener, cluster: ClusterSpec, api_key: str | None, limit: float
) -> tuple[ModelEndpoint, EngineLoad | None]:
    """/health, /v1/models and /metrics at once: the endpoint, and the engine's load as /metrics
    said (None when it could not be read), for a probe that follows to start from."""
    authority = f"{cluster.model_host}:{cluster.model.port}"
    try:
        async with asyncio.timeout(limit):
            health, listed, metrics = await _together(
                request(opener, "GET", authority, "/health"),
                request(opener, "GET", authority, "/v1/models", headers=_auth(api_key)),
                request(opener, "GET", authority, "/metrics"),
            )
    except ChannelRefused:
        return ModelEndpoint(status="refused", detail="connection refused"), None
    except ChannelUnavailable as exc:
        return ModelEndpoint(status="not_run", detail=str(exc)), None
    except TimeoutError:
        return ModelEndpoint(status="timeout", detail=f"no answer within {limit:g}s"), None
    except Exception as exc:  # the edge: a dropped SSH connection, a broken peer, ...
        return ModelEndpoint(status="error", detail=describe(exc)), None
    if listed.status in (401, 403):
        # The server is up and refuses sparkd's key: not a load in progress.
        endpoint = ModelEndpoint(
            status="http_error",
            health_status=health.status,
            detail=f"/v1/models answered HTTP {listed.status}: the API key was refused "
            "(api_key_file does not match the key vllm serve was started with)",
        )
        return endpoint, None
    models = listed_models(listed.body)
    max_len = listed_max_model_len(listed.body, cluster.model.served_name)
    load: EngineLoad | None = None
    exported: bool | None = None
    if metrics.status == 200:
        # Whatever the server prints, it is at worst no figures at all.
        with suppress(ValueError, TypeError, KeyError, IndexError):
            text = metrics.body.decode("utf-8", "replace")
            load = parse_vllm_metrics(text)
            exported = has_vllm_family(text)
    known = load or EngineLoad()
    endpoint = ModelEndpoint(
        status="up",
        health_status=health.status,
        models=models,
        requests_running=known.running,
        generation_tokens_total=known.generation_tokens,
        prompt_tokens_total=known.prompt_tokens,
        kv_cache_usage=known.kv_cache_usage,
        max_model_len=max_len,
        vllm_metrics=exported,
        detail=f"/health {health.status}, /v1/models {listed.status}",
    )
    return endpoint, load


def listed_models(body: bytes) -> tuple[str, ...]:
    """The model ids of a `/v1/models` answer; nothing when it is not that shape."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return ()
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        return ()
    return tuple(
        printable(m["id"][:512])
        for m in data
        if isinstance(m, dict) and isinstance(m.get("id"), str)
    )


def listed_max_model_len(body: bytes, served_name: str) -> int | None:
    """The served model's `max_model_len` in a `/v1/models` answer (vLLM's ModelCard: 0.32.0
    `entrypoints/openai/models/serving.py:66-71`); None when it is not listed or not a
    positive whole number."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        return None
    for entry in data:
        if isinstance(entry, dict) and entry.get("id") == served_name:
            value = entry.get("max_model_len")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


# A probe reads vLLM's /metrics at most twice (before, and after a timeout), each this long.
ENGINE_LOAD_TIMEOUT = 5.0


async def _engine_load(opener: Opener, authority: str) -> EngineLoad | None:
    try:
        async with asyncio.timeout(ENGINE_LOAD_TIMEOUT):
            response = await request(opener, "GET", authority, "/metrics")
        if response.status != 200:
            return None
        return parse_vllm_metrics(response.body.decode("utf-8", "replace"))
    except Exception:  # any failure just means "unknown": the probe verdict stands
        return None


async def run_checks(
    opener: Opener, cluster: ClusterSpec, api_key: str | None
) -> tuple[CheckResult, ...]:
    """A rollout's acceptance checks (`rollout.checks`), one completion each, in order, each
    within the probe timeout; one that cannot be sent says nothing (`ok` None), and neither does
    one that timed out while vLLM generated for other requests (judged as a probe's timeout:
    peak traffic is no fault of the spec; the checks run again with a later probe)."""
    authority = f"{cluster.model_host}:{cluster.model.port}"
    results: list[CheckResult] = []
    for index, check in enumerate(cluster.rollout.checks):
        load_before = await _engine_load(opener, authority)
        payload = {
            "model": cluster.model.served_name,
            "messages": [{"role": "user", "content": check.prompt}],
            "max_tokens": check.max_tokens,
            "temperature": cluster.probe.temperature,
        }
        try:
            async with asyncio.timeout(cluster.probe.timeout):
                response = await request(
                    opener,
                    "POST",
                    authority,
                    "/v1/chat/completions",
                    body=json.dumps(payload).encode(),
                    headers=_auth(api_key),
                )
        except TimeoutError:
            load_after = await _engine_load(opener, authority)
            busy, seen = judge_timeout(
                load_before,
                load_after,
                check.max_tokens,
                waited=cluster.probe.timeout,
                one_step=longest_step(cluster, None).seconds,
            )
            if busy:
                detail = f"no answer in time, overloaded ({seen}): says nothing of the spec"
                results.append(CheckResult(index=index, ok=None, detail=detail))
            else:
                results.append(
                    CheckResult(index=index, ok=False, detail=f"no answer in time; {seen}")
                )
            continue
        except Exception as exc:  # the channel or the connection: nothing learnt
            results.append(CheckResult(index=index, ok=None, detail=describe(exc)))
            continue
        results.append(judge_check(index, check, response.status, response.body))
    return tuple(results)


async def probe(
    opener: Opener,
    cluster: ClusterSpec,
    api_key: str | None,
    *,
    wall_clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    load_before: EngineLoad | None = None,
) -> ProbeResult:
    """One sanity completion, classified; never runs past the probe timeout. `load_before` is
    the engine's load as this cycle's /metrics read said, if it was read: then it is not read
    again. The latency is the completion's alone."""
    spec = cluster.probe
    authority = f"{cluster.model_host}:{cluster.model.port}"
    payload: dict[str, object] = {
        "model": cluster.model.served_name,
        "messages": [{"role": "user", "content": spec.prompt}],
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
    }
    if spec.stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    body = json.dumps(payload).encode()
    # /metrics is read once before (unless the caller just did) and, only if the probe times
    # out, once after: enough to tell a busy engine from a hung one, without adding load.
    if load_before is None:
        load_before = await _engine_load(opener, authority)
    at = wall_clock()
    start = monotonic()
    first: list[float] = []
    try:
        async with asyncio.timeout(spec.timeout):
            if spec.stream:
                status, lines = await stream_lines(
                    opener, authority, "/v1/chat/completions", body, _auth(api_key),
                    lambda: first.append(monotonic() - start),
                )  # fmt: skip
                verdict = classify_stream(status, lines, spec.max_tokens)
            else:
                response = await request(
                    opener,
                    "POST",
                    authority,
                    "/v1/chat/completions",
                    body=body,
                    headers=_auth(api_key),
                )
                status = response.status
                verdict = classify_response(status, response.body, spec.max_tokens)
    except ChannelRefused:
        return ProbeResult(at=at, verdict=classify_failure("refused", "connection refused"))
    except ChannelUnavailable as exc:
        return ProbeResult(at=at, verdict=classify_failure("not_run", str(exc)))
    except TimeoutError:
        latency = monotonic() - start
        load_after = await _engine_load(opener, authority)
        busy, seen = judge_timeout(
            load_before,
            load_after,
            spec.max_tokens,
            waited=latency,
            one_step=longest_step(cluster, None).seconds,
        )
        return ProbeResult(
            at=at,
            verdict=classify_failure("timeout", f"no answer within {spec.timeout:g}s; {seen}"),
            latency_seconds=latency,
            tokens_advanced=busy,
        )
    except BodyTooLarge as exc:
        verdict = classify_response(200, f"<{exc}>")
        return ProbeResult(at=at, verdict=verdict, latency_seconds=monotonic() - start)
    except (ConnectionResetError, ConnectionAbortedError) as exc:
        # An SSH channel carries no reset from its far side (vLLM closing its socket reaches
        # the channel as EOF): a reset here is the ops box's own transport failing, which
        # asyncssh hands to every channel of the connection. Nothing learnt of the model.
        verdict = classify_failure(
            "not_run", f"the SSH connection broke mid-probe ({describe(exc)})"
        )
        return ProbeResult(at=at, verdict=verdict, latency_seconds=monotonic() - start)
    except (h11.ProtocolError, OSError, EOFError) as exc:
        verdict = classify_response(200, f"<connection broke: {type(exc).__name__}>")
        return ProbeResult(at=at, verdict=verdict, latency_seconds=monotonic() - start)
    except Exception as exc:  # e.g. the SSH connection dropped: nothing learnt about the model
        verdict = classify_failure("not_run", describe(exc))
        return ProbeResult(at=at, verdict=verdict, latency_seconds=monotonic() - start)
    return ProbeResult(
        at=at,
        verdict=verdict,
        latency_seconds=monotonic() - start,
        ttft_seconds=first[0] if first else None,
        http_status=status,
    )

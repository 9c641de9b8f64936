"""A small OpenAI-compatible HTTP server that behaves like `vllm serve` with a reasoning model.

It answers `/health`, `/v1/models`, `/metrics` and `/v1/chat/completions` in vLLM's schema, and
can be made to misbehave the ways a real deployment does (see `ModelBehaviour`). The world owns the
`ModelBehaviour` and changes it at run time; the server reads it on every request and engine step.

Timing is real (asyncio sleeps), scaled by `token_latency`: tokens are produced in small batches so
that no sleep is shorter than a few milliseconds, and the generation counter in `/metrics` rises as
they are produced. Busy and hung differ only in that counter, as on a real server.

A long prompt (`send_prompt`, the `long-prompt` fault) is prefilled in chunks as vLLM V1 does:
no output for a step that prefills part of a prompt, so while it runs no token counter moves
(the prompt counter counts it when the prefill ends, with its first token), one more request is
running, `vllm:kv_cache_usage_perc` rises with every chunk, and a request that arrives meanwhile
waits (`vllm:num_requests_waiting`) until the prefill is done: the chunk takes the step's token
budget and running requests are scheduled first. A hung engine makes no step: every figure
stands, and the blocks of requests whose clients gave up are freed only once it steps again.
Sources: tests/fixtures/vllm-prefill/README.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder

from sparkd_sim.vllm_behaviour import SERVED_KEPT, EngineState, ModelBehaviour, Served
from sparkd_sim.vllm_schema import (
    ENGINE_DEAD_MESSAGE,
    UNAUTHORIZED,
    ChatRequest,
    ChunkHeader,
    ErrorReply,
    FieldNaming,
    Json,
    chat_completion,
    delta_chunks,
    dumps,
    error_body,
    internal_error,
    models_list,
    parse_chat_request,
    role_chunk,
    sse,
    usage_chunk,
)
from sparkd_sim.vllm_text import AnswerStyle, Generation, Token, plan_generation

__all__ = [
    "BUSY_SEQUENCES",
    "MAX_BODY_BYTES",
    "AnswerStyle",
    "EngineState",
    "FieldNaming",
    "ModelBehaviour",
    "SimVllmServer",
]


MAX_BODY_BYTES = 1 << 20
"""Request bodies above this are refused with 413."""
BUSY_SEQUENCES = 16
"""Other clients' requests a busy server is decoding, each producing one token per step."""

KV_BLOCK_TOKENS = 16
"""Tokens per KV-cache block (vLLM's default block size on CUDA)."""
KV_CAPACITY_LENS = 4
"""The KV cache holds this many `max_model_len` prompts (vLLM refuses to start unless it holds
one)."""
PREFILL_CHUNK = 2048
"""Prompt tokens prefilled per engine step (a step's token budget, `max_num_batched_tokens`)."""
LONG_PROMPT_MAX_TOKENS = 16
"""What a long prompt's client asks to generate once its prefill is done."""

_MIN_SLEEP = 0.005  # shortest sleep per batch of tokens: realistic pacing, no event-loop flood
_STATE_POLL = 0.01  # how soon a stalled request notices the engine recovered or died
_SHUTDOWN_GRACE = 0.02  # stop(): wait this long for handlers before cancelling them
_Metric = TypeVar("_Metric", Gauge, Counter)


class _EngineDied(Exception):
    """The engine died while a request was being generated."""


@dataclass
class _Blocks:
    """The KV-cache blocks one request holds."""

    tokens: int = 0
    blocks: int = 0


class _Discard:
    """A counter of a family the server does not export."""

    def inc(self, amount: float = 1) -> None:
        del amount


class SimVllmServer:
    """One simulated `vllm serve` process: single use, `start()` then `stop()`."""

    def __init__(
        self,
        model_id: str,
        behaviour: ModelBehaviour,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        max_model_len: int = 262144,
        served: deque[Served] | None = None,
        log_stats: bool = True,
    ) -> None:
        self._model_id = model_id
        # Every request's own time, newest last (shared by the caller, if given).
        self.served: deque[Served] = served if served is not None else deque(maxlen=SERVED_KEPT)
        self._behaviour = behaviour
        self._host = host
        self._requested_port = port
        self._api_key = api_key
        self._max_model_len = max_model_len

        self._runner: web.AppRunner | None = None
        self._used = False
        self._stopping = False
        self._port = 0
        self._created = int(time.time())
        self._ids = itertools.count(1)
        self._busy_task: asyncio.Task[None] | None = None

        self._in_flight = 0
        self._abandoned_hung = 0
        self._generation_tokens = 0
        self._prompt_tokens = 0
        self._waiting = 0  # requests queued behind a long prefill
        self._prefilling = 0  # long prompts being prefilled
        self._no_prefill = asyncio.Event()
        self._no_prefill.set()
        self._prompts: set[asyncio.Task[None]] = set()
        self._kv_blocks_total = max(1, KV_CAPACITY_LENS * max_model_len // KV_BLOCK_TOKENS)
        self._kv_used = 0
        self._kv_abandoned = 0  # blocks of requests given up on while the engine hung

        self._registry = CollectorRegistry(auto_describe=True)
        # The process's own families, as prometheus_client's defaults give them; the server's
        # `http_*` families are left out (tests/fixtures/vllm-real/metrics-idle.txt has both).
        ProcessCollector(registry=self._registry)
        PlatformCollector(registry=self._registry)
        GCCollector(registry=self._registry)
        # Stand-ins for the engine's stats, updated with each request.
        self._prompt_counter: Counter | _Discard = _Discard()
        self._generation_counter: Counter | _Discard = _Discard()
        if not log_stats:
            # `--disable-log-stats`: vLLM makes no StatLoggerManager (0.32.0
            # `v1/engine/async_llm.py:196-203`), so /metrics has no `vllm:` family at all.
            return
        running = self._metric(
            Gauge, "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        running.set_function(lambda: float(self.requests_running))
        self._metric(
            Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).set_function(lambda: float(self._waiting))
        self._metric(
            Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).set_function(lambda: self.kv_cache_usage)
        self._prompt_counter = self._metric(
            Counter, "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self._generation_counter = self._metric(
            Counter, "vllm:generation_tokens", "Number of generation tokens processed."
        )

    def _metric(self, kind: type[_Metric], name: str, documentation: str) -> _Metric:
        """One of vLLM's metrics, as its engine 0 reports it for this model."""
        labels = ("engine", "model_name")
        return kind(name, documentation, labels, registry=self._registry).labels(
            "0", self._model_id
        )

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> int:
        """Bind and serve; returns the bound port. Until this returns, connects are refused."""
        if self._used:
            raise RuntimeError("SimVllmServer is single use: make a new one to serve again")
        self._used = True
        # aiohttp 3 needs the decorator's marker, which a bound method cannot carry.
        middleware = web.middleware(lambda req, handler: self._middleware(req, handler))
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[middleware])
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        # handler_cancellation: a client that gives up aborts its request, as in vLLM.
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=_SHUTDOWN_GRACE,
            handler_cancellation=True,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._requested_port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        self._created = int(time.time())
        self._ensure_busy_load()
        return self._port

    async def stop(self) -> None:
        """Close the listener and every open connection, in-flight requests included (they get
        no answer: the process went away)."""
        self._stopping = True
        for task in list(self._prompts):
            task.cancel()
        await asyncio.gather(*self._prompts, return_exceptions=True)
        if self._busy_task is not None:
            self._busy_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._busy_task
            self._busy_task = None
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @property
    def port(self) -> int:
        """The bound port (0 before `start()`)."""
        return self._port

    @property
    def requests_running(self) -> int:
        """Requests the engine reports as running, as `vllm:num_requests_running` does."""
        b = self._behaviour
        if b.engine != "hung":
            # A hung engine never processes aborts, so requests whose clients gave up stay counted
            # until it recovers or dies; then they are gone.
            self._abandoned_hung = 0
        others = BUSY_SEQUENCES if b.style == "busy" and b.engine != "dead" else 0
        return self._in_flight - self._waiting + self._abandoned_hung + others

    @property
    def kv_cache_usage(self) -> float:
        """`vllm:kv_cache_usage_perc`: the share of KV blocks held. A hung engine processes no
        abort, so what its abandoned requests hold is freed only once it steps again."""
        if self._behaviour.engine != "hung" and self._kv_abandoned:
            self._kv_used -= self._kv_abandoned
            self._kv_abandoned = 0
        return min(1.0, self._kv_used / self._kv_blocks_total)

    def send_prompt(self, prompt_tokens: int) -> None:
        """A client's request with a prompt of `prompt_tokens` tokens (a long one, typically),
        answered with `LONG_PROMPT_MAX_TOKENS` tokens; it runs until done or the server stops."""
        if prompt_tokens + LONG_PROMPT_MAX_TOKENS > self._max_model_len:
            # vLLM answers 400 for a prompt that does not fit.
            raise ValueError(
                f"a prompt of {prompt_tokens} tokens does not fit max_model_len "
                f"{self._max_model_len}"
            )
        if self._runner is None or self._stopping:
            raise RuntimeError("the server is not running")
        task = asyncio.get_running_loop().create_task(self._long_prompt(prompt_tokens))
        self._prompts.add(task)
        task.add_done_callback(self._prompts.discard)

    @property
    def generation_tokens_total(self) -> int:
        self._ensure_busy_load()
        return self._generation_tokens

    @property
    def prompt_tokens_total(self) -> int:
        return self._prompt_tokens

    # --- HTTP -----------------------------------------------------------------------------------

    async def _middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        at, started = time.time(), time.monotonic()
        status = 500
        try:
            response = await self._dispatch(request, handler)
            status = response.status
            return response
        finally:
            self.served.append(
                Served(request.method, request.path, status, at, time.monotonic() - started)
            )

    async def _dispatch(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        self._ensure_busy_load()
        # vLLM's AuthenticationMiddleware guards /v1 only; /health and /metrics stay open.
        if (
            self._api_key is not None
            and request.path.startswith("/v1")
            and request.method != "OPTIONS"
            and not self._authorized(request)
        ):
            return _json(UNAUTHORIZED, 401)
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return _json({"detail": "Not Found"}, 404)
        except web.HTTPMethodNotAllowed:
            return _json({"detail": "Method Not Allowed"}, 405)

    def _authorized(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self._api_key}".encode())

    async def _health(self, _request: web.Request) -> web.Response:
        # vLLM asks the engine client, which only notices a dead engine, never a hung one.
        return web.Response(status=503 if self._behaviour.engine == "dead" else 200)

    async def _models(self, _request: web.Request) -> web.Response:
        perm = "modelperm-" + hashlib.sha256(self._model_id.encode()).hexdigest()[:32]
        body = models_list(
            self._model_id, created=self._created, max_model_len=self._max_model_len, perm_id=perm
        )
        return _json(body, 200)

    async def _metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(self._registry), headers={"Content-Type": content_type})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        b = self._behaviour
        parsed = parse_chat_request(
            raw, model_id=self._model_id, max_model_len=self._max_model_len, naming=b.naming
        )
        if isinstance(parsed, ErrorReply):
            return _json(parsed.body, parsed.status)
        if b.engine == "dead":
            # vLLM's EngineDeadError handler (0.32, tests/fixtures/vllm-real): a 500 with the
            # error JSON, then the server shuts itself down.
            dead = error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", 500, b.naming)
            return _json(dead, 500)
        style = b.style
        if style == "http_500":
            reply = internal_error(b.naming)
            return _json(reply.body, reply.status)

        gen = plan_generation(style, parsed.max_tokens)
        slowdown = b.slow_factor if style in ("slow", "busy") else 1.0
        digest = hashlib.sha256(f"{self._model_id}:{next(self._ids)}".encode()).hexdigest()
        header = ChunkHeader(f"chatcmpl-{digest[:32]}", int(time.time()), self._model_id)
        self._in_flight += 1
        held = _Blocks()
        try:
            if parsed.stream:
                return await self._stream(request, parsed, gen, header, style, slowdown, held)
            return await self._complete(parsed, gen, header, style, slowdown, held)
        except asyncio.CancelledError:
            if self._behaviour.engine == "hung" and not self._stopping:
                self._abandoned_hung += 1
            raise
        finally:
            self._in_flight -= 1
            self._release(held)

    async def _complete(
        self,
        req: ChatRequest,
        gen: Generation,
        header: ChunkHeader,
        style: AnswerStyle,
        slowdown: float,
        held: _Blocks,
    ) -> web.Response:
        try:
            async for _batch, _last in self._generate(gen, req, slowdown, held):
                pass
        except _EngineDied:
            return web.Response(status=500)
        body = chat_completion(
            gen,
            request_id=header.request_id,
            created=header.created,
            model=self._model_id,
            prompt=req.prompt_tokens,
            naming=self._behaviour.naming,
        )
        text = dumps(body)
        if style == "malformed":
            text = text[: len(text) // 2]
        return web.Response(text=text, content_type="application/json")

    async def _stream(
        self,
        request: web.Request,
        req: ChatRequest,
        gen: Generation,
        header: ChunkHeader,
        style: AnswerStyle,
        slowdown: float,
        held: _Blocks,
    ) -> web.StreamResponse:
        naming = self._behaviour.naming
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        # Headers go out at once (Starlette's StreamingResponse); the role chunk waits for the
        # first token, so time to first token is measurable from the first data line.
        await resp.prepare(request)
        first = True
        try:
            async for batch, last in self._generate(gen, req, slowdown, held):
                if first:
                    first = False
                    await resp.write(sse(role_chunk(header)))
                    if style == "malformed":
                        chunk = dumps(delta_chunks(header, batch, naming)[0])
                        await resp.write(f"data: {chunk[: len(chunk) // 2]}\n\n".encode())
                        await resp.write_eof()
                        return resp
                finish = gen.finish_reason if last else None
                for chunk_body in delta_chunks(header, batch, naming, finish):
                    await resp.write(sse(chunk_body))
            if req.include_usage:
                await resp.write(sse(usage_chunk(header, req.prompt_tokens, len(gen.tokens))))
        except _EngineDied:
            # The status line is already sent: vLLM reports the error as the next event.
            dead = error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", 500, naming)
            await resp.write(sse(dead))
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp

    # --- the engine -----------------------------------------------------------------------------

    async def _generate(
        self, gen: Generation, req: ChatRequest, slowdown: float, held: _Blocks
    ) -> AsyncIterator[tuple[Sequence[Token], bool]]:
        """Produce `gen`'s tokens at the behaviour's pace; yields (batch, is_last_batch)."""
        b = self._behaviour
        await self._behind_prefills()
        await self._engine_step(b.first_token_latency * slowdown)
        self._take(held, req.prompt_tokens)
        self._count_prompt(req.prompt_tokens)
        per_token = b.token_latency * slowdown
        size = max(1, math.ceil(_MIN_SLEEP / per_token)) if per_token > 0 else len(gen.tokens)
        tokens = gen.tokens
        for start in range(0, len(tokens), size):
            batch = tokens[start : start + size]
            await self._engine_step(per_token * len(batch))
            self._take(held, len(batch))
            self._count_generated(len(batch))
            yield batch, start + size >= len(tokens)

    async def _behind_prefills(self) -> None:
        """Wait, as a waiting request, while a long prompt is prefilled: its chunks take each
        step's token budget, and vLLM schedules running requests before waiting ones."""
        if not self._prefilling:
            return
        self._waiting += 1
        try:
            await self._no_prefill.wait()
        finally:
            self._waiting -= 1

    async def _long_prompt(self, prompt_tokens: int) -> None:
        """One client's long prompt: prefilled chunk by chunk with no output (no counter moves,
        the KV cache fills), then its first token and the prompt counted, then a short answer.
        The client waits for it all; the server stopping ends it."""
        held = _Blocks()
        self._in_flight += 1
        try:
            self._prefilling += 1
            self._no_prefill.clear()
            try:
                left = prompt_tokens
                while left > 0:
                    chunk = min(PREFILL_CHUNK, left)
                    await self._engine_step(chunk / self._behaviour.prefill_rate)
                    self._take(held, chunk)
                    left -= chunk
            finally:
                self._prefilling -= 1
                if not self._prefilling:
                    self._no_prefill.set()
            self._count_prompt(prompt_tokens)
            self._take(held, 1)
            self._count_generated(1)
            for _ in range(LONG_PROMPT_MAX_TOKENS - 1):
                await self._engine_step(max(self._behaviour.token_latency, _MIN_SLEEP))
                self._take(held, 1)
                self._count_generated(1)
        except _EngineDied:
            pass
        finally:
            self._in_flight -= 1
            self._release(held)

    def _take(self, held: _Blocks, tokens: int) -> None:
        """`tokens` more in a request's KV cache: a block for every `KV_BLOCK_TOKENS`."""
        held.tokens += tokens
        blocks = math.ceil(held.tokens / KV_BLOCK_TOKENS)
        self._kv_used += blocks - held.blocks
        held.blocks = blocks

    def _release(self, held: _Blocks) -> None:
        """A request ended: its blocks are freed, once the engine steps (a hung one does not)."""
        if self._behaviour.engine == "hung" and not self._stopping:
            self._kv_abandoned += held.blocks
        else:
            self._kv_used -= held.blocks
        held.blocks = held.tokens = 0

    def _count_prompt(self, n: int) -> None:
        self._prompt_tokens += n
        self._prompt_counter.inc(n)

    async def _engine_step(self, duration: float) -> None:
        """Let `duration` of engine time pass; a hung engine stops time until it recovers."""
        await asyncio.sleep(duration)
        while (state := self._behaviour.engine) != "ok":
            if state == "dead":
                raise _EngineDied
            await asyncio.sleep(_STATE_POLL)

    def _count_generated(self, n: int) -> None:
        self._generation_tokens += n
        self._generation_counter.inc(n)

    def _ensure_busy_load(self) -> None:
        """Run the other clients' load while the style is `busy`.

        Started lazily whenever the server is touched (any request, the counter property), since
        the world flips the style on a plain dataclass; the task ends by itself when the style
        changes, so an idle server costs nothing.
        """
        if self._runner is None or self._stopping or self._behaviour.style != "busy":
            return
        if self._busy_task is not None and not self._busy_task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._busy_task = loop.create_task(self._busy_load())

    async def _busy_load(self) -> None:
        b = self._behaviour
        while b.style == "busy" and not self._stopping:
            step = max(b.token_latency, _MIN_SLEEP)
            await asyncio.sleep(step)
            if b.engine == "ok":
                per_seq = step / b.token_latency if b.token_latency > 0 else 1.0
                self._count_generated(max(1, round(BUSY_SEQUENCES * per_seq)))


def _json(body: Json, status: int) -> web.Response:
    return web.Response(text=dumps(body), status=status, content_type="application/json")

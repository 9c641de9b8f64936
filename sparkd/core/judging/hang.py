"""A hang under load, from vLLM's own figures: requests running and nothing moving.

A hung engine answers /metrics from its API server with the last figures it had: requests
running, `vllm:generation_tokens_total` standing still, and every other figure its scheduler
publishes frozen too, since those come with each engine step and a hung engine makes none.

Stillness of the token counters alone is not enough. vLLM V1 emits no output for a step that
prefills only part of a prompt (`should_emit_output = bool(new_token_ids or pooler_output is not
None or stopped)`, 0.32.0 `v1/core/sched/scheduler.py:2200`, 0.34.0 :2502), so a 120k-token
prompt (a minute or more on two Sparks, at about 2k tokens/s) moves neither
`vllm:generation_tokens_total` nor `vllm:prompt_tokens_total` (counted from outputs, when the
prefill ends: `v1/metrics/stats.py:516-519` in 0.32.0, :520-523 in 0.34.0) nor
`vllm:iteration_tokens_total` (no IterationStats for a step with no outputs:
`v1/engine/async_llm.py:853` in 0.32.0, :898 in 0.34.0). What does move is
`vllm:kv_cache_usage_perc`: the scheduler stats are returned every step, outputs or not
(`scheduler.py:2419` / :2738), and each prefill chunk takes KV blocks (`allocate_slots`,
usage = 1 - free/total, `v1/core/block_pool.py:888` / :923).

So a hang needs positive evidence that nothing moves: requests running, and the token counters
and the KV-cache usage all still across looks spanning `policy.hang_window`. Any of them moving
restarts that clock. When the KV gauge cannot be read (an older vLLM, a partial reading), a
prefill cannot be told from a hang, and the wait is the longest prefill the engine allows
(`max_model_len` at `policy.prefill_rate`) instead of `hang_window` alone. And since a prefill
ends in a token, requests running with no token counted for longer than that is not a prefill
even while the KV cache moves (a livelock): every hold here ends.

Every time here is daemon time (elapsed, cannot step); a window is measured from the first look
of an unbroken run of looks that each saw requests running and the figures still, so an engine
that sat idle and just took a request has stood still for no time at all, and one that moved just
before a look has stood still from that look on (it may have moved at that instant).

Not a hang either: no requests running (idle), a counter that went back (a restarted engine: a
fresh reading), and a just-ready engine compiling its first shapes (vLLM's first-shape JIT stalls
it for 30-70 s after readiness): the stall clock of a launch starts no earlier than
`policy.hang_ready_grace` after it was ready.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkd.core.judging.judge import Context, Verdict, act, ago
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory, TokenMark
from sparkd.model.observed import ModelEndpoint

COUNTER = "vllm:generation_tokens_total"
KV_GAUGE = "vllm:kv_cache_usage_perc"
# The longest prompt assumed when neither the engine (`/v1/models`) nor `--max-model-len` in
# the model's arguments says: a million tokens, the longest context of open models today.
ASSUMED_MAX_MODEL_LEN = 1 << 20
# An engine's own `max_model_len` is believed up to this many tokens: a larger one bounds a
# hold no further (at the default prefill rate, 70 minutes).
MAX_MODEL_LEN_CAP = 1 << 22


@dataclass(frozen=True)
class Reading:
    running: float
    tokens: float
    prompt: float | None = None
    kv: float | None = None
    max_len: int | None = None


def reading(ctx: Context) -> Reading | None:
    """This look's requests running and token counter, when /metrics gave both."""
    return _reading(ctx.observed.endpoint)


def _reading(endpoint: ModelEndpoint | None) -> Reading | None:
    if endpoint is None or endpoint.status != "up":
        return None
    running, tokens = endpoint.requests_running, endpoint.generation_tokens_total
    if running is None or tokens is None:
        return None
    return Reading(
        running=running,
        tokens=tokens,
        prompt=endpoint.prompt_tokens_total,
        kv=endpoint.kv_cache_usage,
        max_len=endpoint.max_model_len,
    )


def track(ctx: Context) -> TokenMark | None:
    """The mark after this look: kept as it was when the counter could not be read."""
    before = ctx.memory.token_mark
    serve = ctx.observed.serve
    pid = serve.pid if serve is not None and serve.running else None
    if before is not None and pid is not None and before.pid != pid:
        # Another serve process: nothing the old counter said is about this one.
        before = None
    return _advance(before, reading(ctx), pid, ctx.now)


def _advance(
    before: TokenMark | None, seen: Reading | None, pid: int | None, now: float
) -> TokenMark | None:
    if seen is None:
        return before
    running = seen.running > 0
    pid = pid if pid is not None else (before.pid if before is not None else None)
    fresh = TokenMark(
        pid=pid,
        tokens=seen.tokens,
        since=now,
        running=running,
        prompt_tokens=seen.prompt,
        kv_cache_usage=seen.kv,
    )
    if before is None or not running or not before.running:
        # First read, idle, or requests just arrived: still for no time yet.
        return fresh
    if seen.tokens != before.tokens or _moved(before.prompt_tokens, seen.prompt):
        # A token or a finished prefill (or a counter that went back: a restarted engine).
        return fresh
    if seen.kv is None:
        # Not read this time: nothing is known to have moved, and nothing to have stood.
        return before
    if before.kv_cache_usage is None or seen.kv != before.kv_cache_usage:
        # The engine stepped with no output (a prefill chunk), or the gauge was first read:
        # nothing has stood still since this look, but no token has come since the quiet began.
        quiet = before.quiet_since if before.quiet_since is not None else before.since
        return fresh.model_copy(update={"quiet_since": quiet})
    return before


def _moved(before: float | None, now: float | None) -> bool:
    return before is not None and now is not None and before != now


def stall_start(ctx: Context, mark: TokenMark) -> float:
    return _stall_start(ctx.desired, ctx.memory, mark.since, ctx.now)


def _stall_start(desired: ClusterSpec, memory: Memory, since: float, now: float) -> float:
    """When a stall clock started: the mark's look, or the end of the first-shape grace
    (from when sparkd first saw the model ready, daemon time; this look if not yet)."""
    ready = memory.model_ready_at
    grace_end = (ready if ready is not None else now) + desired.policy.hang_ready_grace
    return max(since, grace_end)


def _quiet_since(mark: TokenMark) -> float:
    return mark.quiet_since if mark.quiet_since is not None else mark.since


@dataclass(frozen=True)
class Longest:
    """The longest something the engine does can last here (one prefill, one step), and what
    that was worked out from."""

    seconds: float
    how: str


def longest_prefill(desired: ClusterSpec, seen: Reading | None) -> Longest:
    """The longest prompt the engine takes, at the slowest prefill rate the policy allows."""
    rate = desired.policy.prefill_rate
    given = seen.max_len if seen is not None else None
    if given is not None and given > 0:
        tokens, source = min(given, MAX_MODEL_LEN_CAP), "as /v1/models says"
    elif (flag := max_model_len_arg(desired.model.extra_args)) is not None:
        tokens, source = min(flag, MAX_MODEL_LEN_CAP), "--max-model-len"
    else:
        tokens, source = ASSUMED_MAX_MODEL_LEN, "assumed: neither /v1/models nor the args say"
    seconds = tokens / rate
    return Longest(
        seconds,
        f"{ago(seconds)}: max_model_len {tokens} ({source}) at policy.prefill_rate "
        f"{rate:g} tokens/s",
    )


_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


# vLLM 0.32.0's largest default step for the API server (engine/arg_utils.py
# `get_batch_defaults`: 16384 or 8192 tokens by device, fewer on smaller ones).
DEFAULT_STEP_TOKENS = 16384


def longest_step(desired: ClusterSpec, seen: Reading | None) -> Longest:
    """The longest one engine step can last (the scheduler publishes its stats, the KV-cache gauge
    among them, only once a step ends). One engine step prefills at most `max_num_batched_tokens` of
    a prompt, or a whole prompt with chunked prefill off (vLLM 0.32.0 v1/core/sched/scheduler.py: a
    prompt is not split then; config/scheduler.py makes max_num_batched_tokens at least
    max_model_len). Such a step of 131k tokens is over two minutes of every figure standing still,
    one request running."""
    rate = desired.policy.prefill_rate
    args = desired.model.extra_args
    whole = longest_prefill(desired, seen)
    if _last_flag(args, ("--enable-chunked-prefill", "--no-enable-chunked-prefill")) == (
        "--no-enable-chunked-prefill"
    ):
        return Longest(whole.seconds, f"a whole prompt (--no-enable-chunked-prefill): {whole.how}")
    batched = _int_arg(args, "--max-num-batched-tokens")
    tokens, source = (
        (batched, "--max-num-batched-tokens")
        if batched is not None
        else (DEFAULT_STEP_TOKENS, "vLLM's largest default")
    )
    seconds = min(tokens / rate, whole.seconds)
    return Longest(
        seconds,
        f"{ago(seconds)}: {tokens} tokens a step ({source}) at policy.prefill_rate "
        f"{rate:g} tokens/s",
    )


def _last_flag(args: tuple[str, ...], flags: tuple[str, ...]) -> str | None:
    """Which of `flags` the arguments give last (argparse's last wins), dashes for `_`."""
    found: str | None = None
    for arg in args:
        flag = arg.partition("=")[0].replace("_", "-")
        if flag in flags:
            found = flag
    return found


def max_model_len_arg(args: tuple[str, ...]) -> int | None:
    """`--max-model-len` in `vllm serve` arguments, as vLLM reads it (0.32.0
    `utils/argparse_utils.py` `human_readable_int_or_auto`: `131072`, `128k` = 128000,
    `128K` = 131072); None when absent, `auto`/`-1` (the model's own) or unreadable. The last
    one given wins, as with argparse; underscores are read as dashes, as vLLM does."""
    return _int_arg(args, "--max-model-len")


def _int_arg(args: tuple[str, ...], name: str) -> int | None:
    """An integer option of `vllm serve` as vLLM reads it (human-readable: `128k`, `128K`)."""
    found: str | None = None
    for index, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag.replace("_", "-") != name:
            continue
        if eq:
            found = value
        elif index + 1 < len(args):
            found = args[index + 1]
    if found is None:
        return None
    text = found.strip()
    if (match := _HUMAN.fullmatch(text)) is not None:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            return None
        return int(number) * _BINARY[suffix]
    return int(text) if text.isdigit() and int(text) > 0 else None


def _hang(
    desired: ClusterSpec, memory: Memory, mark: TokenMark | None, seen: Reading | None, now: float
) -> str | None:
    """Why this reading, with the mark after it, is a hang under load; None if it is not."""
    if mark is None or seen is None or not mark.running or seen.running <= 0:
        return None
    window = desired.policy.hang_window
    prefill = longest_prefill(desired, seen)
    running = f"{seen.running:g} request(s) running"
    if mark.since < now:
        still = now - _stall_start(desired, memory, mark.since, now)
        stood = f"{running} and {COUNTER} still at {seen.tokens:g} for {ago(now - mark.since)}"
        if seen.kv is not None and mark.kv_cache_usage is not None:
            # The gauge moves once a step ends: one step may outlast hang_window.
            step = longest_step(desired, seen)
            if still >= max(window, step.seconds):
                return (
                    f"hung under load: {stood} (hang_window {ago(window)}), and {KV_GAUGE} "
                    f"still at {seen.kv:g}: no engine step since, longer than the longest one "
                    f"({step.how})"
                )
        elif still >= max(window, prefill.seconds):
            return (
                f"hung under load: {stood} (hang_window {ago(window)}); without {KV_GAUGE} a "
                f"long prefill looks the same, so this waited for the longest one ({prefill.how})"
            )
    quiet = _quiet_since(mark)
    if quiet < now and now - _stall_start(desired, memory, quiet, now) >= max(
        window, prefill.seconds
    ):
        return (
            f"hung under load: {running} and {COUNTER} still at {seen.tokens:g} for "
            f"{ago(now - quiet)} while {KV_GAUGE} moved: longer than the longest prefill "
            f"({prefill.how}), so not a prefill"
        )
    return None


def stands(
    desired: ClusterSpec, memory: Memory, endpoint: ModelEndpoint | None, now: float
) -> bool:
    """Whether this endpoint reading, with what memory holds, is a hang under load: a probe
    sent now would only time out (30 s at the defaults) before the restart it cannot avert."""
    seen = _reading(endpoint)
    mark = _advance(memory.token_mark, seen, None, now)
    return _hang(desired, memory, mark, seen, now) is not None


def deadline(ctx: Context, mark: TokenMark | None) -> float | None:
    """When a standing reading becomes a hang, for the horizon: None unless one is standing."""
    if mark is None or not mark.running:
        return None
    window = ctx.desired.policy.hang_window
    seen = reading(ctx)
    prefill = longest_prefill(ctx.desired, seen).seconds
    longest = max(window, prefill)
    step = max(window, longest_step(ctx.desired, seen).seconds)
    still = step if mark.kv_cache_usage is not None else longest
    return min(
        stall_start(ctx, mark) + still,
        _stall_start(ctx.desired, ctx.memory, _quiet_since(mark), ctx.now) + longest,
    )


def judge_hang(ctx: Context, mark: TokenMark | None) -> Verdict:
    verdict = Verdict()
    seen = reading(ctx)
    why = _hang(ctx.desired, ctx.memory, mark, seen, ctx.now)
    if why is None:
        if mark is not None and seen is not None:
            verdict.notes.extend(_prefilling(ctx, mark, seen))
        return verdict
    verdict.phase = "degraded"
    verdict.notes.append(why)
    verdict.actions.append(act("restart_model", ctx.desired.head.name, ctx.desired.model.id, why))
    return verdict


def _prefilling(ctx: Context, mark: TokenMark, seen: Reading) -> list[str]:
    """What a restart withheld for a long prefill says: the token counter has stood with
    requests running for `hang_window` or more, and the KV cache moved since the last look."""
    before = ctx.memory.token_mark
    if before is None or before.kv_cache_usage is None or seen.kv is None:
        return []
    if before.pid != mark.pid:
        return []  # another serve process: its KV cache is another's
    if seen.running <= 0 or seen.kv == before.kv_cache_usage or seen.tokens != before.tokens:
        return []
    quiet = _quiet_since(mark)
    window = ctx.desired.policy.hang_window
    if ctx.now - _stall_start(ctx.desired, ctx.memory, quiet, ctx.now) < window:
        return []
    grew = "grew" if seen.kv > before.kv_cache_usage else "moved"
    prefill = longest_prefill(ctx.desired, seen)
    return [
        f"not restarting: {seen.running:g} request(s) running and the KV cache {grew} since "
        f"the last look ({KV_GAUGE} {before.kv_cache_usage:g} -> {seen.kv:g}) while "
        f"{COUNTER} stood at {seen.tokens:g} for {ago(ctx.now - quiet)}: a long prefill "
        f"(a hang only past the longest one, {prefill.how})"
    ]

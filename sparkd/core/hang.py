"""A hang under load, from vLLM's own counters: requests running and no token generated.

A hung engine answers /metrics from its API server with the last figures it had: requests
running, and `vllm:generation_tokens_total` standing still. Seen across looks spanning
`policy.hang_window`, that is a hang, judged without waiting for `failure_threshold` probe
timeouts. Every time here is daemon time (elapsed, cannot step); the window is measured from the
first look of an unbroken run of looks that each saw requests running and the same counter, so
an engine that sat idle and just took a request has stood still for no time at all, and one that
moved just before a look has stood still from that look on (it may have moved at that instant).

Not a hang: tokens moving (busy), no requests running (idle), a counter that went back (a
restarted engine: a fresh reading), and a just-ready engine compiling its first shapes (vLLM's
first-shape JIT stalls it for 30-70 s after readiness): the stall clock of a launch starts no
earlier than `policy.hang_ready_grace` after it was ready.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkd.core.judge import Context, Verdict, act, ago
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory, TokenMark
from sparkd.model.observed import ModelEndpoint

COUNTER = "vllm:generation_tokens_total"


@dataclass(frozen=True)
class Reading:
    running: float
    tokens: float


def reading(ctx: Context) -> Reading | None:
    """This look's requests running and token counter, when /metrics gave both."""
    return _reading(ctx.observed.endpoint)


def _reading(endpoint: ModelEndpoint | None) -> Reading | None:
    if endpoint is None or endpoint.status != "up":
        return None
    running, tokens = endpoint.requests_running, endpoint.generation_tokens_total
    if running is None or tokens is None:
        return None
    return Reading(running=running, tokens=tokens)


def track(ctx: Context) -> TokenMark | None:
    """The token mark after this look: kept as it was when the counter could not be read."""
    before = ctx.memory.token_mark
    serve = ctx.observed.serve
    pid = serve.pid if serve is not None and serve.running else None
    if before is not None and pid is not None and before.pid != pid:
        # Another serve process: nothing the old counter said is about this one.
        before = None
    seen = reading(ctx)
    if seen is None:
        return before
    running = seen.running > 0
    pid = pid if pid is not None else (before.pid if before is not None else None)
    fresh = TokenMark(pid=pid, tokens=seen.tokens, since=ctx.now, running=running)
    if before is None or seen.tokens != before.tokens or not running or not before.running:
        # First read, moved, went back (a restarted engine), idle, or requests just arrived:
        # the counter has stood still with requests running for no time yet.
        return fresh
    return before


def stall_start(ctx: Context, mark: TokenMark) -> float:
    return _stall_start(ctx.desired, ctx.memory, mark, ctx.now)


def _stall_start(desired: ClusterSpec, memory: Memory, mark: TokenMark, now: float) -> float:
    """When the stall clock started: the mark's look, or the end of the first-shape grace
    (from when sparkd first saw the model ready, daemon time; this look if not yet)."""
    ready = memory.model_ready_at
    grace_end = (ready if ready is not None else now) + desired.policy.hang_ready_grace
    return max(mark.since, grace_end)


def stands(
    desired: ClusterSpec, memory: Memory, endpoint: ModelEndpoint | None, now: float
) -> bool:
    """Whether this endpoint reading, with what memory holds, is a hang under load: a probe
    sent now would only time out (30 s at the defaults) before the restart it cannot avert."""
    mark, seen = memory.token_mark, _reading(endpoint)
    if mark is None or seen is None or not mark.running or seen.running <= 0:
        return False
    if seen.tokens != mark.tokens:
        return False
    return now - _stall_start(desired, memory, mark, now) >= desired.policy.hang_window


def deadline(ctx: Context, mark: TokenMark | None) -> float | None:
    """When a standing counter becomes a hang, for the horizon: None unless one is standing."""
    if mark is None or not mark.running:
        return None
    return stall_start(ctx, mark) + ctx.desired.policy.hang_window


def judge_hang(ctx: Context, mark: TokenMark | None) -> Verdict:
    verdict = Verdict()
    seen = reading(ctx)
    if mark is None or seen is None or not mark.running or mark.since >= ctx.now:
        return verdict
    window = ctx.desired.policy.hang_window
    still = ctx.now - stall_start(ctx, mark)
    if still < window:
        return verdict
    desired = ctx.desired
    why = (
        f"hung under load: {seen.running:g} request(s) running and {COUNTER} still at "
        f"{seen.tokens:g} for {ago(ctx.now - mark.since)} (hang_window {ago(window)})"
    )
    verdict.phase = "degraded"
    verdict.notes.append(why)
    verdict.actions.append(act("restart_model", desired.head.name, desired.model.id, why))
    return verdict

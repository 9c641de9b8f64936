"""Stage 5, the probe: only a real completion proves health.

A model that was ready is restarted only after `failure_threshold` consecutive counted
failures. `not_run` (the probe could not be sent) never counts. Two failures that a restart
would not change never count either, however long they last; each is reported as `degraded`
with its cause named (and exported: `sparkd_model_degraded{cause}`, alerted on):

- `overloaded`: the probe timed out while other requests ran or waited and tokens flowed beyond
  the probe's own (core.reading.classify.judge_timeout). The engine is generating: a restart would
  drop every request in flight and meet the same load again. Overload that lasts for hours stays
  degraded and alerted; it is no hang while tokens flow (a hang is core.judging.hang's, on the token
  counter standing still).
- `output_fault`: the turn ended (`stop`) with reasoning and no content (`no_answer`): the chat
  template or reasoning parser put the whole answer in `reasoning` (vLLM 0.32's qwen3 parser,
  not streaming, starts every turn in reasoning even after a template that closed the think
  block itself: vllm/parser/abstract_parser.py, `set_prompt_token_ids` is a no-op, line 215;
  0.34 starts in content then, vllm/parser/engine/parser_engine.py `set_prompt_token_ids`;
  tests/fixtures/vllm-parser). At `probe.temperature` 0 the answer
  is decoded greedily, so a restart returns the same turn. Above 0 one such turn is weaker
  evidence (the sampled model may have stopped inside its thought once): it is reported the
  same way, never counted (a restart cures neither cause), and the alert waits for it to last.
- `config_fault`: the server answered 4xx other than 408 or 429 (400 a bad request, 404 a
  model name it does not serve, 422 a body it refuses): the same request gets the same answer
  after a restart.
- `busy_or_hung_unknown`: the probe timed out and nothing tells a busy engine from a hung one
  (vLLM's /metrics unread, no token counter, or other requests with no token and no KV-cache
  gauge: `--disable-log-stats`). Absent evidence is unknown: never counted; after
  `failure_threshold` of them in a row the plan is `blocked` with what to check (not latched:
  an answer, or a timeout that can be told, ends it).
"""

from __future__ import annotations

from sparkd.core import policy
from sparkd.core.judging.judge import Context, Verdict, act
from sparkd.core.judging.load import Load


def judge_probe(ctx: Context, load: Load, serving: bool, link_down: list[str]) -> Verdict:
    desired = ctx.desired
    verdict = Verdict()
    memory = ctx.memory
    # Between probes (probe_interval > interval) the last probe of this launch still speaks.
    probe = ctx.observed.probe or memory.last_probe
    endpoint = ctx.observed.endpoint
    refused = endpoint is not None and endpoint.status == "http_error"
    state = "serving" if serving else "not answering (it was ready)"
    if refused and endpoint is not None:
        state = f"answering but refusing sparkd (http_error: {endpoint.detail})"
    launch = load.launch
    fresh = probe is not None and (launch is None or probe.at >= launch - 1.0)
    if probe is None or not fresh:
        if serving:
            verdict.phase = "probing"
            verdict.notes.append(f"model is {state}; waiting for a probe")
        elif refused:
            verdict.phase = "degraded"
            verdict.notes.append(f"model is {state}")
        else:
            detail = (
                (endpoint.detail or endpoint.status) if endpoint is not None else "not observed"
            )
            verdict.phase = "degraded"
            verdict.notes.append(f"model is {state}: {detail}")
        return verdict
    outcome = probe.verdict
    latency = f" in {probe.latency_seconds:.2f}s" if probe.latency_seconds is not None else ""
    threshold = desired.policy.failure_threshold
    if outcome.healthy:
        tokens = outcome.completion_tokens
        count = f", {tokens} completion tokens" if tokens is not None else ""
        verdict.notes.append(f"probe {outcome.outcome}{latency}{count}")
        slow = _slow(ctx, probe.latency_seconds)
        if slow is not None:
            # An answer is an answer: reported, never counted towards a restart.
            verdict.phase = "degraded"
            verdict.notes.append(slow)
        if link_down:
            # Serving now, but the next Ray hiccup on a dead link is an outage: not healthy.
            verdict.phase = "degraded"
            verdict.notes.extend(link_down)
        elif slow is None:
            verdict.phase = "healthy"
        return verdict
    verdict.phase = "degraded"
    if outcome.outcome == "not_run":
        verdict.notes.append(f"probe could not run ({outcome.detail}); not counted")
        return verdict
    if probe.busy:
        streak = policy.busy_streak_after(memory, probe)
        seen = f"; {outcome.detail}" if outcome.detail else ""
        verdict.notes.append(
            f"degraded: overloaded: probe timed out{latency} while other requests run and "
            f"tokens flow ({streak} such probe(s) in a row{seen}); not counted: a restart "
            "would drop the requests in flight and meet the same load"
        )
        return verdict
    if probe.output_fault:
        verdict.notes.append(_output_fault(ctx, outcome.detail))
        return verdict
    if probe.config_fault:
        verdict.notes.append(
            f"degraded: config fault: the server answered the probe HTTP {probe.http_status} "
            f"({outcome.detail}); not counted: a restart answers the same request the same way: "
            "check the probe's model name (model.served_name), its API key and the request "
            "against what the server serves"
        )
        return verdict
    if probe.unknown_load:
        streak = policy.unknown_streak_after(memory, probe)
        said = f"probe timed out{latency}; {outcome.detail}"
        if streak >= threshold:
            # The cap: waiting on would never end while the metrics stay unread.
            verdict.phase = "blocked"
            verdict.notes.append(
                f"{said}; {streak} such timeouts in a row and busy or hung cannot be told: not "
                "restarting on a timeout alone: check vLLM's /metrics on the head (started "
                "with --disable-log-stats?) and whether it generates for its clients; restart "
                "it by hand if it is hung"
            )
            return verdict
        verdict.notes.append(
            f"degraded: busy or hung unknown: {said}; not counted ({streak} of {threshold} "
            "before sparkd asks a human)"
        )
        return verdict
    failures = policy.failures_after(memory, probe)
    what = f"probe {outcome.outcome}" + (f": {outcome.detail}" if outcome.detail else "")
    if failures >= threshold:
        why = f"{failures} consecutive failed probes (last: {what})"
        verdict.notes.append(why)
        verdict.actions.append(act("restart_model", desired.head.name, desired.model.id, why))
        return verdict
    verdict.notes.append(f"{what}; failure {failures} of {threshold}")
    return verdict


def _output_fault(ctx: Context, detail: str) -> str:
    temperature = ctx.desired.probe.temperature
    if temperature == 0:
        how = "at temperature 0 a restart returns the same turn"
    else:
        how = (
            f"sampled at temperature {temperature:g}, one such turn may be chance; "
            "a restart cures neither"
        )
    return (
        f"degraded: output fault: probe no_answer: {detail}; {how}; not counted: check the "
        "chat template and --reasoning-parser"
    )


def _slow(ctx: Context, latency: float | None) -> str | None:
    spec = ctx.desired.probe
    limit = spec.slow_share * spec.timeout
    if latency is None or latency <= limit:
        return None
    return (
        f"degraded: slow: the probe took {latency:.2f}s, over {spec.slow_share:.0%} of its "
        f"{spec.timeout:g}s timeout; not counted as a failure"
    )

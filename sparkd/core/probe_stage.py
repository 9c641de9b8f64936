"""Stage 5, the probe: only a real completion proves health.

A model that was ready is restarted only after `failure_threshold` consecutive counted
failures. `not_run` (the probe could not be sent) never counts. A busy timeout (other requests
running or waiting, tokens flowing beyond the probe's own) does not count, until it has lasted
`failure_threshold` probes: busy forever is reported, then counted.
"""

from __future__ import annotations

from sparkd.core import policy
from sparkd.core.judge import Context, Verdict, act
from sparkd.core.load import Load


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
    streak = policy.busy_streak_after(memory, probe)
    if probe.busy and streak <= threshold:
        verdict.notes.append(
            f"busy: probe timed out{latency} while other requests run or tokens flow "
            f"({streak} busy probe(s) in a row, counted after {threshold}); not counted"
        )
        return verdict
    failures = policy.failures_after(memory, probe, threshold)
    what = f"probe {outcome.outcome}" + (f": {outcome.detail}" if outcome.detail else "")
    if probe.busy:
        what = f"busy for {streak} probes in a row, now counted (last: {what}{latency})"
    if failures >= threshold:
        why = f"{failures} consecutive failed probes (last: {what})"
        verdict.notes.append(why)
        verdict.actions.append(act("restart_model", desired.head.name, desired.model.id, why))
        return verdict
    verdict.notes.append(f"{what}; failure {failures} of {threshold}")
    return verdict


def _slow(ctx: Context, latency: float | None) -> str | None:
    spec = ctx.desired.probe
    limit = spec.slow_share * spec.timeout
    if latency is None or latency <= limit:
        return None
    return (
        f"degraded: slow: the probe took {latency:.2f}s, over {spec.slow_share:.0%} of its "
        f"{spec.timeout:g}s timeout; not counted as a failure"
    )

"""The verdict of one sanity completion."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from sparkd.model.base import Value
from sparkd.model.time import DaemonTime, Quantity

ProbeOutcome = Literal[
    "answer",
    "reasoning_only",
    "no_answer",
    "aborted",
    "empty",
    "malformed",
    "http_error",
    "garbled",
    "refused",
    "timeout",
    "not_run",
]
PROBE_OUTCOMES: tuple[ProbeOutcome, ...] = get_args(ProbeOutcome)
# `reasoning_only` is healthy only as a spent budget (the classifier checks it); `no_answer` is
# a turn that ended with reasoning and no content (a reasoning-parser or chat-template fault),
# `aborted` a turn the server cut short (finish_reason `abort`, or an error streamed mid-answer).
HEALTHY_OUTCOMES: frozenset[ProbeOutcome] = frozenset({"answer", "reasoning_only"})
# Not healthy, but not the engine's fault either: the text is there, in the wrong field.
OUTPUT_FAULTS: frozenset[ProbeOutcome] = frozenset({"no_answer"})
# Why a probe leaves the model `degraded` without counting toward a restart (a restart would not
# change it): the `cause` label of `sparkd_model_degraded`.
DegradedCause = Literal["overloaded", "output_fault", "config_fault", "busy_or_hung_unknown"]
DEGRADED_CAUSES: tuple[DegradedCause, ...] = get_args(DegradedCause)
# HTTP answers that are transient, not the request's fault: a server's request timeout and its
# rate limit. Every other 4xx (400 a bad request, 401/403 a refused key, 404 a model name the
# server does not serve, 422 a body it cannot take) is the same answer for the same request:
# the probe's configuration or the served spec, which a restart of the model reproduces.
TRANSIENT_4XX = frozenset({408, 429})


class ProbeVerdict(Value):
    """What the classifier concluded; `healthy` is None when the probe says nothing (not_run)."""

    outcome: ProbeOutcome = Field(
        description="`reasoning_only` (no content, the budget spent thinking: `finish_reason` "
        "`length` or `max_tokens` tokens) is healthy; `no_answer` (the turn ended with "
        "reasoning only) and `aborted` (`finish_reason` `abort`, or an error chunk streamed "
        "mid-answer) are not"
    )
    healthy: bool | None = Field(description="null for `not_run`: the probe says nothing")
    detail: str = Field("", description="what the classifier saw")
    completion_tokens: int | None = Field(None, description="the tokens the server reported")
    finish_reason: str | None = Field(None, description="the server's `finish_reason`")


class CheckResult(Value):
    """One acceptance check of a rollout (`rollout.checks[index]`): passed, failed, or None
    when it could not be sent (says nothing)."""

    index: int = Field(description="which check: `rollout.checks[index]`")
    ok: bool | None = Field(description="null: it could not be sent")
    detail: str = Field("", description="what the answer was, or why it failed")


class ProbeResult(Value):
    """One probe as observed: the verdict plus the measurements taken around it."""

    at: DaemonTime = Field(description="when it was sent")
    verdict: ProbeVerdict = Field(description="what the classifier concluded")
    latency_seconds: Quantity | None = Field(None, description="until the answer ended")
    ttft_seconds: Quantity | None = Field(None, description="until its first token")
    http_status: int | None = Field(None, description="the HTTP status of the completion")
    tokens_advanced: bool | None = Field(
        None,
        description="on a timeout, whether it met a busy server: other requests running or "
        "waiting while generation tokens flowed, or more tokens than the probe's own could "
        "account for (a hung engine holding stuck probes is not busy)",
    )

    @property
    def outcome(self) -> ProbeOutcome:
        return self.verdict.outcome

    @property
    def busy(self) -> bool:
        """Timed out on a server generating for others: overloaded, not broken."""
        return self.verdict.outcome == "timeout" and self.tokens_advanced is True

    @property
    def output_fault(self) -> bool:
        """The engine generated a whole turn that reached no `content`: a chat-template or
        reasoning-parser fault, which a restart of the same spec reproduces."""
        return self.verdict.outcome in OUTPUT_FAULTS

    @property
    def config_fault(self) -> bool:
        """The server answered the probe with a deterministic 4xx: the request (its model name,
        key, body) or the served spec is wrong, and a restart answers the same."""
        status = self.http_status
        return (
            self.verdict.outcome == "http_error"
            and status is not None
            and 400 <= status < 500
            and status not in TRANSIENT_4XX
        )

    @property
    def unknown_load(self) -> bool:
        """Timed out with nothing to tell a busy engine from a hung one (vLLM's /metrics
        unreadable, no token counter, or requests in the engine with no token and no KV-cache
        gauge): unknown, never counted as a failure."""
        return self.verdict.outcome == "timeout" and self.tokens_advanced is None

    @property
    def degraded_cause(self) -> DegradedCause | None:
        if self.busy:
            return "overloaded"
        if self.output_fault:
            return "output_fault"
        if self.config_fault:
            return "config_fault"
        if self.unknown_load:
            return "busy_or_hung_unknown"
        return None

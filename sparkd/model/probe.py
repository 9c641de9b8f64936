"""The verdict of one sanity completion."""

from __future__ import annotations

from typing import Literal, get_args

from sparkd.model.base import Value

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


class ProbeVerdict(Value):
    """What the classifier concluded; `healthy` is None when the probe says nothing (not_run)."""

    outcome: ProbeOutcome
    healthy: bool | None
    detail: str = ""
    completion_tokens: int | None = None
    finish_reason: str | None = None


class CheckResult(Value):
    """One acceptance check of a rollout (`rollout.checks[index]`): passed, failed, or None
    when it could not be sent (says nothing)."""

    index: int
    ok: bool | None
    detail: str = ""


class ProbeResult(Value):
    """One probe as observed: the verdict plus the measurements taken around it."""

    at: float
    verdict: ProbeVerdict
    latency_seconds: float | None = None
    ttft_seconds: float | None = None
    http_status: int | None = None
    # On a timeout, whether vLLM did other work while the probe waited (other requests running
    # or waiting while tokens flowed, or more tokens than the probe's max_tokens): busy, not hung.
    tokens_advanced: bool | None = None

    @property
    def outcome(self) -> ProbeOutcome:
        return self.verdict.outcome

    @property
    def busy(self) -> bool:
        return self.verdict.outcome == "timeout" and self.tokens_advanced is True

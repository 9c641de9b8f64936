"""A rollout's acceptance checks, judged from the completion's response. Pure.

Reasoning-aware as the probe is (core.reading.classify): the completion must be healthy (an answer,
or reasoning that spent the budget); `contains` and `regex` are judged on the answer when there is
content, `min_completion_tokens` on the usage the server reports.

A `regex` runs on RE2, linear in the answer (sparkd.model.linear_regex): these checks run on the
event loop, on what a model wrote.
"""

from __future__ import annotations

import json

from sparkd.core.reading.classify import classify_response
from sparkd.model.cluster import RolloutCheck
from sparkd.model.linear_regex import compile_regex
from sparkd.model.probe import CheckResult


def judge_check(index: int, check: RolloutCheck, status: int, body: bytes | str) -> CheckResult:
    verdict = classify_response(status, body, check.max_tokens)
    if verdict.healthy is not True:
        detail = f"{verdict.outcome}" + (f": {verdict.detail}" if verdict.detail else "")
        return CheckResult(index=index, ok=False, detail=detail)
    content = _content(body)
    if content:
        if check.contains is not None and check.contains not in content:
            return CheckResult(index=index, ok=False, detail=f"answer lacks {check.contains!r}")
        if check.regex is not None and compile_regex(check.regex).search(content) is None:
            return CheckResult(
                index=index, ok=False, detail=f"answer does not match {check.regex!r}"
            )
    tokens = verdict.completion_tokens
    wanted = check.min_completion_tokens
    if wanted is not None and (tokens is None or tokens < wanted):
        return CheckResult(
            index=index, ok=False, detail=f"{tokens} completion tokens, fewer than {wanted}"
        )
    return CheckResult(index=index, ok=True, detail=verdict.outcome)


# What a check's regex is matched against, at most: the body is already bounded where it is read
# (shell.model_http.MAX_BODY, 1 MiB); this keeps the bound here too, with RE2 linear in it.
ANSWER_LIMIT = 1 << 20


def _content(body: bytes | str) -> str:
    try:
        document = json.loads(body)
        content = document["choices"][0]["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""
    return content.strip()[:ANSWER_LIMIT] if isinstance(content, str) else ""


def failed(checks: tuple[CheckResult, ...] | None) -> str | None:
    """Why the acceptance checks failed, or None."""
    for result in checks or ():
        if result.ok is False:
            return f"acceptance check {result.index + 1} failed: {result.detail}"
    return None


def passed(checks: tuple[CheckResult, ...] | None, count: int) -> bool:
    return checks is not None and len(checks) == count and all(c.ok is True for c in checks)

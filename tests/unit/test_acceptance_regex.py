"""A rollout's acceptance check with a backtracking-prone regex, on an answer a model may give:
judged on RE2 (linear in the answer), never left to Python's backtracking on the event loop."""

from __future__ import annotations

import json
import multiprocessing
import random
from multiprocessing.connection import Connection

import pytest
from pydantic import ValidationError

from sparkd.core.judging.acceptance import ANSWER_LIMIT, judge_check
from sparkd.model.cluster import RolloutCheck
from sparkd.model.probe import CheckResult

# Nested quantifiers over the same characters: Python's `re` tries every way to split the
# words between the groups before it can say no (53.7 s for one answer in the attack).
CATASTROPHIC = r"^(\w+,?\s?)*\.$"


WORDS = [
    "river",
    "stone",
    "cloud",
    "paper",
    "orange",
    "window",
    "garden",
    "silver",
    "thunder",
    "meadow",
    "lantern",
    "harbor",
]


def prose(count: int, seed: int = 0) -> str:
    """`count` words as a model writes them: varied, so the probe's garbling check passes it."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + ("," if rng.random() < 0.2 else "") for _ in range(count))


def completion(content: str) -> str:
    """A chat completion as vLLM answers it (tests/fixtures/vllm-real/chat-*.json's shape)."""
    return json.dumps(
        {
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content},
                 "finish_reason": "length"}
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 50, "total_tokens": 59},
        }
    )  # fmt: skip


def _judge(check: RolloutCheck, body: str, answer: Connection) -> None:
    answer.send(judge_check(0, check, 200, body))


def judged_within(seconds: float, check: RolloutCheck, body: str) -> CheckResult:
    """The verdict, or a failure when none came in `seconds`. In a child process: Python's `re`
    holds the GIL for a whole match, so a runaway one would hold a thread's caller too."""
    ours, theirs = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_judge, args=(check, body, theirs))
    child.start()
    try:
        if not ours.poll(seconds):
            pytest.fail(f"no verdict in {seconds} s: the match runs away")
        verdict: CheckResult = ours.recv()
        return verdict
    finally:
        child.kill()
        child.join()


def test_a_catastrophic_pattern_on_a_hostile_answer_is_judged_at_once() -> None:
    check = RolloutCheck(prompt="List some words.", regex=CATASTROPHIC)
    # Words without the final period: every split is tried before the `\.$` fails.
    answer = prose(40)
    verdict = judged_within(20, check, completion(answer))
    assert verdict.ok is False and "does not match" in verdict.detail
    # The same pattern still judges an answer that ends as it asks.
    assert judged_within(20, check, completion("one, two three.")).ok is True


def test_the_longest_answer_is_judged_as_cut_at_the_limit() -> None:
    check = RolloutCheck(prompt="p", regex=r"end\.$")
    answer = prose(ANSWER_LIMIT // 5) + " the end."
    assert len(answer) > ANSWER_LIMIT
    verdict = judged_within(20, check, completion(answer))
    assert verdict.ok is False and "does not match" in verdict.detail
    assert judged_within(20, check, completion(prose(20) + " the end.")).ok is True


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)a", r"(?<!a)b"])
def test_a_pattern_re2_cannot_run_is_refused_with_the_config(pattern: str) -> None:
    with pytest.raises(ValidationError, match="RE2"):
        RolloutCheck(prompt="p", regex=pattern)

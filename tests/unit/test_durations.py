"""How a plan's reason says a length of time: one already run is `ago`'s, one still ahead
`from_now`'s, and the reasons that wait on the future say it as the future."""

from __future__ import annotations

import pytest

from sparkd.core.deciding.planner import plan
from sparkd.core.judging.judge import ago, from_now
from sparkd.model.memory import Attempt, Memory, Pause
from tests.toy import Toy
from tests.unit.test_planner import healthy

MODEL_KEY = "restart_model:spark-a:/models/Qwen3.5-122B-A10B-FP8"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.5, "0.50s"), (42, "42s"), (65, "1m05s"), (3 * 3600 + 120, "3h02m"), (-5, "0.00s")],
)
def test_a_length_of_time_reads_the_same_past_or_ahead(seconds: float, text: str) -> None:
    assert ago(seconds) == text
    assert from_now(seconds) == f"{text} from now"


def test_a_pause_with_an_end_says_when_it_ends() -> None:
    toy = Toy.seed_morning()
    memory = Memory(paused=Pause(reason="swap", by="ops", since=toy.now, until=toy.now + 100))
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert result.phase == "paused"
    assert "until 1m40s from now" in result.reason


def test_a_backoff_says_when_it_ends() -> None:
    toy, memory = healthy()
    toy.probe_style = "http_error"
    memory = memory.evolve(
        consecutive_failures=2, attempts=(Attempt(key=MODEL_KEY, at=toy.now - 10, ok=True),)
    )
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    backoff = toy.cluster.policy.backoff_initial - 10
    assert f"backing off restart_model {toy.cluster.model.id} on spark-a until " in result.reason
    assert f"until {ago(backoff)} from now" in result.reason

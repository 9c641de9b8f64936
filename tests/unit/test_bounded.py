"""Reasons built from host text are bounded: a host listing many foreign GPU processes with long
names yields one short note per host, and no reason, action reason or detail is unbounded."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.reading import parsers
from sparkd.model.base import MAX_REASON
from sparkd.model.plan import Action, ActionOutcome
from tests.support.planning import healthy


def smi(count: int, name_length: int) -> str:
    """`nvidia-smi --query-compute-apps=pid,process_name,used_memory` as a host would print."""
    return "\n".join(f"{1000 + i}, /opt/{'x' * name_length}{i}, 64" for i in range(count))


def test_fifteen_hundred_foreign_processes_make_one_bounded_note() -> None:
    toy, memory = healthy()
    toy.gpu["spark-a"] = list(parsers.parse_compute_apps(smi(1500, 4000)))
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert result.phase == "blocked"
    assert len(result.reason) <= MAX_REASON
    assert "foreign GPU processes pid 1000 " in result.reason
    assert "and 1495 more on spark-a" in result.reason, result.reason
    assert len(json.dumps(result.public())) < 2 * MAX_REASON


@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, 300), length=st.integers(0, 5000), kill=st.booleans())
def test_every_reason_is_bounded(count: int, length: int, kill: bool) -> None:
    toy, memory = healthy()
    toy.gpu["spark-a"] = list(parsers.parse_compute_apps(smi(count, length)))
    toy.gpu["spark-b"] = list(parsers.parse_compute_apps(smi(count, length)))
    if kill:
        policy = toy.cluster.policy.model_copy(update={"allow_kill_foreign_gpu": True})
        toy.cluster = toy.cluster.model_copy(update={"policy": policy})
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert len(result.reason) <= MAX_REASON
    assert all(len(a.reason) <= MAX_REASON for a in result.actions + result.withheld)


def test_an_action_detail_is_bounded() -> None:
    action = Action(kind="stop_unit", host="h", target="u", reason="r" * 10_000)
    outcome = ActionOutcome(
        action=action, result="failed", started_at=0, finished_at=1, detail="d" * 10_000
    )
    assert len(outcome.detail) <= MAX_REASON and len(outcome.action.reason) <= MAX_REASON

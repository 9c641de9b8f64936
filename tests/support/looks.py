"""A served model looked at again and again by the pure planner: one look is `plan` then
`remember`, as the controller does; `walk` takes looks a fixed interval apart."""

from __future__ import annotations

from sparkd.core.deciding.planner import plan
from sparkd.core.remembering.remember import remember
from sparkd.model.memory import Memory
from sparkd.model.plan import Plan
from tests.support.planning import served as served_memory
from tests.toy import Toy

INTERVAL = 30.0


def served() -> tuple[Toy, Memory]:
    """A model that has served for a while: past its first-shape grace."""
    toy = Toy.healthy()
    return toy, served_memory(toy, ready_for=600, probed_ago=10)


def look(toy: Toy, memory: Memory) -> tuple[Plan, Memory]:
    seen = toy.observe()
    result = plan(toy.cluster, seen, memory, toy.now)
    return result, remember(memory, seen, [], toy.now, result)


def walk(toy: Toy, memory: Memory, looks: int, every: float = INTERVAL) -> list[Plan]:
    """`looks` looks, `every` seconds apart; stops at the first plan with actions."""
    plans: list[Plan] = []
    for _ in range(looks):
        result, memory = look(toy, memory)
        plans.append(result)
        if result.actions:
            break
        toy.advance(every)
    return plans


def restarts(plans: list[Plan]) -> list[Plan]:
    return [p for p in plans if any(a.kind == "restart_model" for a in p.actions)]

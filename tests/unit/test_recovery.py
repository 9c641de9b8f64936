"""Whole recoveries as sequences of snapshots: apply each plan's effects until healthy."""

from __future__ import annotations

from collections.abc import Callable

from sparkd.core.deciding.planner import plan
from sparkd.core.remembering.remember import remember
from sparkd.model.memory import Memory
from sparkd.model.plan import Action, ActionOutcome, Plan
from tests.toy import Toy

MAX_STEPS = 40
STEP_SECONDS = 30.0


def drive(toy: Toy, memory: Memory) -> tuple[list[Plan], Memory]:
    """Run the loop the daemon runs, with the toy as the cluster, until converged."""
    plans: list[Plan] = []
    for _ in range(MAX_STEPS):
        observed = toy.observe()
        result = plan(toy.cluster, observed, memory, toy.now)
        plans.append(result)
        outcomes = []
        for action in result.actions:
            toy.apply(action)
            outcomes.append(
                ActionOutcome(action=action, result="ok", started_at=toy.now, finished_at=toy.now)
            )
        memory = remember(memory, toy.observe(), outcomes, toy.now, result)
        if result.converged:
            return plans, memory
        toy.advance(STEP_SECONDS)
    raise AssertionError(f"not converged in {MAX_STEPS} steps: {plans[-1].reason}")


def kinds(plans: list[Plan]) -> list[str]:
    return [a.kind for p in plans for a in p.actions]


def converge_from_healthy(disrupt: Callable[[Toy], None]) -> tuple[list[Plan], Memory]:
    toy = Toy.seed_morning()
    _, memory = drive(toy, Memory())
    toy.advance(STEP_SECONDS)
    disrupt(toy)
    return drive(toy, memory)


def test_seed_morning_recovers_in_the_operators_order() -> None:
    plans, memory = drive(Toy.seed_morning(), Memory())
    assert kinds(plans) == ["stop_unit"] * 4 + ["remove_container"] * 2 + [
        "start_ray_head",
        "start_ray_worker",
        "start_model",
    ]
    phases = [p.phase for p in plans]
    assert phases[0] == "cleaning"
    assert phases[1] == "starting_model"
    assert "loading" in phases
    assert phases[-1] == "healthy"
    assert plans[-1].reason.startswith("probe reasoning_only")
    assert memory.model_ready_at is not None
    assert len(plans) <= 40


def test_worker_reboot_recovers() -> None:
    plans, _ = converge_from_healthy(lambda toy: toy.reboot("spark-b"))
    assert kinds(plans) == ["remove_container", "start_ray_worker", "restart_model"] or kinds(
        plans
    ) == ["remove_container", "start_ray_worker", "start_model"]
    assert all(a.host in ("spark-a", "spark-b") for p in plans for a in p.actions)


def test_head_reboot_recovers() -> None:
    plans, _ = converge_from_healthy(lambda toy: toy.reboot("spark-a"))
    assert kinds(plans) == ["remove_container", "start_ray_head", "restart_ray", "start_model"]


def test_model_crash_recovers() -> None:
    def crash(toy: Toy) -> None:
        toy.serve_running = False
        toy.ready = False

    plans, _ = converge_from_healthy(crash)
    assert kinds(plans) == ["start_model"]
    assert "vllm serve exited" in plans[0].reason


def test_unreachable_worker_then_back() -> None:
    toy = Toy.seed_morning()
    _, memory = drive(toy, Memory())
    toy.unreachable("spark-b")
    result = plan(toy.cluster, toy.observe(), memory, toy.now + 30)
    assert (result.phase, result.actions) == ("unreachable", ())
    del toy.errors["spark-b"]
    toy.reboot("spark-b")
    plans, _ = drive(toy, memory)
    assert "start_ray_worker" in kinds(plans)


def test_repeated_probe_failure_restarts_once_then_blocks() -> None:
    toy = Toy.seed_morning()
    _, memory = drive(toy, Memory())
    toy.probe_style = "http_error"
    restarts = 0
    blocked = None
    for _ in range(200):
        toy.advance(60)
        toy.probe_at = toy.now
        result = plan(toy.cluster, toy.observe(), memory, toy.now)
        outcomes = []
        for action in result.actions:
            assert action.kind == "restart_model"
            restarts += 1
            toy.apply(action)
            outcomes.append(
                ActionOutcome(action=action, result="ok", started_at=toy.now, finished_at=toy.now)
            )
        memory = remember(memory, toy.observe(), outcomes, toy.now, result)
        if result.phase == "blocked":
            blocked = result
            break
    assert blocked is not None
    assert restarts == toy.cluster.policy.budget
    assert memory.blocked is not None
    after = plan(toy.cluster, toy.observe(), memory, toy.now + 10_000)
    assert after.phase == "blocked" and after.actions == ()


def test_outcome_record_counts_against_budget() -> None:
    toy = Toy.healthy()
    action = Action(kind="restart_model", host="spark-a", target="m", reason="r")
    outcome = ActionOutcome(action=action, result="failed", started_at=5.0, finished_at=6.0)
    memory = remember(Memory(), toy.observe(), [outcome], 6.0)
    assert [(a.key, a.ok) for a in memory.attempts] == [("restart_model:spark-a:m", False)]

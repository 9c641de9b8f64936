"""The plan's horizon: the earliest moment its decision can change with nothing observed
changing. One named case per thing a plan can wait on, each through `plan()` itself."""

from __future__ import annotations

from pathlib import Path

from sparkd.core.deciding.planner import plan
from sparkd.model.memory import Attempt, Blocked, Memory, Pause
from tests.support.planning import healthy, loading, short_of_gpus_unnamed
from tests.toy import Toy

MODEL_KEY = "restart_model:spark-a:/models/Qwen3.5-122B-A10B-FP8"


def test_a_backoff_ends_at_its_horizon() -> None:
    toy, memory = healthy()
    toy.probe_style = "http_error"
    memory = memory.model_copy(
        update={
            "consecutive_failures": 2,
            "attempts": (Attempt(key=MODEL_KEY, at=toy.now - 10, ok=True),),
        }
    )
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert "backing off restart_model" in result.reason
    assert result.recheck_at == toy.now - 10 + toy.cluster.policy.backoff_initial


def test_a_pause_with_an_end_ends_at_its_horizon() -> None:
    toy = Toy.seed_morning()
    memory = Memory(paused=Pause(reason="swap", by="ops", since=toy.now, until=toy.now + 100))
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert result.phase == "paused"
    assert result.recheck_at == toy.now + 100


def test_a_load_is_looked_at_when_its_stall_limit_runs_out() -> None:
    toy, memory = loading(progress_age=30, elapsed=360)()
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert result.phase == "loading"
    assert result.actions == ()
    # The stall limit comes long before the load timeout.
    assert result.recheck_at == toy.now - 30 + toy.cluster.model.load_stall


def test_a_passed_deadline_is_no_horizon() -> None:
    toy, memory = loading(progress_age=601, elapsed=900)()
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert [a.kind for a in result.actions] == ["restart_model"]
    assert result.recheck_at is None or result.recheck_at > toy.now


def test_ray_short_of_gpus_is_looked_at_when_the_join_timeout_runs_out() -> None:
    toy, memory = healthy()
    memory = memory.model_copy(update={"ray_unsettled_since": toy.now - 20})
    seen = short_of_gpus_unnamed(toy, memory)
    result = plan(toy.cluster, seen, memory, toy.now)
    assert "waiting" in result.reason
    assert result.recheck_at == toy.now - 20 + toy.cluster.ray.join_timeout


def test_a_due_probe_is_a_horizon_of_a_healthy_cluster() -> None:
    toy, memory = healthy()
    memory = memory.model_copy(update={"last_probe_at": toy.now - 10})
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert result.phase == "healthy"
    assert result.recheck_at == toy.now - 10 + toy.cluster.probe_interval


def test_a_latched_cluster_waits_on_nobody_but_an_operator() -> None:
    toy = Toy.seed_morning()
    memory = Memory(blocked=Blocked(reason="budget spent", since=toy.now - 5))
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert result.phase == "blocked"
    assert result.recheck_at is None


def test_a_deadline_that_passed_during_the_cycle_is_looked_at_now(tmp_path: Path) -> None:
    """A look held up past its plan's deadline (a probe's 30 s timeout) looks again at once,
    not a whole interval later: a hang under load due meanwhile is found then."""

    from sparkd.model.plan import Plan

    toy = Toy.healthy()
    clock = [1000.0]
    controller = toy.controller(tmp_path, clock)
    now = controller.clock.now()
    controller.view.plan = Plan(
        cluster=toy.cluster.name, phase="degraded", reason="r", recheck_at=now + 10.0
    )
    assert 10.0 <= controller.next_delay() < 10.1
    clock[0] += 40.0  # the cycle that made the plan took 40 s
    assert controller.next_delay() < 0.1

"""Universal rules of the planner, checked on generated clusters."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.core import policy
from sparkd.core.deciding.planner import plan
from sparkd.model.memory import Attempt, Blocked, Memory, Pause
from sparkd.model.plan import Action
from sparkd.model.probe import PROBE_OUTCOMES
from tests.toy import Toy


@st.composite
def situations(draw: st.DrawFn) -> tuple[Toy, Memory, float]:
    """A cluster somewhere along its life, with a memory and a moment to plan at."""
    toy = Toy.seed_morning() if draw(st.booleans()) else Toy.healthy()
    for host in ("spark-a", "spark-b"):
        if draw(st.integers(0, 9)) == 0:
            toy.unreachable(host, draw(st.sampled_from(["unreachable", "timeout", "auth"])))
    if draw(st.booleans()) and not toy.errors:
        kind = draw(st.sampled_from(["restart_model", "start_ray_worker"]))
        host = "spark-a" if kind == "restart_model" else "spark-b"
        toy.apply(Action(kind=kind, host=host, target="t", reason="r"))  # type: ignore[arg-type]
        toy.advance(draw(st.floats(0, 4000)))
    toy.probe_style = draw(st.sampled_from(PROBE_OUTCOMES))
    toy.probe_busy = draw(st.booleans())
    keys = [
        "restart_model:spark-a:/models/Qwen3.5-122B-A10B-FP8",
        "start_ray_worker:spark-b:sparkd-sparks-ray-worker",
        "stop_unit:spark-a:vllm-cluster.service",
    ]
    attempts = tuple(
        Attempt(key=draw(st.sampled_from(keys)), at=toy.now - draw(st.floats(0, 7200)), ok=True)
        for _ in range(draw(st.integers(0, 6)))
    )
    memory = Memory(
        attempts=tuple(sorted(attempts, key=lambda a: a.at)),
        consecutive_failures=draw(st.integers(0, 5)),
        launched_at=toy.serve_started,
    )
    return toy, memory, toy.now + draw(st.floats(0, 120))


COMMON = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(situations())
def test_deterministic(s: tuple[Toy, Memory, float]) -> None:
    toy, memory, now = s
    observed = toy.observe()
    assert plan(toy.cluster, observed, memory, now) == plan(toy.cluster, observed, memory, now)


@COMMON
@given(situations())
def test_every_plan_explains_itself(s: tuple[Toy, Memory, float]) -> None:
    toy, memory, now = s
    result = plan(toy.cluster, toy.observe(), memory, now)
    assert result.reason
    assert all(a.reason for a in result.actions)


@COMMON
@given(situations())
def test_converged_plans_nothing(s: tuple[Toy, Memory, float]) -> None:
    toy, memory, now = s
    result = plan(toy.cluster, toy.observe(), memory, now)
    if result.phase == "healthy":
        assert result.actions == ()


@COMMON
@given(situations())
def test_no_budget_exceeded(s: tuple[Toy, Memory, float]) -> None:
    toy, memory, now = s
    result = plan(toy.cluster, toy.observe(), memory, now)
    for action in result.actions:
        assert (
            policy.budget_used(memory, action.key, toy.cluster.policy, now)
            < toy.cluster.policy.budget
        )


@COMMON
@given(situations(), st.sampled_from(["paused", "dry_run", "blocked"]))
def test_paused_dry_run_blocked_emit_nothing(s: tuple[Toy, Memory, float], how: str) -> None:
    toy, memory, now = s
    if how == "paused":
        memory = memory.model_copy(update={"paused": Pause(reason="r", by="me", since=now)})
    if how == "blocked":
        memory = memory.model_copy(update={"blocked": Blocked(reason="r", since=now)})
    result = plan(toy.cluster, toy.observe(), memory, now, dry_run=how == "dry_run")
    assert result.actions == ()


@COMMON
@given(situations())
def test_not_run_never_restarts(s: tuple[Toy, Memory, float]) -> None:
    toy, memory, now = s
    toy.probe_style = "not_run"
    before = plan(toy.cluster, toy.observe(), memory, now)
    toy.probe_style = "reasoning_only"
    healthy = plan(toy.cluster, toy.observe(), memory, now)
    restarts = [a for a in before.actions if a.kind == "restart_model"]
    assert restarts == [a for a in healthy.actions if a.kind == "restart_model"]


@COMMON
@given(st.floats(0, 3599), st.floats(0, 599), st.floats(0, 100))
def test_progressing_load_is_never_restarted_before_load_timeout(
    elapsed: float, since_progress: float, offset: float
) -> None:
    toy = Toy.healthy()
    toy.apply(Action(kind="restart_model", host="spark-a", target="m", reason="r"))
    toy.load_seconds = 100_000
    toy.advance(elapsed)
    toy.progress_at = toy.now - min(since_progress, elapsed)
    result = plan(toy.cluster, toy.observe(), Memory(launched_at=toy.serve_started), toy.now)
    assert result.phase == "loading", result.reason
    assert result.actions == ()

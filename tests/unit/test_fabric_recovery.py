"""Fabric wedge recovery (core.judging.fabric.judge_recovery): once the fabric is sound after a
hold, what hung over it is restarted, both ranks, as an explicit decision."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.remembering.remember import remember
from sparkd.model.memory import Memory
from sparkd.model.observed import HostError, Observed
from sparkd.model.plan import ActionOutcome, Plan
from tests.examples import EXAMPLE_SET
from tests.support.planning import COMMON, SOUND, host
from tests.toy import Toy

RECOVERY = "fabric sound again after a hold of"


def looked(toy: Toy, mtu_b: int = 9000) -> Observed:
    seen = host(toy.observe(), "spark-a", fabric=SOUND)
    return host(seen, "spark-b", fabric=SOUND.model_copy(update={"mtu": mtu_b}))


def step(toy: Toy, memory: Memory, seen: Observed) -> tuple[Memory, Plan]:
    result = plan(toy.cluster, seen, memory, toy.now)
    return remember(memory, seen, (), toy.now, result), result


def held(example: str) -> tuple[Toy, Memory]:
    """The model serving, then an MTU mismatch holding every (re)start for two minutes."""
    toy, memory = next(e for e in EXAMPLE_SET if e.name == example).build()
    memory, _ = step(toy, memory, looked(toy))
    for _ in range(4):
        toy.advance(30)
        memory, result = step(toy, memory, looked(toy, mtu_b=1500))
        assert result.learned.fabric_held and "restart_model" not in {
            a.kind for a in result.actions
        }
    assert memory.fabric_held_since is not None
    return toy, memory


def restarts(result: Plan) -> list[tuple[str, str]]:
    return [(a.kind, a.host) for a in result.actions]


def test_once_the_fabric_is_sound_a_model_that_hung_over_it_restarts_both_ranks() -> None:
    toy, memory = held("three-failed-probes")
    toy.advance(30)
    result = plan(toy.cluster, looked(toy), memory, toy.now)
    assert restarts(result) == [("restart_ray", "spark-a"), ("restart_ray", "spark-b")]
    assert result.phase == "starting_ray"
    assert (
        "fabric sound again after a hold of 2m00s, and the model launched before it does not "
        "answer (probe http_error): restarting both ranks' Ray containers"
    ) in result.reason
    # Ray restarted, the hold is over; the model is relaunched on the new Ray.
    outcomes = [
        ActionOutcome(action=a, result="ok", started_at=toy.now, finished_at=toy.now + 5)
        for a in result.actions
    ]
    after = remember(memory, looked(toy), outcomes, toy.now + 5, result)
    assert after.fabric_held_since is None


def test_not_on_a_probe_that_failed_during_the_hold() -> None:
    # The failed probe was taken over the faulty fabric; none has been taken since it healed.
    toy, memory = held("healthy-reasoning-only")
    toy.probe_style = "timeout"
    toy.advance(30)
    memory, _ = step(toy, memory, looked(toy, mtu_b=1500))
    assert memory.last_probe is not None and memory.last_probe.outcome == "timeout"
    toy.advance(30)
    healed = looked(toy).model_copy(update={"probe": None})
    memory, result = step(toy, memory, healed)
    assert RECOVERY not in result.reason and result.actions == ()
    toy.advance(10)
    result = plan(toy.cluster, looked(toy).model_copy(update={"probe": None}), memory, toy.now)
    assert RECOVERY not in result.reason and result.actions == ()
    # The first probe over the sound fabric fails too: what hung over it is restarted, in the
    # cycle it fails or, that one held back (a host's look failed), a later one without a probe.
    toy.advance(20)
    result = plan(toy.cluster, looked(toy), memory, toy.now)
    assert restarts(result) == [("restart_ray", "spark-a"), ("restart_ray", "spark-b")]
    gone = host(looked(toy), "spark-b", error=HostError(kind="timeout", detail="no answer"))
    memory, result = step(toy, memory, gone)
    assert RECOVERY not in result.reason
    toy.advance(10)
    result = plan(toy.cluster, looked(toy).model_copy(update={"probe": None}), memory, toy.now)
    assert restarts(result) == [("restart_ray", "spark-a"), ("restart_ray", "spark-b")]


def test_the_failures_counted_during_the_hold_restart_no_single_rank_once_it_is_sound() -> None:
    toy, memory = held("three-failed-probes")
    toy.advance(30)
    # No probe in the first sound look: the hold's failures wait for one over the healed fabric.
    healed = looked(toy).model_copy(update={"probe": None})
    memory, result = step(toy, memory, healed)
    assert result.actions == () and RECOVERY not in result.reason
    assert "waiting for a probe over it to tell whether the model hung" in result.reason
    # No probe comes at all (two probe intervals): the probe stage acts as without a hold.
    toy.advance(2 * toy.cluster.probe_interval)
    late = plan(toy.cluster, looked(toy).model_copy(update={"probe": None}), memory, toy.now)
    assert restarts(late) == [("restart_model", "spark-a")]


def test_a_counter_still_standing_under_load_over_the_sound_fabric_restarts_both_ranks() -> None:
    toy, memory = held("healthy-reasoning-only")
    toy.hung_under_load, toy.probe_style = True, "timeout"
    for _ in range(3):
        toy.advance(30)
        memory, _ = step(toy, memory, looked(toy, mtu_b=1500))
    toy.advance(30)
    # No probe goes to an engine whose counter stands (runtime.controller): this look says it.
    result = plan(toy.cluster, looked(toy).model_copy(update={"probe": None}), memory, toy.now)
    assert restarts(result) == [("restart_ray", "spark-a"), ("restart_ray", "spark-b")]
    assert "does not answer (hung under load)" in result.reason


def test_not_while_the_fabric_is_still_faulty() -> None:
    toy, memory = held("three-failed-probes")
    toy.advance(30)
    result = plan(toy.cluster, looked(toy, mtu_b=1500), memory, toy.now)
    assert RECOVERY not in result.reason and result.actions == ()


def test_not_for_a_model_that_answers_once_the_fabric_is_sound() -> None:
    toy, memory = held("healthy-reasoning-only")
    toy.advance(30)
    memory, result = step(toy, memory, looked(toy))
    assert RECOVERY not in result.reason and result.actions == ()
    toy.advance(600)
    memory, _ = step(toy, memory, looked(toy))
    assert memory.fabric_held_since is None


def test_not_for_a_model_launched_after_the_hold_began() -> None:
    toy, memory = held("three-failed-probes")
    toy.advance(30)
    relaunched = memory.evolve(launched_at=toy.now - 10)
    toy.serve_started = toy.now - 10
    result = plan(toy.cluster, looked(toy), relaunched, toy.now)
    assert RECOVERY not in result.reason


def test_without_a_hold_a_failing_model_is_the_probe_stage_s_as_before() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "three-failed-probes").build()
    result = plan(toy.cluster, looked(toy), memory, toy.now)
    assert restarts(result) == [("restart_model", "spark-a")]


@COMMON
@given(
    st.sampled_from(["three-failed-probes", "healthy-reasoning-only", "busy", "load-stalled"]),
    st.lists(st.sampled_from([9000, 1500]), min_size=1, max_size=8),
)
def test_the_recovery_only_after_a_hold_on_a_sound_fabric_and_never_with_a_model_start(
    example: str, mtus: list[int]
) -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == example).build()
    for mtu in mtus:
        toy.advance(30)
        seen = looked(toy, mtu_b=mtu)
        result = plan(toy.cluster, seen, memory, toy.now)
        if RECOVERY in result.reason:
            assert mtu == 9000 and memory.fabric_held_since is not None
            assert sorted(restarts(result)) == [
                ("restart_ray", "spark-a"),
                ("restart_ray", "spark-b"),
            ]
        if mtu == 1500:
            assert not {a.kind for a in result.actions} & {
                "restart_ray",
                "start_model",
                "restart_model",
            }
        memory = remember(memory, seen, (), toy.now, result)

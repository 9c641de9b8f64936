"""A hung engine under load: requests running and vLLM's token counter standing still across
looks spanning `policy.hang_window` restart the model without waiting for three probes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.judging.hang import stands
from sparkd.core.remembering.remember import remember
from sparkd.model.memory import Attempt
from sparkd.model.observed import ModelEndpoint, Observed
from sparkd.model.plan import Plan
from tests.support.looks import INTERVAL, look, restarts, served, walk
from tests.toy import Toy


def test_hang_under_load_restarts_the_model_within_the_window() -> None:
    toy, memory = served()
    toy.probe_busy = True  # serving traffic, tokens moving
    _, memory = look(toy, memory)
    toy.advance(INTERVAL)
    toy.hung_under_load = True  # the engine hangs: requests stay running, the counter stops
    plans = walk(toy, memory, looks=10)
    hit = restarts(plans)
    assert len(hit) == 1
    reason = hit[0].actions[0].reason
    assert reason.startswith("hung under load: 1 request(s) running")
    assert "vllm:generation_tokens_total still at" in reason and "hang_window 1m00s" in reason
    # The first look after the hang still sees the tokens made before it; the window counts
    # from that look: two intervals at the defaults, not three probe timeouts.
    assert len(plans) == 3


def test_busy_with_tokens_moving_is_never_a_hang() -> None:
    toy, memory = served()
    toy.probe_busy = True
    plans = walk(toy, memory, looks=20)
    assert not restarts(plans)
    assert all("hung under load" not in p.reason for p in plans)


def test_a_still_counter_with_no_requests_is_idle_not_hung() -> None:
    toy, memory = served()
    plans = walk(toy, memory, looks=20)
    assert not restarts(plans)


def test_idle_then_a_request_starts_the_window_at_the_request() -> None:
    toy, memory = served()
    plans = walk(toy, memory, looks=10)  # idle for five minutes, the counter still
    assert not restarts(plans)
    toy.hung_under_load = True  # a request arrives and the counter does not move
    result, memory = look(toy, memory)
    assert not result.actions, result.reason  # still for no time yet, whatever came before
    toy.advance(INTERVAL)
    result, memory = look(toy, memory)
    assert not result.actions, result.reason
    toy.advance(INTERVAL)
    result, memory = look(toy, memory)
    assert [a.kind for a in result.actions] == ["restart_model"]


def test_a_just_ready_engine_compiling_its_first_shapes_is_not_hung() -> None:
    toy, memory = served()
    ready = toy.now
    memory = memory.evolve(model_ready_at=ready)
    toy.hung_under_load = True  # the first request waits on a first-shape compile
    grace, window = toy.cluster.policy.hang_ready_grace, toy.cluster.policy.hang_window
    assert grace == 70.0
    plans = walk(toy, memory, looks=30, every=10)
    hit = restarts(plans)
    assert hit, "a stall that outlasts the grace and the window is a hang"
    # Not before the grace and a whole window after it (looks 10 s apart).
    assert toy.now == ready + grace + window
    assert all(not p.actions for p in plans[:-1])


def test_a_counter_that_went_back_is_a_restarted_engine_not_a_hang() -> None:
    toy, memory = served()
    toy.hung_under_load = True
    result, memory = look(toy, memory)
    toy.advance(INTERVAL)
    result, memory = look(toy, memory)
    toy.advance(INTERVAL)
    toy.tokens = 10.0  # the engine restarted under the same API server: counters from zero
    result, memory = look(toy, memory)
    assert not result.actions, result.reason
    assert memory.token_mark is not None and memory.token_mark.since == toy.now


def with_window(toy: Toy, seconds: float) -> None:
    toy.cluster = toy.cluster.model_copy(
        update={"policy": toy.cluster.policy.model_copy(update={"hang_window": seconds})}
    )


def test_the_hang_is_looked_at_when_the_window_ends() -> None:
    toy, memory = served()
    with_window(toy, 40.0)  # sooner than the next probe is due
    toy.hung_under_load = True
    result, memory = look(toy, memory)
    assert memory.token_mark is not None
    assert result.recheck_at == memory.token_mark.since + 40.0


def test_the_window_is_a_config_key() -> None:
    toy, memory = served()
    with_window(toy, 120.0)
    toy.hung_under_load = True
    plans = walk(toy, memory, looks=10)
    assert len(plans) == 5  # 120 s of looks 30 s apart, then the restart
    assert "hang_window 2m00s" in plans[-1].reason


def test_the_restart_is_budgeted() -> None:
    toy, memory = served()
    key = f"restart_model:{toy.cluster.head.name}:{toy.cluster.model.id}"
    memory = memory.evolve(
        attempts=tuple(Attempt(key=key, at=toy.now - 300 + i, ok=True) for i in range(3))
    )
    toy.hung_under_load = True
    plans = walk(toy, memory, looks=10)
    assert plans[-1].phase == "blocked" and "hung under load" in plans[-1].reason


def test_one_restart_when_the_probes_also_gave_up() -> None:
    toy, memory = served()
    toy.hung_under_load = True
    toy.probe_style = "timeout"
    memory = memory.evolve(consecutive_failures=2)
    result, memory = look(toy, memory)
    toy.advance(INTERVAL)
    result, memory = look(toy, memory)
    toy.advance(INTERVAL)
    result, memory = look(toy, memory)
    assert [a.kind for a in result.actions] == ["restart_model"]


def test_a_stall_stamped_in_the_future_is_timed_from_now() -> None:
    """Across a reboot of the ops box with the wall clock behind, a remembered stall start
    later than now is now: the hang is not put off by the step."""
    toy, memory = served()
    toy.hung_under_load = True
    _, memory = look(toy, memory)
    assert memory.token_mark is not None
    ahead = memory.evolve(token_mark=memory.token_mark.model_copy(update={"since": toy.now + 3600}))
    plans = walk(toy, ahead, looks=10)
    assert len(plans) == 3 and restarts(plans)


def test_no_probe_is_sent_into_a_hang_the_plan_will_restart() -> None:
    """The look that finds the hang skips its probe: it would only time out first (30 s at
    the defaults) and change nothing."""
    toy, memory = served()
    toy.hung_under_load = True
    window = toy.cluster.policy.hang_window
    _, memory = look(toy, memory)
    seen = toy.observe().endpoint
    assert not stands(toy.cluster, memory, seen, toy.now + window - 1)
    assert stands(toy.cluster, memory, seen, toy.now + window)
    toy.advance(window)
    result, _ = look(toy, memory)
    assert restarts([result])
    moved = seen.model_copy(update={"generation_tokens_total": toy.tokens + 1}) if seen else None
    assert not stands(toy.cluster, memory, moved, toy.now)
    idle = seen.model_copy(update={"requests_running": 0.0}) if seen else None
    assert not stands(toy.cluster, memory, idle, toy.now)
    fresh = memory.evolve(model_ready_at=toy.now)
    assert not stands(toy.cluster, fresh, seen, toy.now)


# -- properties -------------------------------------------------------------------------------


def with_reading(seen: Observed, running: float, tokens: float) -> Observed:
    endpoint = seen.endpoint or ModelEndpoint(status="up", health_status=200)
    update = {"requests_running": running, "generation_tokens_total": tokens}
    return seen.model_copy(update={"endpoint": endpoint.model_copy(update=update)})


LOOKS = st.lists(
    st.tuples(
        st.floats(1.0, 90.0),  # seconds since the look before
        st.sampled_from([0.0, 0.0, 1.0, 4.0]),  # requests running
        st.sampled_from([0.0, 0.0, 0.0, 1.0, 50.0, -500.0]),  # counter change since the look before
    ),
    min_size=1,
    max_size=25,
)
PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def replay(looks: list[tuple[float, float, float]]) -> list[tuple[float, Plan, list[float]]]:
    """Each look's time, plan, and every (time, running, tokens) reading up to it."""
    toy, memory = served()
    tokens = toy.tokens
    history: list[tuple[float, float, float]] = []
    out: list[tuple[float, Plan, list[float]]] = []
    for gap, running, change in looks:
        toy.advance(gap)
        tokens = max(0.0, tokens + change)
        history.append((toy.now, running, tokens))
        seen = with_reading(toy.observe(), running, tokens)
        result = plan(toy.cluster, seen, memory, toy.now)
        memory = remember(memory, seen, [], toy.now, result)
        out.append((toy.now, result, [h[0] for h in history if h[2] != tokens or h[1] == 0]))
    return out


def hang_reasons(result: Plan) -> bool:
    return any("hung under load" in a.reason for a in result.actions)


@given(LOOKS)
@PROPS
def test_no_hang_without_requests_running(looks: list[tuple[float, float, float]]) -> None:
    idle = [(gap, 0.0, change) for gap, _, change in looks]
    assert not any(hang_reasons(result) for _, result, _ in replay(idle))


@given(LOOKS)
@PROPS
def test_tokens_that_moved_within_the_window_never_give_a_hang(
    looks: list[tuple[float, float, float]],
) -> None:
    toy, _ = served()
    window = toy.cluster.policy.hang_window
    for now, result, broken in replay(looks):
        if hang_reasons(result):
            # Every look of the last window saw requests running and this very counter value.
            assert not any(at > now - window for at in broken), (now, broken)


@given(LOOKS)
@PROPS
def test_no_hang_after_a_look_that_saw_the_counter_move(
    looks: list[tuple[float, float, float]],
) -> None:
    moving = [(gap, running, 1.0 if change == 0 else change) for gap, running, change in looks]
    assert not any(hang_reasons(result) for _, result, _ in replay(moving))

"""Invariant 2: evidence belongs to the process it came from.

A "ready" log line, `model_ready_at`, a probe result, a failure count or a launch's Ray nodes are
about one `vllm serve` process. Replacing the process by a younger one with the same spec (a
restart by hand: no sparkd launch marker, no memory of it) never inherits the old one's
readiness: the newcomer loads, with the grace counted from its own start.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import _since_launch
from sparkd.core.remembering.remember import remember
from sparkd.model.memory import LoadMark, Memory
from sparkd.model.observed import LoadProgress, ModelEndpoint, Observed, RayNode
from sparkd.model.probe import ProbeResult, ProbeVerdict
from tests.examples import EXAMPLE_SET
from tests.toy import Toy

COMMON = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DESTRUCTIVE = {"restart_model", "start_model", "restart_ray", "remove_container"}
OLD_PID, NEW_PID = 5150, 6262


def _example(name: str) -> tuple[Toy, Memory]:
    return next(e for e in EXAMPLE_SET if e.name == name).build()


def probe(at: float, outcome: str) -> ProbeResult:
    healthy = outcome == "reasoning_only"
    return ProbeResult(
        at=at,
        verdict=ProbeVerdict(
            outcome=outcome,  # type: ignore[arg-type]
            healthy=healthy,
            completion_tokens=50 if healthy else None,
            finish_reason="length" if healthy else None,
        ),
        latency_seconds=1.0,
    )


def hand_restarted(toy: Toy, age: float, log_written: float | None) -> Observed:
    """The same cluster after the serve process was replaced, by hand, `age` seconds ago.

    `log_written`: when sparkd's log was last written, relative to the new start (negative: the
    newcomer logs elsewhere, so the log still ends with the old `Application startup
    complete`); None: the log said nothing readable."""
    seen = toy.observe()
    assert seen.serve is not None
    progress = (
        LoadProgress(
            stage="ready",
            percent=100.0,
            progress_at=toy.now - age + log_written,
            message="INFO:     Application startup complete.",
        )
        if log_written is not None
        else None
    )
    serve = seen.serve.model_copy(
        update={"pid": NEW_PID, "elapsed_seconds": age, "progress": progress}
    )
    endpoint = ModelEndpoint(status="refused", detail="connection refused")
    return seen.model_copy(update={"serve": serve, "endpoint": endpoint, "probe": None})


@st.composite
def replaced(draw: st.DrawFn) -> tuple[Toy, Memory, Observed]:
    """A healthy, busy or failing cluster whose serve process was just replaced by hand."""
    name = draw(st.sampled_from(["healthy-reasoning-only", "busy", "three-failed-probes"]))
    toy, memory = _example(name)
    seen = toy.observe()
    old_launch = toy.now - (seen.serve.elapsed_seconds or 0.0) if seen.serve else toy.now
    last = draw(st.sampled_from(["reasoning_only", "refused", "timeout", "http_error"]))
    memory = memory.model_copy(
        update={
            "consecutive_failures": draw(st.integers(0, toy.cluster.policy.failure_threshold - 1)),
            "busy_streak": draw(st.integers(0, 2)),
            "last_probe": probe(toy.now - 30, last),
            "last_probe_at": toy.now - 30,
            "load_mark": LoadMark(pid=OLD_PID, launch=old_launch, key="ready|100.0|", at=toy.now),
        }
    )
    # The newcomer started after the last evidence about the old process (its load mark).
    gap = draw(st.floats(5.0, min(toy.cluster.model.load_stall, 400.0)))
    toy.advance(gap)
    age = draw(st.floats(0.0, gap - 3.0))
    log_written = draw(st.one_of(st.none(), st.floats(-3600.0, -3.0)))
    return toy, memory, hand_restarted(toy, age, log_written)


@COMMON
@given(replaced(), st.lists(st.sampled_from([None, "refused"]), min_size=1, max_size=5))
def test_a_younger_process_never_inherits_readiness(
    case: tuple[Toy, Memory, Observed], probes: list[str | None]
) -> None:
    toy, memory, observed = case
    now = toy.now
    for outcome in probes:
        seen = observed.model_copy(
            update={
                "observed_at": now,
                "serve": observed.serve.model_copy(
                    update={
                        "elapsed_seconds": (observed.serve.elapsed_seconds or 0) + now - toy.now
                    }
                )
                if observed.serve
                else None,
                "probe": probe(now, outcome) if outcome is not None else None,
            }
        )
        result = plan(toy.cluster, seen, memory, now)
        assert not result.learned.model_ready, result.reason
        assert result.phase == "loading", result.reason
        assert not DESTRUCTIVE & {a.kind for a in result.actions}, result.reason
        memory = remember(memory, seen, (), now, result)
        assert memory.model_ready_at is None or memory.model_ready_at >= now
        now += 10.0


def test_hand_restart_gets_its_own_load_grace() -> None:
    """The named case: the log still ends with the old launch's `Application startup complete`,
    the endpoint refuses while the newcomer loads, and three refused probes would restart it."""
    toy, memory = _example("healthy-reasoning-only")
    memory = memory.model_copy(update={"consecutive_failures": 2})
    toy.advance(30)
    observed = hand_restarted(toy, age=20.0, log_written=-25.0)
    observed = observed.model_copy(update={"probe": probe(toy.now, "refused")})
    result = plan(toy.cluster, observed, memory, toy.now)
    assert result.phase == "loading"
    assert result.actions == ()
    assert "after 20s" in result.reason
    learnt = remember(memory, observed, (), toy.now, result)
    assert learnt.model_ready_at is None
    assert learnt.consecutive_failures <= 1


def test_launch_nodes_of_sparkd_launch_say_nothing_of_a_later_process() -> None:
    toy, memory = _example("healthy-reasoning-only")
    toy.advance(30)
    # Ray's head node was replaced after sparkd's launch; the serve restarted by hand runs on it.
    toy.ray_nodes = [
        n.model_copy(update={"node_id": "node99"}) if n.is_head else n for n in toy.ray_nodes
    ]
    assert all(isinstance(n, RayNode) for n in toy.ray_nodes)
    observed = hand_restarted(toy, age=40.0, log_written=-45.0)
    result = plan(toy.cluster, observed, memory, toy.now)
    assert "Ray nodes changed since launch" not in result.reason
    assert result.actions == ()


def test_a_restart_by_hand_into_the_same_log_starts_a_new_launch() -> None:
    lines = [
        "=== sparkd launch abc ===",
        "(APIServer pid=101) INFO 12-01 18:34:02 [api_server.py:1896] vLLM API server version 0.11",
        "(APIServer pid=101) INFO 12-01 18:34:02 [utils.py:328] non-default args: {'model': 'm'}",
        "INFO:     Application startup complete.",
        "(APIServer pid=202) INFO 12-01 19:00:00 [utils.py:286] non-default args: {'model': 'm'}",
        "(APIServer pid=202) INFO 12-01 19:00:06 [model.py:733] Resolved architecture: Qwen3",
    ]
    since = _since_launch(lines)
    assert since[0].startswith("(APIServer pid=202)")
    assert parsers.parse_load_progress(since, None).stage == "starting"

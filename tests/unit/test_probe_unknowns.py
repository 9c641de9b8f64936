"""Probe evidence a restart would not change, or that cannot tell its cause (docs/decisions.md,
`restart_model`):

- A timeout with nothing to tell a busy engine from a hung one (vLLM started with
  `--disable-log-stats` exports no `vllm:` family: tests/fixtures/vllm-log-stats/SOURCES.md) is
  unknown, never a counted failure; it waits `policy.failure_threshold` such probes (the cap),
  then `blocked` with what to check.
- A deterministic 4xx answer (400, 404 a model name the server does not serve, 422) is a config
  fault: the same request gets the same answer after a restart (vLLM's OpenAI server checks the
  request's model name before any engine work, `OpenAIServing._check_model` in
  `vllm/entrypoints/openai/serving_engine.py`: NotFoundError, 404, "The model `X` does not
  exist."). `degraded` with the cause, never counted.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sparkd.core import policy
from sparkd.core.deciding.planner import plan
from sparkd.core.remembering.remember import remember
from sparkd.model.probe import ProbeResult, ProbeVerdict
from tests.support.planning import COMMON, healthy, looks, restarts
from tests.support.toy_run import serving

# -- c. a timeout with the metrics unknown ------------------------------------------------------


def test_timeouts_with_metrics_unknown_never_restart_and_end_blocked() -> None:
    toy, memory = healthy()
    toy.probe_style = "timeout"
    toy.probe_busy = None  # vLLM's metrics unread: busy or hung cannot be told
    threshold = toy.cluster.policy.failure_threshold
    plans, memory = looks(toy, memory, 4 * threshold)
    assert restarts(plans) == [], [p.reason for p in plans if p.actions]
    assert memory.consecutive_failures == 0
    assert all(p.phase == "degraded" for p in plans[: threshold - 1]), plans[0].reason
    assert "busy or hung unknown" in plans[0].reason
    # The cap: the hold ends `blocked` with what a human should check.
    assert all(p.phase == "blocked" for p in plans[threshold - 1 :]), plans[-1].reason
    assert "check vLLM's /metrics" in plans[-1].reason
    assert memory.blocked is None  # not latched: an answer ends it
    toy.probe_style = "reasoning_only"
    toy.probe_busy = False
    after, memory = looks(toy, memory, 1)
    assert after[0].phase == "healthy", after[0].reason
    assert memory.unknown_streak == 0


def test_an_unknown_timeout_is_no_counted_failure() -> None:
    unknown = ProbeResult(
        at=1.0, verdict=ProbeVerdict(outcome="timeout", healthy=False), tokens_advanced=None
    )
    assert unknown.degraded_cause == "busy_or_hung_unknown"
    assert not policy.counts_as_failure(unknown)
    hung = unknown.model_copy(update={"tokens_advanced": False})
    assert policy.counts_as_failure(hung)


@COMMON
@given(
    st.lists(
        st.sampled_from(["unknown", "unknown", "hung", "answer", "not_run"]),
        min_size=1,
        max_size=30,
    )
)
def test_unknown_timeouts_never_complete_a_restart_count(steps: list[str]) -> None:
    """Property: a restart on the probe's count needs `failure_threshold` timeouts judged hung
    in a row (answers reset it; unknowns and not_run neither count nor reset)."""
    toy, memory = healthy()
    threshold = toy.cluster.policy.failure_threshold
    counted = 0
    for step in steps:
        toy.probe_style = "timeout" if step in ("unknown", "hung") else step  # type: ignore[assignment]
        toy.probe_busy = None if step == "unknown" else False
        toy.advance(60.0)
        seen = toy.observe()
        made = plan(toy.cluster, seen, memory, toy.now)
        counted = 0 if step == "answer" else counted + (step == "hung")
        if any(a.kind == "restart_model" for a in made.actions):
            assert counted >= threshold, (steps, made.reason)
            return
        memory = remember(memory, seen, [], toy.now, made)


# -- d. deterministic 4xx answers ---------------------------------------------------------------


@COMMON
@given(st.sampled_from([400, 401, 403, 404, 405, 413, 422]))
def test_deterministic_4xx_is_a_config_fault_never_restarted(status: int) -> None:
    toy, memory = healthy()
    toy.probe_style = "http_error"
    toy.probe_status = status
    plans, memory = looks(toy, memory, 3 * toy.cluster.policy.failure_threshold)
    assert restarts(plans) == []
    assert all(p.phase == "degraded" for p in plans), plans[-1].reason
    assert f"degraded: config fault: the server answered the probe HTTP {status}" in plans[0].reason
    assert memory.consecutive_failures == 0
    assert memory.attempts == ()


@given(st.sampled_from([408, 429, 500, 502, 503]))
def test_transient_or_server_errors_still_count(status: int) -> None:
    failed = ProbeResult(
        at=1.0, verdict=ProbeVerdict(outcome="http_error", healthy=False), http_status=status
    )
    assert not failed.config_fault
    assert policy.counts_as_failure(failed)


def test_a_rollout_whose_server_refuses_the_probe_rolls_back() -> None:
    """During a rollout the last-good spec answered: a 4xx of the new spec is its fault, and
    the rollback (not a restart) is what changes the evidence."""
    run = serving()
    good = run.memory.last_good
    assert good is not None
    model = run.desired.model.model_copy(
        update={"extra_args": (*run.desired.model.extra_args, "--max-num-seqs", "8")}
    )
    run.desired = run.desired.model_copy(update={"model": model})
    run.cycle()
    run.until("healthy")
    run.toy.probe_style = "http_error"
    run.toy.probe_status = 400
    back = next((p for p in (run.cycle() for _ in range(3)) if p.rollback is not None), None)
    assert back is not None, [p.reason for p in run.plans[-3:]]
    assert back.rollback is not None and "config fault" in back.rollback
    assert run.toy.serve_spec == good.hash

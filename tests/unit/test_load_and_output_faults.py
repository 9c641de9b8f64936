"""Load is not failure, and output faults are not engine faults (the probe's part of "never make
it worse"): evidence a restart would not change never counts toward one.

- A busy probe (timed out while other requests ran and tokens flowed) is `degraded: overloaded`,
  for as long as the load lasts: never a restart, never a rollback.
- A turn that ended (`stop`) with reasoning and no content is `degraded: output fault`: at
  temperature 0 a restart returns the same turn. Never counted; during an unaccepted rollout it
  rolls the spec back (the last-good spec, which served, changes the evidence).
- An answer vLLM's qwen3 parser leaves in `reasoning` after a `</think>` it did not recognise is
  an answer (tests/fixtures/vllm-parser: made by the real parser, README there).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.core import policy
from sparkd.core.deciding.planner import plan
from sparkd.core.reading.classify import classify_response, classify_stream
from sparkd.core.remembering.remember import remember
from sparkd.model.cluster import ClusterSpec
from sparkd.model.probe import ProbeOutcome, ProbeResult, ProbeVerdict
from tests.support.planning import healthy, looks, restarts
from tests.support.toy_run import Run, serving

PARSER = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-parser"
SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples"
MAX_TOKENS = 50
HOURS = 4
COMMON = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def with_temperature(cluster: ClusterSpec, temperature: float) -> ClusterSpec:
    probe = cluster.probe.model_copy(update={"temperature": temperature})
    return cluster.model_copy(update={"probe": probe})


def with_args(cluster: ClusterSpec, *args: str) -> ClusterSpec:
    model = cluster.model.model_copy(update={"extra_args": (*cluster.model.extra_args, *args)})
    return cluster.model_copy(update={"model": model})


# -- a. A stray </think> ------------------------------------------------------------------------


def fixture_stream(name: str) -> list[str]:
    return (PARSER / name).read_text().splitlines()


def streamed_message(lines: list[str]) -> dict[str, str]:
    """What a client assembles from a stream's deltas."""
    got = {"reasoning": "", "content": ""}
    for line in lines:
        if line.startswith("data: {"):
            for choice in json.loads(line[len("data: ") :])["choices"]:
                for field in got:
                    got[field] += choice["delta"].get(field) or ""
    return got


def test_stray_think_close_left_in_reasoning_is_an_answer_read_after_the_closer() -> None:
    """vLLM 0.32's qwen3 parser, streaming, over a turn that spelled `</think>` in pieces: the
    whole turn stays in `reasoning`, closer included, and no content comes (README there)."""
    lines = fixture_stream("qwen3-stray-think-close-stream.txt")
    message = streamed_message(lines)
    assert message["content"] == "" and "</think>" in message["reasoning"]
    verdict = classify_stream(200, lines, MAX_TOKENS)
    assert (verdict.outcome, verdict.healthy) == ("answer", True), verdict
    assert "Hello! It's nice to meet you." in verdict.detail
    # The same turn, non-streaming: that parser path splits at the closer's text.
    whole = classify_response(
        200, (PARSER / "qwen3-stray-think-close.json").read_text(), MAX_TOKENS
    )
    assert (whole.outcome, whole.healthy) == ("answer", True), whole
    # And as a message holding what the stream held (another server, another parser path).
    body = {
        "choices": [
            {
                "message": {"content": None, "reasoning": message["reasoning"]},
                "finish_reason": "stop",
            }
        ],
        "usage": {"completion_tokens": 50},
    }
    assert classify_response(200, json.dumps(body), MAX_TOKENS).outcome == "answer"


def test_stray_think_close_answer_counts_no_failure_and_is_healthy() -> None:
    toy, memory = healthy()
    toy.probe_style = "answer"
    verdict = classify_stream(200, fixture_stream("qwen3-stray-think-close-stream.txt"), 50)
    toy.advance(60)
    seen = toy.observe()
    assert seen.probe is not None
    seen = seen.model_copy(update={"probe": seen.probe.model_copy(update={"verdict": verdict})})
    memory = memory.evolve(consecutive_failures=2)
    made = plan(toy.cluster, seen, memory, toy.now)
    assert made.phase == "healthy" and made.actions == (), made.reason
    assert made.learned.probe_failures == 0


def test_reasoning_with_nothing_after_the_closer_is_judged_as_before() -> None:
    """A closer at the very end leaves no answer: a turn that stopped there is no answer."""
    body = {
        "choices": [
            {
                "message": {"content": None, "reasoning": "Okay, a greeting.</think>\n\n"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"completion_tokens": 9},
    }
    verdict = classify_response(200, json.dumps(body), MAX_TOKENS)
    assert verdict.outcome == "no_answer"


# -- b. A deterministic reasoning-only stop -----------------------------------------------------


def test_template_that_closed_the_think_block_is_real_and_no_answer() -> None:
    """vLLM 0.32's qwen3 parser, non-streaming, after a prompt whose template already closed
    the think block (no enable_thinking reached the parser): the answer lands in `reasoning`,
    content null, `stop`. Streaming, the server reads the prompt and streams content."""
    document = json.loads((PARSER / "qwen3-prompt-closed-think.json").read_text())
    choice = document["choices"][0]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "stop"
    verdict = classify_response(200, json.dumps(document), MAX_TOKENS)
    assert (verdict.outcome, verdict.healthy) == ("no_answer", False), verdict
    streamed = classify_stream(200, fixture_stream("qwen3-prompt-closed-think-stream.txt"), 50)
    assert (streamed.outcome, streamed.healthy) == ("answer", True), streamed


def test_deterministic_reasoning_only_stop_is_degraded_output_fault_never_restarted() -> None:
    toy, memory = healthy()
    assert toy.cluster.probe.temperature == 0
    toy.probe_style = "no_answer"
    plans, memory = looks(toy, memory, 3 * toy.cluster.policy.failure_threshold)
    assert restarts(plans) == []
    assert all(p.phase == "degraded" for p in plans), [p.reason for p in plans]
    assert all("degraded: output fault" in p.reason for p in plans), plans[0].reason
    assert "at temperature 0 a restart returns the same turn" in plans[0].reason
    assert memory.consecutive_failures == 0
    assert memory.attempts == ()


def test_sampled_reasoning_only_stop_is_reported_as_weaker_evidence_never_counted() -> None:
    toy, memory = healthy()
    toy.cluster = with_temperature(toy.cluster, 0.7)
    toy.probe_style = "no_answer"
    plans, memory = looks(toy, memory, 3 * toy.cluster.policy.failure_threshold)
    assert restarts(plans) == []
    assert "sampled at temperature 0.7, one such turn may be chance" in plans[0].reason
    assert memory.consecutive_failures == 0


def test_budget_spent_thinking_stays_healthy() -> None:
    """The seed's case: content null, finish_reason length, 50 completion tokens."""
    verdict = classify_response(200, (SAMPLES / "vllm-real-chat-probe.json").read_bytes(), 50)
    assert (verdict.outcome, verdict.healthy) == ("reasoning_only", True)
    toy, memory = healthy()
    plans, _ = looks(toy, memory, 3)
    assert [p.phase for p in plans] == ["healthy"] * 3


def test_output_fault_after_counted_failures_does_not_complete_the_count() -> None:
    toy, memory = healthy()
    toy.probe_style = "no_answer"
    memory = memory.evolve(consecutive_failures=toy.cluster.policy.failure_threshold - 1)
    plans, memory = looks(toy, memory, 2)
    assert restarts(plans) == []
    assert memory.consecutive_failures == toy.cluster.policy.failure_threshold - 1


def test_rollout_whose_answers_reach_no_content_rolls_back_at_temperature_zero() -> None:
    """A restart of the new spec reproduces its output fault; the last-good spec served."""
    run = serving()
    good = run.memory.last_good
    assert good is not None
    run.desired = with_args(run.desired, "--reasoning-parser", "qwen3")
    run.cycle()  # the cutover
    run.until("healthy")  # loaded: the new spec's first probe answered, not yet accepted
    run.toy.probe_style = "no_answer"
    back = next((p for p in (run.cycle() for _ in range(3)) if p.rollback is not None), None)
    assert back is not None, [p.reason for p in run.plans[-3:]]
    assert back.rollback is not None and "its answers reach no content" in back.rollback
    assert [a.kind for a in back.actions] == ["restart_model"]
    assert run.toy.serve_spec == good.hash


def test_sampled_output_fault_of_a_rollout_rolls_back_only_when_it_repeats() -> None:
    run = serving()
    run.desired = with_temperature(with_args(run.desired, "--max-num-seqs", "8"), 0.7)
    run.toy.cluster = with_temperature(run.toy.cluster, 0.7)
    run.cycle()
    run.until("healthy")
    run.toy.probe_style = "no_answer"
    first = run.cycle()
    assert first.rollback is None, first.reason
    second = run.cycle()
    assert second.rollback is not None and "no content" in second.rollback


# -- c. Load is not failure ---------------------------------------------------------------------


def test_overload_that_lasts_hours_is_reported_never_restarted() -> None:
    """Peak traffic for hours: every probe times out while tokens flow for others. It stays
    `degraded: overloaded` (and alerted) the whole time; nothing is restarted or counted."""
    toy, memory = healthy()
    toy.probe_style = "timeout"
    toy.probe_busy = True
    plans, memory = looks(toy, memory, HOURS * 60)
    assert restarts(plans) == []
    assert all(p.actions == () for p in plans), next(p.reason for p in plans if p.actions)
    assert all(p.phase == "degraded" for p in plans)
    assert all("degraded: overloaded" in p.reason for p in plans), plans[-1].reason
    assert memory.consecutive_failures == 0
    assert memory.busy_streak == HOURS * 60
    assert memory.blocked is None


def test_peak_load_during_a_rollout_is_not_a_bad_spec() -> None:
    run = serving()
    run.desired = with_args(run.desired, "--max-num-seqs", "8")
    run.cycle()
    run.until("healthy")
    run.toy.probe_style = "timeout"
    run.toy.probe_busy = True
    plans = [run.cycle() for _ in range(30)]
    assert all(p.rollback is None for p in plans), [p.rollback for p in plans]
    assert all(p.actions == () for p in plans), [p.reason for p in plans if p.actions]
    record = run.memory.rollout
    assert record is not None and record.result == "in_progress"
    # Once the peak passes the new spec is accepted.
    run.toy.probe_style = "reasoning_only"
    run.toy.probe_busy = False
    for _ in range(run.desired.rollout.acceptance_probes + 1):
        run.cycle()
    record = run.memory.rollout
    assert record is not None and record.result == "accepted"


def test_busy_probe_never_counts_however_long() -> None:
    busy = ProbeResult(
        at=1.0,
        verdict=ProbeVerdict(outcome="timeout", healthy=False, detail="no answer within 30s"),
        tokens_advanced=True,
    )
    assert not policy.counts_as_failure(busy)
    hung = busy.model_copy(update={"tokens_advanced": False})
    assert policy.counts_as_failure(hung)


# Between busy probes the peak may ease: an answer, a probe that could not be sent, a slow one.
BUSY_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["busy", "busy", "busy", "answer", "reasoning_only", "not_run"]),
        st.floats(30.0, 600.0),
    ),
    min_size=1,
    max_size=40,
)


@COMMON
@given(BUSY_STEPS, st.integers(0, 2))
def test_no_busy_but_progressing_sequence_restarts_the_model(
    steps: list[tuple[str, float]], failures: int
) -> None:
    """Property: whatever mix and pacing of busy probes (tokens flowing for others) and
    answers, from any count of earlier failures below the threshold, no restart happens."""
    toy, memory = healthy()
    memory = memory.evolve(consecutive_failures=failures)
    for kind, seconds in steps:
        toy.probe_busy = kind == "busy"
        style: ProbeOutcome = "timeout" if kind == "busy" else kind  # type: ignore[assignment]
        toy.probe_style = style
        toy.advance(seconds)
        seen = toy.observe()
        made = plan(toy.cluster, seen, memory, toy.now)
        assert not any(a.kind == "restart_model" for a in made.actions), made.reason
        memory = remember(memory, seen, [], toy.now, made)
    assert memory.consecutive_failures <= failures


@COMMON
@given(BUSY_STEPS)
def test_no_busy_but_progressing_sequence_rolls_a_rollout_back(
    steps: list[tuple[str, float]],
) -> None:
    run = ROLLOUT_START.copy()
    for kind, seconds in steps:
        run.toy.probe_busy = kind == "busy"
        style: ProbeOutcome = "timeout" if kind == "busy" else kind  # type: ignore[assignment]
        run.toy.probe_style = style
        made = run.cycle(seconds)
        assert made.rollback is None, made.reason
        assert not any(a.kind.endswith("model") for a in made.actions), made.reason


class _RolloutStart:
    """A rollout cut over and loaded, probing its new spec: made once, copied per example."""

    def __init__(self) -> None:
        self._run: Run | None = None

    def copy(self) -> Run:
        if self._run is None:
            run = serving()
            run.desired = with_args(run.desired, "--max-num-seqs", "8")
            run.cycle()
            run.until("healthy")
            self._run = run
        return copy.deepcopy(self._run)


ROLLOUT_START = _RolloutStart()

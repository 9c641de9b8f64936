"""Rollouts, cycle by cycle on the toy cluster: last-good, acceptance, rollback and its hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sparkd.cli.api import render_status
from sparkd.cli.commands import _parser
from sparkd.core.deciding import rollout
from sparkd.core.judging.acceptance import judge_check
from sparkd.core.judging.model_stage import exit_cause
from sparkd.core.spec import identity, spec_of
from sparkd.model.cluster import ClusterSpec, RolloutCheck
from sparkd.model.memory import Attempt, Memory
from sparkd.model.observed import Observed
from sparkd.model.probe import CheckResult
from sparkd_sim.vllm_logs import EXECUTOR_STEP, engine_failed, missing_weight_files
from tests.support.toy_run import Run, serving
from tests.toy import Toy


def with_args(cluster: ClusterSpec, *args: str, rollback: bool = True) -> ClusterSpec:
    model = cluster.model.model_copy(update={"extra_args": (*cluster.model.extra_args, *args)})
    policy = cluster.rollout.model_copy(update={"rollback": rollback})
    return cluster.model_copy(update={"model": model, "rollout": policy})


def test_last_good_is_recorded_after_the_acceptance_probes_and_not_before() -> None:
    toy = Toy.healthy()
    run = Run(toy=toy, desired=toy.cluster)
    run.memory = Memory(launched_at=toy.serve_started, model_ready_at=toy.now - 100)
    run.cycle()
    run.cycle()
    assert run.memory.last_good is None and run.memory.healthy_probes == 2
    run.cycle()
    good = run.memory.last_good
    assert good is not None and good.hash == identity(toy.cluster)
    assert good.model == toy.cluster.model.model_dump(mode="json")
    assert spec_of(toy.cluster, good) == toy.cluster


def test_a_good_change_is_cut_over_once_and_accepted_with_its_downtime() -> None:
    run = serving()
    old = run.memory.last_good
    run.desired = with_args(run.desired, "--max-num-seqs", "8")
    cut = run.cycle()
    assert [a.kind for a in cut.actions] == ["restart_model"] and "spec drift" in cut.reason
    record = run.memory.rollout
    assert record is not None and record.result == "in_progress" and record.stopped_at is not None
    assert old is not None and record.from_hash == old.hash
    run.until("healthy")
    for _ in range(3):
        run.cycle()
    record = run.memory.rollout
    assert record is not None and record.result == "accepted"
    assert record.downtime is not None and record.downtime >= run.toy.load_seconds
    good = run.memory.last_good
    assert good is not None and good.hash == identity(run.desired)
    starts = [a for p in run.plans for a in p.actions if a.kind.endswith("model")]
    assert len(starts) == 1


def test_an_argument_error_rolls_back_to_the_last_good_spec_and_holds_degraded() -> None:
    run = serving()
    good = run.memory.last_good
    assert good is not None
    run.on_launch = ["arg_error"]
    run.desired = with_args(run.desired, "--enable-resoning")
    bad = identity(run.desired)
    cutover = run.cycle()
    back = run.cycle()
    # Each plan carries the spec its actions launch: the new one, then the last-good one.
    assert cutover.spec is not None and identity(cutover.spec) == bad
    assert back.spec is not None and identity(back.spec) == good.hash
    # Never shown: a spec can carry a power command's arguments.
    assert "spec" not in back.model_dump() and "power" not in repr(back)
    assert back.rollback is not None
    assert "unrecognized arguments: --enable-resoning" in back.rollback
    assert back.reason.startswith(f"rolling back from {bad} to {good.hash}: vllm serve exited")
    assert [a.kind for a in back.actions] == ["start_model"]
    assert run.toy.serve_spec == good.hash
    held = run.until("degraded")
    assert held.reason.startswith(f"rolled back from {bad} to {good.hash}: vllm serve exited")
    for _ in range(5):
        assert not run.cycle().actions
    record = run.memory.rollout
    assert record is not None and record.result == "rolled_back" and record.restored_at
    assert run.memory.last_good == good


def test_a_stalled_load_of_the_new_spec_rolls_back() -> None:
    run = serving()
    run.on_launch = ["stall"]
    run.desired = with_args(run.desired, "--max-num-seqs", "8")
    run.cycle()
    back = next(p for p in (run.cycle() for _ in range(20)) if p.actions)
    assert back.rollback is not None and back.rollback.startswith("load stalled")
    run.until("degraded")


def test_a_new_spec_whose_restart_budget_is_spent_rolls_back_on_its_own_budget() -> None:
    run = serving()
    good = run.memory.last_good
    assert good is not None
    run.on_launch = ["exit"]  # exits at once, saying nothing of why
    run.desired = with_args(run.desired, "--max-num-seqs", "8")
    plans = [run.cycle() for _ in range(6)]
    back = next(p for p in plans if p.rollback is not None)
    assert back.rollback is not None and back.rollback.startswith("budget spent: start_model")
    assert [a.kind for a in back.actions] == ["start_model"]
    assert run.toy.serve_spec == good.hash and run.toy.serve_running
    assert not any(p.phase == "blocked" for p in plans)


def test_an_argument_error_of_a_launch_never_recorded_still_rolls_back() -> None:
    run = serving()
    run.memory = run.memory.evolve(launched_at=None)  # the world launched it, not sparkd
    run.on_launch = ["arg_error"]
    run.desired = with_args(run.desired, "--enable-resoning")
    run.cycle()
    back = run.cycle()
    assert back.rollback is not None and "unrecognized arguments" in back.rollback


def test_without_rollback_a_failed_spec_is_restarted_as_before() -> None:
    run = serving()
    run.on_launch = ["arg_error"]
    run.desired = with_args(run.desired, "--enable-resoning", rollback=False)
    run.cycle()
    again = run.cycle()
    assert again.rollback is None and [a.kind for a in again.actions] == ["start_model"]
    assert run.toy.serve_spec == identity(run.desired)


def test_without_a_last_good_spec_nothing_is_rolled_back() -> None:
    toy = Toy.healthy()
    run = Run(toy=toy, desired=with_args(toy.cluster, "--enable-resoning"))
    run.memory = Memory(launched_at=toy.serve_started, model_ready_at=toy.now - 100)
    run.on_launch = ["arg_error_all"]
    for _ in range(12):
        assert run.cycle().rollback is None
    assert run.memory.last_good is None
    assert run.plans[-1].phase == "blocked"


def test_a_rollback_that_fails_latches_blocked_with_both_causes() -> None:
    run = serving()
    good = run.memory.last_good
    assert good is not None
    run.on_launch = ["arg_error", "stall_all"]
    run.desired = with_args(run.desired, "--enable-resoning")
    run.cycle()
    assert run.cycle().rollback is not None
    blocked = run.until("blocked")
    assert blocked.reason.startswith(f"rollback to {good.hash} failed: load stalled")
    assert "had failed: vllm serve exited: argument error" in blocked.reason
    assert run.memory.blocked is not None
    record = run.memory.rollout
    assert record is not None and record.result == "rollback_failed"


def rolled_back_and_held() -> Run:
    """A bad flag rolled out, its serve failed, rolled back to last-good and held there."""
    run = serving()
    run.on_launch = ["arg_error"]
    run.desired = with_args(run.desired, "--enable-resoning")
    run.cycle()
    run.cycle()
    run.until("degraded")
    return run


def test_retry_rolls_the_desired_spec_out_again_and_back_goes_to_last_good() -> None:
    run = rolled_back_and_held()
    first = run.memory.rollout
    run.memory = rollout.retry(run.memory, run.desired)
    again = run.cycle()
    assert [a.kind for a in again.actions] == ["restart_model"] and "spec drift" in again.reason
    assert run.toy.serve_spec == identity(run.desired)
    record = run.memory.rollout
    assert first is not None and record is not None and record.id == first.id + 1
    # The fault is fixed; the retried spec serves and is accepted.
    run.on_launch = []
    run.toy.serve_running, run.toy.log_tail = True, ()
    run.until("healthy")
    for _ in range(3):
        run.cycle()
    accepted = run.memory.last_good
    assert accepted is not None and accepted.hash == identity(run.desired)
    # Then an operator goes back to the spec before it: there is none other than this one.
    assert rollout.back(run.memory, run.desired, "ops", run.toy.now, run.toy.now) == run.memory


def test_retry_of_a_rollback_the_config_no_longer_asks_for_changes_nothing() -> None:
    run = rolled_back_and_held()
    held = run.memory
    # The operator fixed the config instead: the held rollback is of a spec nobody wants.
    run.desired = with_args(rolled_back_and_held().desired, "--max-num-seqs", "8")
    assert rollout.retry(held, run.desired) == held


def test_retry_forgives_the_rollouts_attempts_and_no_others() -> None:
    run = rolled_back_and_held()
    record = run.memory.rollout
    assert record is not None
    earlier = Attempt(key="power_cycle:spark-b:spark-b", at=record.began_at - 5, ok=True)
    during = Attempt(key="restart_model:spark-a:x", at=record.began_at + 1, ok=False)
    memory = run.memory.evolve(attempts=(earlier, during))
    retried = rollout.retry(memory, run.desired)
    assert retried.rollout is None
    assert retried.attempts == (earlier,)


def test_back_relaunches_the_last_good_spec_during_a_rollout() -> None:
    run = serving()
    good = run.memory.last_good
    assert good is not None
    run.desired = with_args(run.desired, "--max-num-seqs", "8")
    run.cycle()
    run.memory = rollout.back(run.memory, run.desired, "alice", run.toy.now, run.toy.now)
    made = run.cycle()
    assert [a.kind for a in made.actions] == ["restart_model"]
    assert run.toy.serve_spec == good.hash
    held = run.until("degraded")
    assert "to " + good.hash + ": asked by alice" in held.reason


def test_back_asked_while_a_cycle_accepts_the_rollout_still_goes_back() -> None:
    """The operator's `rollout back` lands while the cycle that accepts the rollout runs: the
    request, applied again on top of what that cycle learnt, still goes back to the spec that
    was last-good when it was asked, rather than answering 200 and doing nothing."""
    import structlog

    from sparkd.runtime.clock import DaemonClock
    from sparkd.runtime.requests import MemoryNow, OperatorRequests

    run = serving()
    good = run.memory.last_good
    assert good is not None
    run.desired = with_args(run.desired, "--max-num-seqs", "8")
    before = run.memory
    for _ in range(30):
        before = run.memory
        run.cycle()
        if run.memory.rollout is not None and run.memory.rollout.result == "accepted":
            break
    accepted = run.memory
    assert accepted.last_good is not None and accepted.last_good.hash == identity(run.desired)
    now = MemoryNow(before)
    now.look_began()
    clock = DaemonClock(lambda: run.toy.now, lambda: run.toy.now, "boot")
    requests = OperatorRequests(
        now,
        lambda: run.desired,
        clock,
        lambda: run.toy.now,
        structlog.get_logger(),
        lambda event, fields: True,
        lambda: None,
    )
    assert requests.rollout_back("alice")
    now.learnt(accepted)  # the accepting cycle ends; the request is applied on top
    now.cycle_ended()
    record = now.value.rollout
    assert record is not None and record.result == "rolled_back", record
    assert now.value.last_good == good
    run.memory = now.value
    made = run.cycle()
    assert [a.kind for a in made.actions] == ["restart_model"]
    assert run.toy.serve_spec == good.hash


def test_a_config_change_while_held_ends_the_hold() -> None:
    run = rolled_back_and_held()
    run.on_launch = []
    run.desired = with_args(run.desired.model_copy(), "--max-num-seqs", "8")
    made = run.cycle()
    assert [a.kind for a in made.actions] == ["restart_model"] and made.rollback is None
    assert run.toy.serve_spec == identity(run.desired)


def test_a_reload_that_changes_nothing_in_the_spec_starts_no_rollout() -> None:
    run = serving()
    run.desired = run.desired.model_copy(update={"interval": 45.0})
    for _ in range(3):
        assert not run.cycle().actions
    assert run.memory.rollout is None


FAULTS = st.sampled_from(["none", "arg_error", "stall", "stall_all", "arg_error_all", "exit"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["change", "change", "retry", "back", "wait", "lose"]),
            FAULTS,
            st.integers(1, 14),
        ),
        min_size=1,
        max_size=8,
    ),
    rollback=st.booleans(),
)
def test_rollback_properties(steps: list[tuple[str, str, int]], rollback: bool) -> None:
    """Never back to the spec that failed, never without a last-good spec, at most once per
    rollout, only when rollback is on, and never while a host is out of reach (`lose`: the
    worker's SSH times out and the probes with it, for the step's cycles)."""
    run = serving()
    base = run.desired
    worker = next(h.name for h in base.hosts if h.role != "head")
    changes = 0
    rolled: dict[int, int] = {}
    for step, fault, cycles in steps:
        run.on_launch = [] if fault == "none" else [fault]
        if step == "change":
            changes += 1
            run.desired = with_args(base, "--max-num-seqs", str(changes), rollback=rollback)
        elif step == "retry":
            run.memory = rollout.retry(run.memory, run.desired)
        elif step == "back":
            run.memory = rollout.back(run.memory, run.desired, "ops", run.toy.now, run.toy.now)
        lost = step == "lose"
        if lost:
            run.toy.unreachable(worker, "timeout")
            run.toy.probe_style = "timeout"
        for _ in range(cycles):
            before = run.memory
            made = run.cycle()
            if made.rollback is None:
                continue
            assert not lost, made.rollback
            event("rolled back")
            assert rollback
            good = before.last_good
            assert good is not None
            assert good.hash != identity(run.desired)
            assert run.toy.serve_spec == good.hash
            record = run.memory.rollout
            assert record is not None
            rolled[record.id] = rolled.get(record.id, 0) + 1
            assert rolled[record.id] == 1
        if lost:
            run.toy.errors.pop(worker)
            run.toy.probe_style = "reasoning_only"


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-real"


def test_exit_causes_name_the_argument_error_and_the_engines_root_cause() -> None:
    argparse = (FIXTURES / "serve-unknown-argument.txt").read_text().splitlines()
    assert exit_cause(tuple(argparse)) == (
        "argument error: vllm: error: unrecognized arguments: --bogus-flag x"
    )
    missing = ["/models/m/model-00002-of-00039.safetensors"]
    lines = engine_failed(10, 11, missing_weight_files(missing), EXECUTOR_STEP)
    assert exit_cause(tuple(lines[-20:])) == (
        "engine failed to start: FileNotFoundError: Weight files referenced in index but "
        "missing: {'/models/m/model-00002-of-00039.safetensors'}"
    )
    signalled = ("INFO:     Shutting down", "INFO:     Application shutdown complete.")
    assert exit_cause(signalled) is None


def test_status_shows_desired_running_last_good_what_differs_and_the_rollout() -> None:
    cluster = {
        "cluster": "sparks",
        "phase": "degraded",
        "reason": "rolled back from bbb to aaa: vllm serve exited: argument error: ...",
        "rollout": {
            "desired": "bbb",
            "running": "aaa",
            "last_good": {"spec": "aaa", "at": 1.0, "model": "/models/m"},
            "differs": ["model.extra_args: [] -> ['--enable-resoning']"],
            "in_progress": False,
            "rolled_back": True,
            "latest": {"id": 2, "from": "aaa", "to": "bbb", "result": "rolled_back",
                       "downtime_seconds": None, "rolled_back": "vllm serve exited: ..."},
        },
    }  # fmt: skip
    text = render_status({"clusters": [cluster]})
    assert "sparks: desired bbb, running aaa, last-good aaa" in text
    assert "  differs: model.extra_args: [] -> ['--enable-resoning']" in text
    assert "  rollout 2: aaa -> bbb, rolled_back (vllm serve exited: ...)" in text
    first = {"cluster": "sparks", "phase": "healthy", "rollout": {"last_good": None}}
    assert "last-good" not in render_status({"clusters": [first]})
    settled = {"desired": "aaa", "running": "aaa", "last_good": {"spec": "aaa"}}
    steady = {"cluster": "sparks", "phase": "healthy", "rollout": settled}
    assert len(render_status({"clusters": [steady]}).splitlines()) == 2


def test_rollout_commands_parse() -> None:
    parser = _parser()
    assert parser.parse_args(["rollout", "status"]).cluster is None
    args = parser.parse_args(["rollout", "back", "sparks"])
    assert (args.command, args.rollout_command, args.cluster) == ("rollout", "back", "sparks")


def with_check(cluster: ClusterSpec, **check: object) -> ClusterSpec:
    checks = (RolloutCheck.model_validate({"prompt": "Capital of France?", **check}),)
    return cluster.model_copy(
        update={"rollout": cluster.rollout.model_copy(update={"checks": checks})}
    )


def test_a_failed_acceptance_check_rolls_back_before_acceptance() -> None:
    run = serving()
    good = run.memory.last_good
    run.checks_pass = False
    run.desired = with_check(with_args(run.desired, "--max-num-seqs", "8"), contains="Paris")
    plans = [run.cycle() for _ in range(25)]
    back = next(p for p in plans if p.rollback is not None)
    assert back.rollback == "acceptance check 1 failed: answer lacks 'Paris'"
    assert good is not None and run.toy.serve_spec == good.hash
    assert run.memory.last_good == good


def test_passed_acceptance_checks_let_the_rollout_be_accepted() -> None:
    run = serving()
    run.desired = with_check(with_args(run.desired, "--max-num-seqs", "8"), contains="Paris")
    for _ in range(25):
        run.cycle()
    record = run.memory.rollout
    assert record is not None and record.result == "accepted" and record.checked


FIXTURE_PROBE = (FIXTURES / "chat-probe.json").read_text()
FIXTURE_ANSWER = (FIXTURES / "chat-enable-thinking-false.json").read_text()


def test_acceptance_checks_judge_real_answers_reasoning_aware() -> None:
    def check(body: str, **fields: object) -> CheckResult:
        spec = RolloutCheck.model_validate({"prompt": "p", "max_tokens": 50, **fields})
        return judge_check(0, spec, 200, body)

    # Reasoning only (content null, the budget spent): no answer to judge, healthy as the probe.
    assert check(FIXTURE_PROBE, contains="hello").ok is True
    assert check(FIXTURE_PROBE, min_completion_tokens=51).ok is False
    content = json.loads(FIXTURE_ANSWER)["choices"][0]["message"]["content"].strip()
    word = content.split()[0]
    assert check(FIXTURE_ANSWER, contains=word).ok is True
    assert check(FIXTURE_ANSWER, contains="Paris-" + word).ok is False
    assert check(FIXTURE_ANSWER, regex=f"^{re.escape(word)}").ok is True
    assert check(FIXTURE_ANSWER, regex="^$").ok is False
    assert judge_check(0, RolloutCheck(prompt="p"), 500, "{}").ok is False


def test_a_worker_lost_after_the_new_spec_served_does_not_roll_it_back() -> None:
    """Probes that fail while a host is out of reach say nothing of the spec: the restart they
    ask for is held, and so is the rollback."""
    run = serving()
    run.desired = with_args(run.desired, "--max-num-seqs", "8")
    run.until("healthy")
    assert run.memory.healthy_probes == 1
    worker = next(h.name for h in run.desired.hosts if h.role != "head")
    run.toy.unreachable(worker, "timeout")
    run.toy.probe_style = "timeout"
    plans = [run.cycle() for _ in range(60)]
    assert all(p.rollback is None for p in plans), [p.rollback for p in plans]
    record = run.memory.rollout
    assert record is not None and record.result == "in_progress"
    assert run.toy.serve_spec == identity(run.desired)


def test_a_rollout_remembered_from_the_future_still_rolls_back() -> None:
    """The ops box rebooted with its clock behind: every stamp it remembers is ahead of now,
    the rollout's beginning too, and the failing new spec is still judged as the rollout's."""
    run = serving()
    run.on_launch = ["arg_error"]
    run.desired = with_args(run.desired, "--enable-resoning")
    run.cycle()  # the cutover
    record = run.memory.rollout
    assert record is not None
    ahead = 3600.0
    run.memory = run.memory.evolve(
        attempts=tuple(a.model_copy(update={"at": a.at + ahead}) for a in run.memory.attempts),
        rollout=record.model_copy(update={"began_at": record.began_at + ahead}),
    )
    back = run.cycle()
    assert back.rollback is not None and "unrecognized arguments" in back.rollback


def test_an_mtu_mismatch_after_the_new_spec_served_does_not_roll_it_back() -> None:
    """The probes fail while the data link's MTU is wrong: the restart is held for the fabric,
    and what the fabric did is no failure of the spec."""
    from tests.support.planning import SOUND, host

    run = serving()
    run.desired = with_args(run.desired, "--max-num-seqs", "8")
    run.until("healthy")
    toy = run.toy

    def observe() -> Observed:
        seen = host(Toy.observe(toy), "spark-a", fabric=SOUND)
        return host(seen, "spark-b", fabric=SOUND.model_copy(update={"mtu": 1500}))

    object.__setattr__(toy, "observe", observe)
    toy.probe_style = "timeout"
    plans = [run.cycle() for _ in range(8)]
    assert all(p.learned.fabric_held for p in plans)
    assert all(p.rollback is None for p in plans), [p.rollback for p in plans]
    assert run.toy.serve_spec == identity(run.desired)

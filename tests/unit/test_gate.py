"""The gate (core.deciding.gate): every action of a plan passed it, a refusal is withheld with its
reason and spends no budget; and its first confounder, the observer's own silence.

The ops box loses its path to the management network (its NIC, a switch, a VLAN, a firewall
change): every host reads silent at the same look, with no warning in any kernel log. Without
the gate, sparkd power-cycled every host after `power.unreachable_for`, while the model may have
served its clients all along (docs/decisions.md, `power_cycle`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.core.deciding import gate
from sparkd.core.deciding.planner import plan
from sparkd.core.judging.judge import Context
from sparkd.core.reading import kernel
from sparkd.core.remembering.remember import remember
from sparkd.model.cluster import ClusterSpec, PowerSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import HostError, Observed
from sparkd.model.plan import ACTION_KINDS, Action, Plan
from tests.examples import EXAMPLE_SET
from tests.support.planning import host
from tests.support.toy_run import serving

KERNEL = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"
COMMAND = ("/usr/local/bin/spark-power", "cycle", "{host}")
LIMIT = 600.0
# What the SSH client says when the ops box's own route to the hosts is gone.
NO_ROUTE = HostError(kind="unreachable", detail="connect: No route to host")


def log(name: str) -> kernel.KernelLog:
    return kernel.parse_kernel_log((KERNEL / name).read_text())


def cycles(result: Plan) -> list[str]:
    return [a.host for a in result.actions if a.kind == "power_cycle"]


def silent(
    *,
    example: str = "healthy-reasoning-only",
    samples: dict[str, str] | None = None,
    apart: float = 0.0,
    after: float = LIMIT + 5,
    logged_ago: float = 0.0,
) -> tuple[ClusterSpec, Observed, Memory, float]:
    """Every host logged its `samples` (a quiet log by default), and kept answering with them
    in its log for `logged_ago` seconds; then went silent: spark-b `apart` seconds before the
    others. `after` seconds later, the look that judges."""
    toy, memory = next(e for e in EXAMPLE_SET if e.name == example).build()
    cluster = toy.cluster.model_copy(update={"power": PowerSpec(command=COMMAND)})
    names = [h.name for h in cluster.hosts]
    logs = samples or {}
    seen = toy.observe()
    for name in names:
        seen = host(seen, name, kernel=log(logs.get(name, "xid-45.txt")))
    memory = remember(memory, seen, (), toy.now, plan(cluster, seen, memory, toy.now))
    if logged_ago:
        # The omen stays in the kernel's ring buffer: every later look reads it again.
        toy.advance(logged_ago)
        again = toy.observe()
        for name in names:
            again = host(again, name, kernel=log(logs.get(name, "xid-45.txt")))
        memory = remember(memory, again, (), toy.now, plan(cluster, again, memory, toy.now))
    # The ops box reaches nothing: no host's SSH, no Ray dashboard, no model endpoint.
    toy.probe_style = "timeout"

    def look(gone: list[str]) -> Observed:
        # Nothing read on the head: no Ray, no serve, and no endpoint or probe (both reach the
        # model through the head's SSH).
        nothing = {"ray": None, "serve": None, "endpoint": None, "probe": None}
        seen = toy.observe()
        if cluster.head.name in gone:
            seen = seen.model_copy(update=nothing)
        for name in gone:
            seen = host(seen, name, error=NO_ROUTE, kernel=None)
        return seen

    toy.advance(cluster.interval)
    if apart:
        first = look(["spark-b"])
        memory = remember(memory, first, (), toy.now, plan(cluster, first, memory, toy.now))
        toy.advance(apart)
    every = look(names)
    memory = remember(memory, every, (), toy.now, plan(cluster, every, memory, toy.now))
    toy.advance(after)
    return cluster, look(names), memory, toy.now


def test_the_observers_own_silence_is_not_power_cycled_but_blocked_for_a_human() -> None:
    cluster, seen, memory, now = silent()
    result = plan(cluster, seen, memory, now)
    assert cycles(result) == []
    assert result.phase == "blocked" and result.latch is None
    assert "not power-cycling spark-a: every host (2) of sparks went silent at once" in (
        result.reason
    )
    assert "check the ops box's own network path" in result.reason
    assert "power-cycling spark-b: " not in result.reason.replace("not power-cycling", "")
    assert sorted(a.host for a in result.withheld) == ["spark-a", "spark-b"]


def test_before_its_cap_the_hold_is_the_usual_wait() -> None:
    cluster, seen, memory, now = silent(after=LIMIT - 60)
    result = plan(cluster, seen, memory, now)
    assert cycles(result) == [] and result.phase == "unreachable"
    assert "went silent at once" not in result.reason


def test_a_refusal_spends_no_budget_and_latches_nothing() -> None:
    cluster, seen, memory, now = silent()
    result = plan(cluster, seen, memory, now)
    after = remember(memory, seen, (), now, result)
    assert after.attempts == memory.attempts and after.blocked is None
    assert result.gated == ()


def test_hosts_that_went_silent_looks_apart_stay_eligible() -> None:
    # spark-b first, spark-a five minutes later: not one loss of the observer's path.
    cluster, seen, memory, now = silent(apart=300)
    assert sorted(cycles(plan(cluster, seen, memory, now))) == ["spark-a", "spark-b"]


def test_a_wedge_omen_in_a_last_log_keeps_the_cycle_eligible() -> None:
    cluster, seen, memory, now = silent(samples={"spark-b": "nv-no-memory.txt"})
    assert "spark-b" in cycles(plan(cluster, seen, memory, now))


def test_a_stale_omen_does_not_turn_the_observers_silence_into_power_cycles() -> None:
    """spark-b logged NV_ERR_NO_MEMORY hours ago and kept answering (the line stays in its
    ring buffer); then the ops box lost its path and every host went silent at once. The omen
    is no cause of that silence: `blocked`, never a cycle (docs/decisions.md, `power_cycle`,
    `policy.omen_window`)."""
    window = 1800.0
    cluster, seen, memory, now = silent(
        samples={"spark-b": "nv-no-memory.txt"}, logged_ago=2 * window
    )
    assert cluster.policy.omen_window == window
    result = plan(cluster, seen, memory, now)
    assert cycles(result) == [], result.reason
    assert result.phase == "blocked"
    assert "check the ops box's own network path" in result.reason


def test_an_omen_seen_within_its_window_before_the_silence_keeps_the_cycle() -> None:
    cluster, seen, memory, now = silent(samples={"spark-b": "nv-no-memory.txt"}, logged_ago=600)
    assert "spark-b" in cycles(plan(cluster, seen, memory, now))


def test_one_host_silent_while_the_other_answers_stays_eligible() -> None:
    cluster, seen, memory, now = silent()
    # spark-a answers, and its ping of spark-b's data IP goes unanswered: down for it too.
    lost = {cluster.host("spark-b").data_ip: False}
    answering = host(seen, "spark-a", error=None, kernel=log("xid-45.txt"), reaches=lost)
    assert cycles(plan(cluster, answering, memory, now)) == ["spark-b"]


def test_every_action_kind_has_a_row_and_every_check_a_name() -> None:
    assert set(gate.TABLE) == set(ACTION_KINDS) == set(gate.VERBS)
    names = [named.name for row in gate.TABLE.values() for named in row]
    assert "observer_silence" in names
    docs = (Path(__file__).resolve().parents[2] / "docs" / "decisions.md").read_text()
    for name in names:
        assert f"`{name}`" in docs, name


def test_without_a_power_command_the_advice_passes_the_gate_too() -> None:
    # No power cycle to refuse: the plan would have told a human to power-cycle every host.
    cluster, seen, memory, now = silent()
    manual = cluster.model_copy(update={"power": PowerSpec()})
    result = plan(manual, seen, memory, now)
    assert result.phase == "blocked" and result.actions == ()
    assert "needs a power cycle" not in result.reason
    assert "not power-cycling spark-a: every host (2) of sparks went silent at once" in (
        result.reason
    )
    assert "host_wedged" not in result.triage
    # A real wedge (an omen in the last log) is still named as one.
    cluster, seen, memory, now = silent(samples={"spark-b": "nv-no-memory.txt"})
    manual = cluster.model_copy(update={"power": PowerSpec()})
    result = plan(manual, seen, memory, now)
    assert "spark-b wedged: needs a power cycle (last kernel log seen: NVRM" in result.reason


def _refuses(ctx: Context, action: Action) -> gate.Refusal | None:
    """Withholds the restart of a stalled load (a stand-in for a check yet to come)."""
    return gate.Refusal("held for the test") if "load stalled" in action.reason else None


def test_a_refused_restart_is_no_evidence_against_a_new_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restart the gate withholds (as it will a long prefill's) neither counts as the new
    spec failing nor spends its budget: no rollback on it."""
    row = (gate.Named("refuses_for_the_test", _refuses),)
    monkeypatch.setitem(gate.TABLE, "restart_model", row)
    run = serving()
    run.on_launch = ["stall"]
    model = run.desired.model
    extra = (*model.extra_args, "--max-num-seqs", "8")
    run.desired = run.desired.model_copy(
        update={"model": model.model_copy(update={"extra_args": extra})}
    )
    plans = [run.cycle() for _ in range(25)]
    assert all(p.rollback is None for p in plans)
    assert any("not restarting" in p.reason and "held for the test" in p.reason for p in plans)
    assert not any("load stalled" in a.reason for p in plans for a in p.actions)

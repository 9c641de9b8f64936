"""Memory is evidence too (core.deciding.gate `inherited_memory`, docs/decisions.md).

A sparkd process that starts loads memory from its state dir (a backup restored there
included), or a new HA owner adopts it from etcd: what it says was seen by another process,
maybe long ago, maybe on a clock that read earlier. The ops box's wall clock, which anchors
daemon time anew after a reboot, may read later than before (an RTC that ran ahead, and
`time-sync.target` does not wait for a sync unless `systemd-time-wait-sync` is enabled), so a
remembered stamp looks older than it is. Before this check, the first look of a new process
acted on such memory alone: a remembered failure count restarted the model before this
process sent a probe, and a remembered silence power-cycled a host this process had seen
silent for one look."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from sparkd.core.clock import bounded, restamp
from sparkd.core.deciding.planner import plan
from sparkd.core.reading import kernel
from sparkd.core.remembering.remember import remember
from sparkd.model.cluster import ClusterSpec, PowerSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import Observed
from sparkd.model.plan import Plan
from sparkd.runtime.controller import Controller
from sparkd.runtime.state import StateDir
from sparkd.shell.ssh import SshPool
from tests.support.planning import host, served
from tests.toy import Toy

KERNEL = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"
COMMAND = ("/usr/local/bin/spark-power", "cycle", "{host}")
# How far the ops box's wall clock reads later after its reboot than before it.
AHEAD = 2 * 3600.0


def restarts(result: Plan) -> list[str]:
    return [a.host for a in result.actions if a.kind == "restart_model"]


def cycles(result: Plan) -> list[str]:
    return [a.host for a in result.actions if a.kind == "power_cycle"]


def look(toy: Toy, cluster: ClusterSpec, memory: Memory) -> tuple[Observed, Plan, Memory]:
    seen = toy.observe()
    made = plan(cluster, seen, memory, toy.now)
    return seen, made, remember(memory, seen, (), toy.now, made)


def failing_at_threshold() -> tuple[Toy, ClusterSpec, Memory]:
    """A served model whose probes time out until the restart is due; the process stops before
    it runs the restart (killed, or the box rebooted). Its memory: the count at threshold, the
    last probe a failure."""
    toy = Toy.healthy()
    cluster = toy.cluster
    memory = served(toy)
    toy.probe_style = "timeout"
    for _ in range(cluster.policy.failure_threshold):
        toy.advance(cluster.probe_interval)
        _, made, memory = look(toy, cluster, memory)
    assert memory.consecutive_failures >= cluster.policy.failure_threshold
    assert restarts(made), made.reason  # the old process would have restarted it
    return toy, cluster, memory


def restarted(memory: Memory, now: float) -> Memory:
    """What the controller does with memory it loads or adopts (runtime.controller)."""
    return bounded(memory, now).evolve(observing_since=now)


def test_a_restored_failure_count_waits_for_a_probe_of_its_own() -> None:
    toy, cluster, memory = failing_at_threshold()
    toy.advance(cluster.interval)
    memory = restarted(memory, toy.now)
    # The first look of the new process: no probe is due yet (the last is recent).
    seen = toy.observe().model_copy(update={"probe": None})
    result = plan(cluster, seen, memory, toy.now)
    assert restarts(result) == [], result.reason
    assert "memory from before this sparkd began observing" in result.reason
    assert "waiting for a probe of its own" in result.reason
    assert result.phase != "blocked"
    # A refusal spends nothing.
    after = remember(memory, seen, (), toy.now, result)
    assert after.attempts == memory.attempts and after.blocked is None


def test_the_hold_ends_with_the_first_probe_of_this_process() -> None:
    toy, cluster, memory = failing_at_threshold()
    toy.advance(cluster.interval)
    memory = restarted(memory, toy.now)
    seen = toy.observe().model_copy(update={"probe": None})
    memory = remember(memory, seen, (), toy.now, plan(cluster, seen, memory, toy.now))
    # Its own probe fails too: the count stands, and the restart goes ahead.
    toy.advance(cluster.probe_interval)
    result = plan(cluster, toy.observe(), memory, toy.now)
    assert restarts(result) == [cluster.head.name], result.reason
    # And between probes, the memory of its own failed probe is enough (a backoff's expiry).
    memory = remember(memory, toy.observe(), (), toy.now, result)
    toy.advance(cluster.interval)
    later = plan(cluster, toy.observe().model_copy(update={"probe": None}), memory, toy.now)
    assert restarts(later) == [cluster.head.name], later.reason


def test_an_answer_of_its_own_ends_the_remembered_count() -> None:
    toy, cluster, memory = failing_at_threshold()
    toy.advance(cluster.interval)
    memory = restarted(memory, toy.now)
    toy.probe_style = "answer"
    toy.advance(cluster.probe_interval)
    result = plan(cluster, toy.observe(), memory, toy.now)
    assert restarts(result) == [] and result.phase == "healthy", result.reason


def test_after_an_ops_box_reboot_with_its_clock_ahead_the_count_waits_too() -> None:
    """The host's own age wins here already: the serve process reads younger than the
    remembered probe, so its count is dropped as another launch's (core.judging.evidence). The gate
    holds the restart either way."""
    toy, cluster, memory = failing_at_threshold()
    # The new boot's daemon time is the wall clock, which reads AHEAD later than it should:
    # every remembered stamp looks that much older.
    toy.advance(AHEAD)
    toy.serve_started = (toy.serve_started or 0.0) + AHEAD  # the host's own age is unchanged
    memory = restarted(memory, toy.now)
    seen = toy.observe().model_copy(update={"probe": None})
    assert restarts(plan(cluster, seen, memory, toy.now)) == []


def silent_worker() -> tuple[Toy, ClusterSpec, Memory]:
    """spark-b logged a wedge omen and went silent; spark-a answers. The process watched it
    silent for a minute, then stopped."""
    toy = Toy.healthy()
    cluster = toy.cluster.model_copy(update={"power": PowerSpec(command=COMMAND)})
    memory = served(toy)
    omen = kernel.parse_kernel_log((KERNEL / "nv-no-memory.txt").read_text())
    seen = host(toy.observe(), "spark-b", kernel=omen)
    memory = remember(memory, seen, (), toy.now, plan(cluster, seen, memory, toy.now))
    toy.unreachable("spark-b", "timeout")
    # Wedged, not merely out of SSH's reach: its Ray node is dead, the model does not answer.
    toy.probe_style = "timeout"
    ip = cluster.host("spark-b").ip
    toy.ray_nodes = [n.model_copy(update={"alive": n.ip != ip}) for n in toy.ray_nodes]
    for _ in range(2):
        toy.advance(cluster.interval)
        _, _, memory = look(toy, cluster, memory)
    assert "spark-b" in memory.unreachable_since and "spark-b" in memory.kernel_omens
    return toy, cluster, memory


def test_a_remembered_silence_is_not_cycled_on_the_first_look_after_an_ops_box_reboot() -> None:
    toy, cluster, memory = silent_worker()
    # Rebooted, the ops box reads its wall clock AHEAD late: by memory, spark-b has been silent
    # for two hours, yet this process has seen it silent once.
    toy.advance(AHEAD)
    memory = restarted(memory, toy.now)
    result = plan(cluster, toy.observe(), memory, toy.now)
    assert cycles(result) == [], result.reason
    assert "by memory from before this sparkd began observing" in result.reason
    assert result.phase != "blocked"


def test_the_silence_hold_ends_once_its_own_looks_cover_unreachable_for() -> None:
    toy, cluster, memory = silent_worker()
    toy.advance(AHEAD)
    memory = restarted(memory, toy.now)
    limit = cluster.power.unreachable_for
    results = []
    start = toy.now
    while toy.now - start < limit:
        _, made, memory = look(toy, cluster, memory)
        results.append(made)
        toy.advance(cluster.interval)
    assert not any(cycles(r) for r in results)
    assert cycles(plan(cluster, toy.observe(), memory, toy.now)) == ["spark-b"]


def test_memory_crossing_boxes_keeps_its_boundary_on_the_new_clock() -> None:
    memory = Memory(observing_since=100.0)
    assert restamp(memory, lambda at: at + 5).observing_since == 105.0
    assert bounded(memory, 50.0).observing_since == 50.0


def test_memory_with_no_boundary_is_judged_as_before() -> None:
    toy, cluster, memory = failing_at_threshold()
    toy.advance(cluster.interval)
    seen = toy.observe().model_copy(update={"probe": None})
    assert memory.observing_since is None
    assert restarts(plan(cluster, seen, memory, toy.now)) == [cluster.head.name]


def test_the_controller_marks_memory_it_loads_as_before_its_own_looks(tmp_path: Path) -> None:
    """The state dir's memory (a restored backup is one) says three probes failed; the process
    that loads it has looked at nothing: its boundary is its start, on its own daemon time."""
    toy, cluster, memory = failing_at_threshold()
    state = tmp_path / "state"
    StateDir(state).save_memory(cluster.name, memory.evolve(observing_since=None))
    ctl = Controller(
        cluster,
        cast(SshPool, None),
        StateDir(state),
        watch_events=False,
        wall_clock=lambda: toy.now + 30.0,
        monotonic=lambda: 500.0,
        boot_id="ops-boot-2",
    )
    assert ctl.memory.observing_since == ctl.clock.now()
    assert ctl.memory.last_probe is not None
    assert ctl.memory.last_probe.at < ctl.memory.observing_since

"""The power cycle of a wedged host (core.deciding.power): a named planner case where each part of
the safety rule fails in turn, and properties over generated snapshots and memories."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.judging.judge import Context
from sparkd.core.judging.load import assess
from sparkd.core.reading import kernel
from sparkd.core.remembering.remember import pause, remember
from sparkd.model.cluster import ClusterSpec, PowerSpec
from sparkd.model.memory import Attempt, Blocked, Memory
from sparkd.model.observed import (
    HOST_ERROR_KINDS,
    Fabric,
    HostError,
    HostErrorKind,
    Observed,
    RayState,
)
from sparkd.model.plan import ActionOutcome, Plan
from tests.examples import EXAMPLE_SET
from tests.support.planning import COMMON, host
from tests.toy import Toy

KERNEL = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"
COMMAND = ("/usr/local/bin/spark-power", "cycle", "{host}")
LIMIT = 600.0
SILENT_KINDS = ("unreachable", "timeout", "conn_lost")
DOWN_PORT = Fabric(
    mtu=9000, rdma_device="rocep1s0f0", port=1, port_state="DOWN", phys_state="Disabled"
)


def log(name: str) -> kernel.KernelLog:
    return kernel.parse_kernel_log((KERNEL / name).read_text())


def powered(cluster: ClusterSpec, command: tuple[str, ...] | None = COMMAND) -> ClusterSpec:
    return cluster.model_copy(update={"power": PowerSpec(command=command)})


def build(name: str) -> tuple[Toy, Memory]:
    return next(e for e in EXAMPLE_SET if e.name == name).build()


def wedged(
    example: str = "healthy-reasoning-only",
    *,
    sample: str = "nv-no-memory.txt",
    victim: str = "spark-b",
    silent: float = LIMIT + 5,
    kind: HostErrorKind = "timeout",
    command: tuple[str, ...] | None = COMMAND,
    load_seconds: float | None = None,
    serving: bool = False,
) -> tuple[ClusterSpec, Observed, Memory, float]:
    """`victim` logged `sample`, then failed every look for `silent` seconds. Wedged, unless
    `serving`: the head's Ray then lists its node DEAD and the model stops answering probes
    (a TP=2 engine with a dead rank hangs)."""
    toy, memory = build(example)
    if load_seconds is not None:
        toy.load_seconds = load_seconds
    cluster = powered(toy.cluster, command)
    seen = host(toy.observe(), victim, kernel=log(sample))
    memory = remember(memory, seen, (), toy.now, plan(cluster, seen, memory, toy.now))
    error = HostError(kind=kind, detail="no answer")
    # Silent to the ops box and, wedged, to the other hosts' pings over the data link too.
    toy.errors[victim] = error
    gone = toy.observe()
    memory = remember(memory, gone, (), toy.now, plan(cluster, gone, memory, toy.now))
    if not serving:
        toy.probe_style = "timeout"
        toy.ray_nodes = [
            n.model_copy(update={"alive": False}) if n.ip == cluster.host(victim).ip else n
            for n in toy.ray_nodes
        ]
    toy.advance(silent)
    return cluster, toy.observe(), memory, toy.now


def cycles(result: Plan) -> list[str]:
    return [a.host for a in result.actions if a.kind == "power_cycle"]


def test_a_wedged_host_silent_past_unreachable_for_is_power_cycled_naming_its_evidence() -> None:
    cluster, gone, memory, now = wedged()
    result = plan(cluster, gone, memory, now)
    assert cycles(result) == ["spark-b"]
    [action] = result.actions
    assert action.target == "spark-b"
    assert action.reason.startswith(
        "power-cycling spark-b: last kernel log seen: NVRM NV_ERR_NO_MEMORY x3 at 9312s after "
        "boot; every look failed for 10m05s (timeout: no answer), past power.unreachable_for "
        "(10m00s)"
    )
    assert result.phase == "unreachable" and result.triage == ("host_wedged",)


def test_a_quiet_host_silent_past_the_deadline_is_power_cycled_too() -> None:
    cluster, gone, memory, now = wedged(sample="xid-45.txt")
    result = plan(cluster, gone, memory, now)
    assert cycles(result) == ["spark-b"]
    assert "unreachable for 10m05s, past power.unreachable_for" in result.actions[0].reason


# -- each part of the safety rule failing in turn -----------------------------------------------


def test_without_a_power_command_the_same_evidence_only_blocks() -> None:
    cluster, gone, memory, now = wedged(command=None)
    result = plan(cluster, gone, memory, now)
    assert result.actions == () and result.phase == "blocked"
    assert "spark-b wedged: needs a power cycle (last kernel log seen: NVRM" in result.reason


def test_not_before_unreachable_for_has_passed() -> None:
    cluster, gone, memory, now = wedged(silent=LIMIT - 1)
    result = plan(cluster, gone, memory, now)
    assert cycles(result) == []
    assert result.triage == ("host_wedged",) and result.phase == "unreachable"
    assert "power-cycling it once it has been unreachable for power.unreachable_for" in (
        result.reason
    )


def test_not_when_the_triage_does_not_say_wedged() -> None:
    # Quiet log and not yet past the deadline: only unreachable.
    cluster, gone, memory, now = wedged(sample="xid-45.txt", silent=LIMIT - 1)
    result = plan(cluster, gone, memory, now)
    assert cycles(result) == [] and result.triage == ()
    # Omens and long past the deadline, but the host answers SSH (a refused key, a changed
    # host key): it is up, and the fault is in sparkd's access to it.
    for kind in ("auth", "host_key", "exit_nonzero", "refused"):
        cluster, gone, memory, now = wedged(kind=kind, silent=3 * LIMIT)
        result = plan(cluster, gone, memory, now)
        assert cycles(result) == [] and "wedged" not in result.reason, kind
        # Past `policy.hold_cap` the hold ends: `blocked` with what to check.
        assert result.phase == "blocked" and result.triage == ()
        assert "policy.hold_cap" in result.reason, result.reason


def test_not_while_a_load_progresses_on_a_sound_fabric() -> None:
    # A 30-minute load (within load_timeout), 10 minutes in when the worker went silent.
    cluster, gone, memory, now = wedged("loading-40pct", silent=LIMIT + 1, load_seconds=1800)
    result = plan(cluster, gone, memory, now)
    assert cycles(result) == []
    assert "not power-cycling it while a load of sparks progresses on a sound fabric" in (
        result.reason
    )
    # The same load over a faulty fabric hangs anyway: the power cycle goes ahead.
    faulty = host(gone, "spark-a", fabric=DOWN_PORT)
    assert cycles(plan(cluster, faulty, memory, now)) == ["spark-b"]


def test_not_when_ssh_is_refused_the_host_kernel_answers() -> None:
    # sshd killed: the kernel resets the connection, the host is up.
    cluster, gone, memory, now = wedged(kind="refused", silent=3 * LIMIT)
    result = plan(cluster, gone, memory, now)
    assert cycles(result) == [] and result.triage == ()
    assert "wedged" not in result.reason


def test_the_wait_counts_silence_only_not_the_answers_before_it() -> None:
    # spark-b refused the key for three times the wait (a host answering), then went silent:
    # it has been silent for one look, not for the whole outage.
    cluster, refused, memory, now = wedged(kind="auth", silent=3 * LIMIT)
    assert "spark-b" not in memory.unreachable_since
    error = HostError(kind="timeout", detail="no answer")
    silent = host(refused, "spark-b", error=error, kernel=None)
    memory = remember(memory, silent, (), now, plan(cluster, silent, memory, now))
    result = plan(cluster, silent, memory, now)
    assert cycles(result) == []
    assert memory.unreachable_since["spark-b"] == silent.observed_at


def test_not_while_the_model_answers_probes_taken_during_the_silence() -> None:
    # A firewall on port 22 of spark-b: Ray and the TP=2 model keep serving.
    cluster, gone, memory, now = wedged(silent=LIMIT + 5, serving=True)
    dead_ray = _ray_lists(gone, cluster.host("spark-b").ip, alive=False)
    result = plan(cluster, dead_ray, memory, now)
    assert cycles(result) == []
    assert "spark-b wedged: needs a power cycle" in result.reason
    assert "not power-cycling it: the model answered a probe 0.00s ago (reasoning_only)" in (
        result.reason
    )
    # Busy (the probe timed out while vLLM did other work) is answering too.
    probe = dead_ray.probe
    assert probe is not None
    verdict = probe.verdict.model_copy(update={"outcome": "timeout", "healthy": False})
    busy = probe.model_copy(update={"verdict": verdict, "tokens_advanced": True})
    result = plan(cluster, dead_ray.model_copy(update={"probe": busy}), memory, now)
    assert cycles(result) == [] and "the model answered a probe 0.00s ago (busy)" in result.reason
    # An output fault (the answer left in `reasoning`) is the engine generating on both ranks.
    faulted = probe.verdict.model_copy(update={"outcome": "no_answer", "healthy": False})
    result = plan(cluster, dead_ray.model_copy(update={"probe": probe.model_copy(
        update={"verdict": faulted})}), memory, now)  # fmt: skip
    assert cycles(result) == [] and "answered a probe 0.00s ago (no_answer)" in result.reason
    # A healthy probe from before the silence says nothing of the host now.
    since = memory.unreachable_since["spark-b"]
    stale = probe.model_copy(update={"at": since - 1})
    result = plan(cluster, dead_ray.model_copy(update={"probe": stale}), memory, now)
    assert cycles(result) == ["spark-b"]


def test_not_while_the_heads_ray_lists_the_node_alive() -> None:
    cluster, gone, memory, now = wedged(silent=LIMIT + 5)
    assert cycles(plan(cluster, gone, memory, now)) == ["spark-b"]
    alive = _ray_lists(gone, cluster.host("spark-b").ip, alive=True)
    result = plan(cluster, alive, memory, now)
    assert cycles(result) == []
    ip = cluster.host("spark-b").ip
    assert f"not power-cycling it: the head's Ray lists its node ({ip}) ALIVE" in result.reason
    # Ray not answering says nothing either way.
    down = gone.model_copy(update={"ray": RayState(error="no Ray cluster is running")})
    assert cycles(plan(cluster, down, memory, now)) == ["spark-b"]


def _ray_lists(seen: Observed, ip: str, *, alive: bool) -> Observed:
    assert seen.ray is not None
    nodes = tuple(
        n.model_copy(update={"alive": alive}) if n.ip == ip else n for n in seen.ray.nodes
    )
    return seen.model_copy(update={"ray": seen.ray.model_copy(update={"nodes": nodes})})


def test_at_most_once_per_host_per_incident_then_blocked() -> None:
    cluster, gone, memory, now = wedged()
    key = "power_cycle:spark-b:spark-b"
    done = memory.evolve(attempts=(*memory.attempts, Attempt(key=key, at=now - 30, ok=True)))
    booting = plan(cluster, gone, done, now)
    assert cycles(booting) == [] and booting.phase == "unreachable"
    assert "power-cycled 30s ago, waiting up to power.unreachable_for (10m00s)" in booting.reason
    late = plan(cluster, gone, done, now + LIMIT)
    assert cycles(late) == [] and late.phase == "blocked"
    assert "still unreachable 10m30s after its power cycle" in late.reason
    failed = memory.evolve(attempts=(*memory.attempts, Attempt(key=key, at=now - 30, ok=False)))
    result = plan(cluster, gone, failed, now)
    assert cycles(result) == [] and result.phase == "blocked"
    assert "its power cycle 30s ago did not succeed" in result.reason
    # A new incident (health lasted since) may power-cycle again.
    forgiven = done.evolve(backoff_reset_at=now - 10)
    assert cycles(plan(cluster, gone, forgiven, now)) == ["spark-b"]


def test_never_while_paused_or_in_a_maintenance_window() -> None:
    cluster, gone, memory, now = wedged()
    # A maintenance window reaches the planner as a pause (Controller._effective).
    paused = pause(memory, reason="PDU firmware", by="maintenance window", now=now, until=None)
    result = plan(cluster, gone, paused, now)
    assert result.phase == "paused" and result.actions == ()
    assert [a.kind for a in result.withheld] == ["power_cycle"]


def test_never_with_dry_run() -> None:
    cluster, gone, memory, now = wedged()
    result = plan(cluster, gone, memory, now, dry_run=True)
    assert result.actions == () and [a.kind for a in result.withheld] == ["power_cycle"]


def test_never_while_latched_blocked() -> None:
    cluster, gone, memory, now = wedged()
    latched = memory.evolve(blocked=Blocked(reason="budget spent", since=now - 5))
    assert plan(cluster, gone, latched, now).actions == ()


def test_a_command_must_name_the_host_by_an_absolute_program() -> None:
    for bad in ((), ("/usr/bin/pdu", "cycle"), ("pdu", "cycle", "{host}")):
        with pytest.raises(ValueError):
            PowerSpec(command=bad)
    assert PowerSpec().enabled is False


# -- properties --------------------------------------------------------------------------------


@st.composite
def wedges(draw: st.DrawFn) -> tuple[ClusterSpec, Observed, Memory, float, bool]:
    example = draw(
        st.sampled_from(
            ["healthy-reasoning-only", "loading-40pct", "load-stalled", "three-failed-probes"]
        )
    )
    victim = draw(st.sampled_from(["spark-a", "spark-b"]))
    cluster, gone, memory, now = wedged(
        example,
        victim=victim,
        sample=draw(st.sampled_from(["nv-no-memory.txt", "aer-fatal.txt", "xid-45.txt"])),
        # Weighted towards the rule holding, so that most cases test a power cycle's presence.
        kind=draw(st.sampled_from([*HOST_ERROR_KINDS, *SILENT_KINDS, *SILENT_KINDS])),
        silent=draw(st.floats(0, 3 * LIMIT)),
        command=draw(st.sampled_from([COMMAND, COMMAND, COMMAND, None])),
        load_seconds=draw(st.sampled_from([900.0, 1800.0, 3000.0])),
        serving=draw(st.sampled_from([False, False, True])),
    )
    # The head's Ray may say otherwise than the probe: a node listed ALIVE, or DEAD.
    ray_alive = draw(st.sampled_from([None, None, True, False]))
    if ray_alive is not None and gone.ray is not None and gone.ray.up:
        gone = _ray_lists(gone, cluster.host(victim).ip, alive=ray_alive)
    if draw(st.sampled_from([False, False, True])):
        other = "spark-a" if victim == "spark-b" else "spark-b"
        gone = host(gone, other, fabric=DOWN_PORT)
    tried = draw(st.sampled_from([None, None, None, True, False]))
    if tried is not None:
        at = now - draw(st.floats(0, 2 * LIMIT))
        attempt = Attempt(key=f"power_cycle:{victim}:{victim}", at=at, ok=tried)
        memory = memory.evolve(attempts=(*memory.attempts, attempt))
        if draw(st.booleans()):
            memory = memory.evolve(backoff_reset_at=at + draw(st.floats(-60, 60)))
    if draw(st.sampled_from([False, False, False, True])):
        memory = pause(memory, reason="window", by="maintenance window", now=now, until=None)
    return cluster, gone, memory, now, draw(st.sampled_from([False, False, False, True]))


def rule_holds(cluster: ClusterSpec, seen: Observed, memory: Memory, now: float, name: str) -> bool:
    """The safety rule, read off the inputs (core.deciding.power's docstring)."""
    facts = seen.host(name)
    assert facts is not None
    error = facts.error
    since = memory.unreachable_since.get(name)
    silent = since is not None and now - since >= cluster.power.unreachable_for
    wedged = error is not None and error.kind in SILENT_KINDS
    ctx = Context.of(cluster, seen, memory, now)
    endpoint = seen.endpoint
    serving = endpoint is not None and endpoint.serves(ctx.model_name) and ctx.head_reachable
    load = assess(ctx, serving)
    sound = all(h.fabric is None or h.fabric.port_state in (None, "ACTIVE") for h in seen.hosts)
    loading = sound and load.progressing(cluster.model.load_stall, cluster.model.load_timeout)
    key = f"power_cycle:{name}:{name}"
    tried = any(a.key == key and a.at >= memory.backoff_reset_at for a in memory.attempts)
    paused = memory.paused is not None and memory.paused.active(now)
    probe = seen.probe or memory.last_probe
    answered = (
        probe is not None
        and since is not None
        and probe.at >= since
        and (probe.verdict.healthy is True or probe.busy)
    )
    node = cluster.host(name).ip
    ray_alive = seen.ray is not None and seen.ray.error is None and node in seen.ray.alive_ips
    return (
        cluster.power.command is not None
        and silent
        and wedged
        and not loading
        and not answered
        and not ray_alive
        and not tried
        and not paused
        and memory.blocked is None
    )


@COMMON
@given(wedges())
def test_a_power_cycle_only_ever_when_every_condition_holds(
    case: tuple[ClusterSpec, Observed, Memory, float, bool],
) -> None:
    cluster, seen, memory, now, dry_run = case
    result = plan(cluster, seen, memory, now, dry_run=dry_run)
    powered_hosts = cycles(result)
    assert len(powered_hosts) == len(set(powered_hosts))
    assert not (dry_run and powered_hosts)
    for name in powered_hosts:
        assert rule_holds(cluster, seen, memory, now, name)


@COMMON
@given(
    st.sampled_from(["nv-no-memory.txt", "xid-45.txt"]), st.lists(st.floats(1, 120), max_size=40)
)
def test_at_most_one_power_cycle_per_host_per_incident(sample: str, steps: list[float]) -> None:
    """However long a host stays silent, cycle after cycle, it is power-cycled once."""
    cluster, gone, memory, now = wedged(sample=sample, silent=0)
    ran = 0
    for step in steps:
        now += step
        seen = gone.model_copy(update={"observed_at": now})
        result = plan(cluster, seen, memory, now)
        outcomes = [
            ActionOutcome(action=a, result="ok", started_at=now, finished_at=now + 1)
            for a in result.actions
        ]
        ran += sum(o.action.kind == "power_cycle" for o in outcomes)
        memory = remember(memory, seen, outcomes, now + 1, result)
    assert ran <= 1
    if sum(steps) >= LIMIT:
        assert ran == 1


def test_a_silent_host_whose_node_still_works_ends_blocked_naming_its_ssh() -> None:
    """Not cycled while its Ray node is ALIVE or the model answers (SSH alone fails), and not
    left `unreachable` for ever either: past the cap, `blocked` naming what to check."""
    cluster, gone, memory, now = wedged(silent=LIMIT + 5)
    alive = _ray_lists(gone, cluster.host("spark-b").ip, alive=True)
    for later in (now, now + 24 * 3600):
        result = plan(cluster, alive, memory, later)
        assert cycles(result) == [] and result.phase == "blocked" and result.latch is None
        assert "check sshd, port 22 and the path from the ops box to spark-b" in result.reason
    # Before the cap it is the usual wait.
    cluster, gone, memory, now = wedged(silent=LIMIT - 5)
    alive = _ray_lists(gone, cluster.host("spark-b").ip, alive=True)
    assert plan(cluster, alive, memory, now).phase == "unreachable"


def test_only_the_head_silent_while_the_worker_still_reaches_it_is_not_cycled() -> None:
    """The ops box lost only its path to the head (its SSH silent, so no probe and no Ray
    reading either), while the worker still pings the head's data IP: the head's kernel
    answers. `blocked` with the ops box's path to check, never a power cycle (core.deciding.gate
    `peer_view`, docs/decisions.md `power_cycle`)."""
    cluster, gone, memory, now = wedged(victim="spark-a", sample="xid-45.txt", silent=3 * LIMIT)
    # The last probe answered a look before the head went silent (read through the head).
    since = memory.unreachable_since["spark-a"]
    last = memory.last_probe
    assert last is not None
    memory = memory.evolve(last_probe=last.model_copy(update={"at": since - cluster.interval}))
    head_ip = cluster.host("spark-a").data_ip
    reached = host(gone, "spark-b", reaches={head_ip: True})
    result = plan(cluster, reached, memory, now)
    assert cycles(result) == [], result.reason
    assert result.phase == "blocked" and result.latch is None
    assert "spark-b still reaches its data IP" in result.reason
    assert "check the ops box's path to spark-a" in result.reason
    # No view at all (the worker's ping unread): unknown, not proof of a wedge.
    unread = host(gone, "spark-b", reaches={})
    result = plan(cluster, unread, memory, now)
    assert cycles(result) == [] and result.phase == "blocked", result.reason
    assert "nothing says it is down for them" in result.reason
    # The worker's ping gets no reply either: down for the cluster, cycled.
    lost = host(gone, "spark-b", reaches={head_ip: False})
    assert cycles(plan(cluster, lost, memory, now)) == ["spark-a"]

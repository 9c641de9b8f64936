"""The gate (core.deciding.gate, docs/decisions.md) over generated situations: every action of a
plan passed it; a power cycle only when the table says its cause is established, with the observer's
own silence generated beside real wedges, and memory from before this process (loaded, restored,
adopted, across an ops box reboot) generated beside what it looks at; and every hold the gate makes
ends."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.clock import bounded, restamp
from sparkd.core.deciding.planner import plan
from sparkd.core.reading import kernel
from sparkd.core.remembering.handover import from_ages, to_ages
from sparkd.core.remembering.remember import remember
from sparkd.model.cluster import ClusterSpec, PowerSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import HostError, Observed
from sparkd.model.probe import ProbeResult, ProbeVerdict
from tests.support.planning import BASES, COMMON, cluster_of, host, served, situations
from tests.toy import Toy

KERNEL = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"
COMMAND = ("/usr/local/bin/spark-power", "cycle", "{host}")
LIMIT = 600.0
OMEN = "nv-no-memory.txt"
QUIET = "xid-45.txt"
SILENCES = ("unreachable", "timeout", "conn_lost")


@dataclass(frozen=True)
class Scene:
    cluster: ClusterSpec
    seen: Observed
    memory: Memory
    now: float
    # What was generated, read by the properties instead of the code under test.
    silent: frozenset[str]
    omens: frozenset[str]
    # Per silent host, when it went silent (daemon time).
    since: dict[str, float]
    # When the omens were logged (daemon time): an omen long before the silence is stale.
    logged: float = 0.0
    # Whether the answering hosts' pings over the data link still reach the silent ones (only
    # the ops box lost its path to them), or get no reply (down for the cluster too).
    peers_see: bool = False

    @property
    def observer_silence(self) -> bool:
        """The confounder as docs/decisions.md states it: every host silent, within one look
        of each other, no wedge omen in any last kernel log."""
        every = self.silent == {h.name for h in self.cluster.hosts}
        stamps = list(self.since.values())
        together = every and max(stamps) - min(stamps) <= self.cluster.interval
        window = self.cluster.policy.omen_window
        fresh = {h for h in self.omens if h in self.since and self.since[h] - self.logged <= window}
        return together and not fresh


@st.composite
def scenes(draw: st.DrawFn) -> Scene:
    """An example situation (or a healthy cluster of 1-4 hosts) with `power.command` set, whose
    hosts' last kernel logs held a wedge omen or not; then some hosts, or all of them, go
    silent, at the same look or looks apart; then a look some time later."""
    if draw(st.booleans()):
        toy, memory = draw(st.sampled_from(BASES)).build()
    else:
        toy = Toy.healthy(cluster_of(draw(st.integers(1, 4))))
        memory = served(toy)
    cluster = toy.cluster.model_copy(update={"power": PowerSpec(command=COMMAND)})
    names = [h.name for h in cluster.hosts]
    omens = draw(st.sampled_from([frozenset(), frozenset(), draw(st.sets(st.sampled_from(names)))]))
    everyone = frozenset(names)
    silent = draw(
        st.sampled_from([everyone, everyone, frozenset(draw(st.sets(st.sampled_from(names))))])
    )
    if not silent:
        silent = everyone
    spread = [0.0, 0.0, 0.0, cluster.interval / 2, cluster.interval * 2, 300.0]
    offsets = {name: draw(st.sampled_from(spread)) for name in sorted(silent)}
    kind = draw(st.sampled_from(SILENCES))
    peers_see = draw(st.booleans())
    seen = toy.observe()
    for name in names:
        text = (KERNEL / (OMEN if name in omens else QUIET)).read_text()
        seen = host(seen, name, kernel=kernel.parse_kernel_log(text))
    memory = remember(memory, seen, (), toy.now, plan(cluster, seen, memory, toy.now))
    logged = toy.now
    # The hosts keep answering, the omens still in their logs, for a while: a stale omen.
    stale = draw(st.sampled_from([0.0, 0.0, 0.0, 2 * cluster.policy.omen_window]))
    if stale:
        toy.advance(stale)
        again = toy.observe()
        for name in names:
            text = (KERNEL / (OMEN if name in omens else QUIET)).read_text()
            again = host(again, name, kernel=kernel.parse_kernel_log(text))
        memory = remember(memory, again, (), toy.now, plan(cluster, again, memory, toy.now))
    start = toy.now + cluster.interval
    error = HostError(kind=kind, detail="no answer")

    def look(gone: set[str]) -> Observed:
        head = cluster.head.name in gone
        toy.probe_style = "timeout" if head or len(gone) > 0 else toy.probe_style
        out = toy.observe()
        if head:
            # What the shell observes of a silent head: nothing read on it, and no endpoint or
            # probe either (both reach the model through the head's SSH).
            nothing = {"ray": None, "serve": None, "endpoint": None, "probe": None}
            out = out.model_copy(update=nothing)
        for name in gone:
            out = host(out, name, error=error, kernel=None)
        views = {cluster.host(name).data_ip: peers_see for name in gone}
        for name in set(names) - gone:
            out = host(out, name, reaches=views)
        return out

    since: dict[str, float] = {}
    gone: set[str] = set()
    for offset in sorted(set(offsets.values())):
        toy.advance(start + offset - toy.now)
        gone |= {n for n, o in offsets.items() if o == offset}
        for name in gone:
            since.setdefault(name, toy.now)
        step = look(gone)
        memory = remember(memory, step, (), toy.now, plan(cluster, step, memory, toy.now))
    toy.advance(draw(st.floats(0, 3 * LIMIT)))
    return Scene(
        cluster,
        look(gone),
        memory,
        toy.now,
        frozenset(silent),
        frozenset(omens),
        since,
        logged,
        peers_see,
    )


@COMMON
@given(situations())
def test_every_action_of_a_plan_passed_the_gate(situation: tuple[Toy, Memory, float]) -> None:
    toy, memory, now = situation
    result = plan(toy.cluster, toy.observe(), memory, now)
    assert {a.key for a in result.actions} <= set(result.gated)


@COMMON
@given(scenes())
def test_a_power_cycle_only_when_its_cause_is_established(scene: Scene) -> None:
    result = plan(scene.cluster, scene.seen, scene.memory, scene.now)
    assert {a.key for a in result.actions} <= set(result.gated)
    cycled = [a.host for a in result.actions if a.kind == "power_cycle"]
    if cycled:
        # Established: another host answers, a last log held an omen, or the hosts went
        # silent looks apart.
        assert not scene.observer_silence, (cycled, result.reason)
        assert set(cycled) <= scene.silent
        # Another host answers: it must not still reach the cycled one (`peer_view`).
        if scene.silent != {h.name for h in scene.cluster.hosts}:
            assert not scene.peers_see, (cycled, result.reason)


@COMMON
@given(scenes())
def test_the_observers_silence_ends_blocked_with_what_to_check(scene: Scene) -> None:
    """The hold the gate makes has an end on daemon time: however long the silence lasted so
    far, once `power.unreachable_for` has passed with nothing changed the plan is `blocked`
    naming what a human should check (or it was already paused or latched by a human)."""
    if not scene.observer_silence:
        return
    capped = max(scene.now, max(scene.since.values()) + LIMIT)
    for now in (scene.now, capped):
        result = plan(scene.cluster, scene.seen, scene.memory, now)
        assert not any(a.kind == "power_cycle" for a in result.actions)
    if scene.memory.paused is not None or scene.memory.blocked is not None:
        assert result.phase in ("paused", "blocked")
        return
    assert result.phase == "blocked", result.reason
    assert "check the ops box's own network path" in result.reason


# How memory from before this process reaches it (runtime.controller): its own state dir (a
# restored backup is one), etcd (a new owner adopts it, stamps carried as ages), or the state
# dir after a reboot of the ops box whose wall clock reads later than before (every stamp then
# looks older by the difference).
ORIGINS = ("state dir", "etcd", "clock ahead")


def inherit(memory: Memory, now: float, origin: str, ahead: float) -> Memory:
    """`memory` as the new process holds it: through its origin, bounded, with its boundary."""
    if origin == "etcd":
        memory = from_ages(to_ages(memory, now), now)
    elif origin == "clock ahead":
        memory = restamp(memory, lambda at: at - ahead)
    return bounded(memory, now).evolve(observing_since=now)


@st.composite
def inherited(draw: st.DrawFn) -> tuple[ClusterSpec, Observed, Memory, float]:
    """An example situation whose memory, maybe, holds a failure count at or past the threshold
    with a failed last probe, reaching a new process; its first look has no probe (none due)."""
    toy, memory, now = draw(situations())
    cluster = toy.cluster
    if draw(st.booleans()):
        at = now - draw(st.floats(1.0, 3600.0))
        failed = ProbeResult(
            at=at,
            verdict=ProbeVerdict(
                outcome=draw(st.sampled_from(["timeout", "aborted"])), healthy=False
            ),
            latency_seconds=cluster.probe.timeout,
        )
        threshold = cluster.policy.failure_threshold
        memory = memory.evolve(
            consecutive_failures=draw(st.integers(threshold, threshold + 3)),
            last_probe=failed,
            last_probe_at=at,
        )
    origin = draw(st.sampled_from(ORIGINS))
    memory = inherit(memory, now, origin, draw(st.floats(60.0, 86400.0)))
    seen = toy.observe().model_copy(update={"probe": None})
    return cluster, seen, memory, now


@COMMON
@given(inherited())
def test_memory_alone_restarts_no_model(case: tuple[ClusterSpec, Observed, Memory, float]) -> None:
    """No probe of this process failed: a restart on the probe's count would rest on memory
    alone (docs/decisions.md, `restart_model`, `inherited_memory`)."""
    cluster, seen, memory, now = case
    result = plan(cluster, seen, memory, now)
    assert {a.key for a in result.actions} <= set(result.gated)
    counted = [
        a for a in result.actions if a.kind == "restart_model" and "failed probes" in a.reason
    ]
    assert counted == [], result.reason
    assert not any(a.kind == "power_cycle" for a in result.actions), result.reason


@COMMON
@given(scenes(), st.floats(0.0, 2.0), st.sampled_from(ORIGINS))
def test_a_remembered_silence_is_cycled_only_on_its_own_looks(
    scene: Scene, share: float, origin: str
) -> None:
    """The process began observing `share` of `power.unreachable_for` ago: a host silent since
    before that is cycled only once its own looks cover `power.unreachable_for`, and that hold
    ends there."""
    begun = scene.now - share * LIMIT
    memory = inherit(scene.memory, begun, origin, 3600.0)
    result = plan(scene.cluster, scene.seen, memory, scene.now)
    for action in result.actions:
        if action.kind != "power_cycle":
            continue
        since = memory.unreachable_since.get(action.host, scene.now)
        assert since >= begun or scene.now - begun >= LIMIT, result.reason
    later = plan(scene.cluster, scene.seen, memory, max(scene.now, begun + LIMIT))
    assert "by memory from before this sparkd began observing" not in later.reason

"""Every hold ends (docs/decisions.md): a plan that waits (no action, a phase that says sparkd
is waiting for something) ends on daemon time, with nothing observed changing, in an action
(the remedy after a cap) or a phase that no longer waits (`blocked` with what a human should
check, or the model judged). Generated over the example set, over the silences of
tests/unit/test_invariants_gate.py (the observer's own, single hosts, wedges, a path lost to
one host), and over hosts that answer with what only a human changes (an SSH refusal, an NVML
mismatch: tests/unit/test_holds_capped.py)."""

from __future__ import annotations

from hypothesis import given

from sparkd.core.deciding.planner import plan
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import Observed
from sparkd.model.plan import Phase
from tests.support.planning import COMMON, situations
from tests.toy import Toy
from tests.unit.test_holds_capped import ANSWERS, answered
from tests.unit.test_invariants_gate import Scene, scenes

# The phases in which sparkd holds back, waiting for something to happen.
WAITS: frozenset[Phase] = frozenset(
    {"unreachable", "cleaning", "starting_ray", "starting_model", "loading", "probing"}
)
# Longer than every cap the shipped settings have (load_timeout 1 h, the largest).
LATER = 4 * 3600.0


def ends(cluster: ClusterSpec, seen: Observed, memory: Memory, now: float) -> None:
    first = plan(cluster, seen, memory, now)
    if first.actions or first.phase not in WAITS:
        return
    later = plan(cluster, seen, memory, now + LATER)
    assert later.actions or later.phase not in WAITS, (first.reason, later.reason)
    if later.phase == "blocked" and not later.actions:
        assert later.reason, "blocked says why"


@COMMON
@given(situations())
def test_every_wait_over_the_examples_ends(situation: tuple[Toy, Memory, float]) -> None:
    toy, memory, now = situation
    ends(toy.cluster, toy.observe(), memory, now)


@COMMON
@given(scenes())
def test_every_wait_over_generated_silences_ends(scene: Scene) -> None:
    ends(scene.cluster, scene.seen, scene.memory, scene.now)


@COMMON
@given(answered(sorted(ANSWERS)))
def test_every_wait_on_a_host_that_answers_what_only_a_human_changes_ends(
    case: tuple[ClusterSpec, Observed, Memory, float],
) -> None:
    ends(*case)

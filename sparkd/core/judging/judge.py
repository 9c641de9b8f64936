"""What every planner stage shares: the cycle's context, a stage's verdict, and holds.

A stage (cleanup, images, Ray, model, probe) always runs and says what it sees. A condition that
makes some actions unsafe does not end the judgement: it becomes a `Hold` that vetoes only the
actions needing what it makes unsafe, so a hung model is still restarted while a worker's SSH
fails, and no model is started on a Ray that lacks its GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import HostError, HostFacts, Observed
from sparkd.model.plan import Action, ActionKind, Phase, TriageClass
from sparkd.model.spec import HostSpec


@dataclass(frozen=True)
class Hold:
    """A condition that makes some actions unsafe: they wait, and spend no budget."""

    reason: str
    kinds: frozenset[ActionKind]
    # The hosts whose actions it holds; None holds them on every host.
    hosts: frozenset[str] | None = None

    def vetoes(self, action: Action) -> bool:
        return action.kind in self.kinds and (self.hosts is None or action.host in self.hosts)


@dataclass
class Verdict:
    """What one stage concluded: the phase it would name, why, what to do, what to hold."""

    phase: Phase | None = None
    notes: list[str] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    # The failure classes below vLLM this stage recognised (core.judging.triage.TABLE).
    triage: list[TriageClass] = field(default_factory=list)


@dataclass(frozen=True)
class Context:
    desired: ClusterSpec
    observed: Observed
    memory: Memory
    now: float
    facts: dict[str, HostFacts]

    @classmethod
    def of(cls, desired: ClusterSpec, observed: Observed, memory: Memory, now: float) -> Context:
        facts = {h.name: _facts(observed, h) for h in desired.hosts}
        return cls(desired, observed, memory, now, facts)

    @property
    def reachable(self) -> list[HostSpec]:
        return [h for h in self.desired.hosts if self.facts[h.name].reachable]

    @property
    def unreachable(self) -> list[HostSpec]:
        return [h for h in self.desired.hosts if not self.facts[h.name].reachable]

    @property
    def head_reachable(self) -> bool:
        return self.facts[self.desired.head.name].reachable

    @property
    def model_name(self) -> str:
        """The name the server lists in /v1/models and answers to."""
        return self.desired.model.served_name


def _facts(observed: Observed, host: HostSpec) -> HostFacts:
    found = observed.host(host.name)
    if found is not None:
        return found
    return HostFacts(name=host.name, error=HostError(kind="timeout", detail="not observed"))


def act(kind: ActionKind, host: str, target: str, reason: str, subject: str = "") -> Action:
    return Action(kind=kind, host=host, target=target, reason=reason, subject=subject)


def ago(seconds: float) -> str:
    """A length of time already run (`1m05s`): since something happened, or how long it has
    lasted. A time still ahead is `from_now`'s."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 1 else f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def from_now(seconds: float) -> str:
    """How far ahead something is due (`1m05s from now`); one already due is `0.00s from now`."""
    return f"{ago(seconds)} from now"

"""Plans: a phase, a one-line human reason, and ordered actions that each explain themselves."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field

from sparkd.model.base import BoundedText, Value
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Adopted, LoadMark, TokenMark

Phase = Literal[
    "paused",
    "blocked",
    "unreachable",
    "cleaning",
    "starting_ray",
    "starting_model",
    "loading",
    "probing",
    "healthy",
    "degraded",
]
PHASES: tuple[Phase, ...] = get_args(Phase)

# The failure classes below vLLM the planner recognised (core.judging.triage.TABLE).
TriageClass = Literal["gpu_lost", "host_wedged", "memory_pressure", "fabric"]
TRIAGE_CLASSES: tuple[TriageClass, ...] = get_args(TriageClass)

ActionKind = Literal[
    "stop_unit",
    "remove_container",
    "start_ray_head",
    "start_ray_worker",
    "restart_ray",
    "start_model",
    "restart_model",
    "kill_gpu_process",
    "power_cycle",
    "prune_cache",
]
ACTION_KINDS: tuple[ActionKind, ...] = get_args(ActionKind)
# The kinds that (re)start a Ray node, and those that launch the model: named once, imported.
RAY_STARTS: frozenset[ActionKind] = frozenset({"start_ray_head", "start_ray_worker", "restart_ray"})
MODEL_STARTS: frozenset[ActionKind] = frozenset({"start_model", "restart_model"})
# The kinds that stop a running deployment: a rollout's first stop of the old one is one of them.
STOPS: frozenset[ActionKind] = MODEL_STARTS | {"restart_ray"}
START_MODEL: frozenset[ActionKind] = frozenset({"start_model"})
# What a hold on a host vetoes: every kind but the power cycle and the cache pruning.
EVERYTHING: frozenset[ActionKind] = frozenset(
    {"stop_unit", "remove_container", "kill_gpu_process", *RAY_STARTS, *MODEL_STARTS}
)


class Action(Value):
    kind: ActionKind
    host: str
    # What the action is about: a unit, a container, a PID, or the model id.
    target: str
    reason: BoundedText
    # What budget and backoff count this action against when the target is fleeting: a
    # respawning foreign process gets a new PID each time but stays the same fight.
    subject: str = ""

    @property
    def key(self) -> str:
        """Budget and backoff are kept per (kind, host, subject or target)."""
        return f"{self.kind}:{self.host}:{self.subject or self.target}"

    def public(self) -> dict[str, str]:
        return {"kind": self.kind, "host": self.host, "target": self.target, "reason": self.reason}


class Learned(Value):
    """What a look taught, as the planner judged it: the one input of memory's transition
    (core.remembering.remember) besides the snapshot and the actions' outcomes. Kept whatever
    becomes of the plan's actions (paused, latched, withheld)."""

    # The model answers; health has lasted long enough to forget earlier remediations' backoff.
    model_ready: bool = False
    reset_backoff: bool = False
    ray_unsettled: bool = False
    # Ray has every node, each first seen after its container started: its node ids may be
    # recorded as the model's launch nodes.
    ray_ready: bool = False
    # Where the load stands, for remember() to keep when it advanced.
    load_mark: LoadMark | None = None
    # How the planner counted this cycle's new probe (consecutive failures, busy streak).
    probe_failures: int | None = None
    busy_streak: int | None = None
    unknown_streak: int | None = None
    # The model serves as it should (healthy, or degraded by no fault of its own: busy, a dead
    # data link, Ray unread): lasting, it ends an incident and forgives its attempts.
    serving_well: bool = False
    # A fabric fault held Ray and model (re)starts in this judgement, for remember().
    fabric_held: bool = False
    # The latest launch failed vLLM's free-memory check while another process held GPU memory:
    # for remember(), so the next start of the same spec is a retry, not the spec's failure.
    memory_held: bool = False
    # The token counter's reading, for remember() to keep while the model serves.
    token_mark: TokenMark | None = None
    # First contact adopted a deployment made by hand (core.judging.adopt): remember() keeps it, as
    # if sparkd had launched it; `adoption_over`: every adopted container is gone.
    adopted: Adopted | None = None
    adoption_over: bool = False
    # First contact waits to adopt a matching deployment (remember() keeps since when).
    adopting: bool = False


class Plan(Value):
    cluster: str
    phase: Phase
    reason: BoundedText
    actions: tuple[Action, ...] = ()
    # What would have run but for pause, dry-run or backoff: shown, never executed.
    withheld: tuple[Action, ...] = ()
    # Set when this plan latches the cluster `blocked` (budget spent); remember() persists it.
    latch: str | None = None
    # The earliest daemon time this decision can change with nothing observed changing (a backoff
    # or pause ending, a join or load deadline, a probe due): a recheck goes no later.
    recheck_at: float | None = None
    triage: tuple[TriageClass, ...] = ()
    # Set when this plan starts a rollback to the last-good spec: why the new spec failed.
    rollback: str | None = None
    # The keys of the actions that passed the gate (core.deciding.gate) in this plan: every action
    # a plan holds went through it.
    gated: tuple[str, ...] = ()
    # What the look taught, for remember(), whatever becomes of the actions.
    learned: Learned = Learned()
    # The spec this plan's actions launch, chosen once by the planner: the last-good one when
    # the plan rolls back or a rollback holds, else the desired one (core.deciding.rollout
    # `acting_spec`). None on a plan made otherwise: the executor acts on its own spec. Left out
    # of every dump and repr: a spec can name a power command's arguments, never shown.
    spec: ClusterSpec | None = Field(None, exclude=True, repr=False)

    @property
    def converged(self) -> bool:
        return self.phase == "healthy" and not self.actions

    def public(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "phase": self.phase,
            "reason": self.reason,
            "converged": self.converged,
            "actions": [a.public() for a in self.actions],
            "withheld": [a.public() for a in self.withheld],
            "triage": list(self.triage),
        }


ActionResult = Literal["ok", "failed", "timeout", "skipped"]
ACTION_RESULTS: tuple[ActionResult, ...] = get_args(ActionResult)


class ActionOutcome(Value):
    action: Action
    result: ActionResult
    started_at: float
    finished_at: float
    detail: BoundedText = ""

"""What the planner remembers between cycles. Changed only by `core.remember.remember()`.

Every stamp here is daemon time (see `sparkd.core.clock`), except a pause's, which is wall
clock: an operator's intent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from sparkd.model.base import Value
from sparkd.model.probe import ProbeResult

MEMORY_VERSION = 1


class Attempt(Value):
    key: str
    at: float
    ok: bool
    # What the action said it was for: a latch names the evidence it fought.
    reason: str = ""


class Pause(Value):
    reason: str
    by: str
    since: float
    until: float | None = None

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until


class Blocked(Value):
    reason: str
    since: float


class LoadMark(Value):
    """The last time a load was seen to advance, and what it looked like then."""

    # Which launch: the serve process's PID, and when it started (host clock, daemon time).
    pid: int | None = None
    launch: float
    key: str
    cpu_seconds: float | None = None
    at: float
    # When the load entered the stage it is in (`key` last changed); silent stages are capped
    # from here, however much CPU they burn.
    entered: float | None = None


class TokenMark(Value):
    """vLLM's generation-token counter as last read from one serve process, and since when
    (daemon time) it has stood still with requests running."""

    pid: int | None = None
    tokens: float
    # The first look of the current run of looks with requests running and the counter still;
    # the look itself when the counter moved, the engine was idle, or the counter was first read.
    since: float
    running: bool = False


class ClockAnchor(Value):
    """How daemon time is read on the ops box: `monotonic() + offset`, valid while the box has
    not rebooted (its boot id, and a monotonic clock that never reads below `mono_at`). A
    restart in the same boot keeps it, so a wall-clock step while sparkd was down changes no
    remembered duration."""

    boot_id: str
    offset: float
    mono_at: float


class GoodSpec(Value):
    """The spec that last reached lasting health: its Ray and model sections as configured
    (file paths, never a secret; the API key only by its fingerprint)."""

    hash: str
    ray: dict[str, Any]
    model: dict[str, Any]
    key: str | None = None
    # Daemon time it was recorded.
    at: float


RolloutResult = Literal["in_progress", "accepted", "rolled_back", "rollback_failed", "superseded"]


class Rollout(Value):
    """One change of spec, from the last-good one to the desired one. Stamps are daemon time,
    except `started`, the wall clock shown to operators."""

    id: int
    started: float
    began_at: float
    from_hash: str
    to_hash: str
    result: RolloutResult = "in_progress"
    # The first stop of the old deployment (a model or Ray restart), and the acceptance.
    stopped_at: float | None = None
    accepted_at: float | None = None
    downtime: float | None = None
    rolled_back: str | None = None
    rolled_back_at: float | None = None
    # When the last-good spec served well again after the rollback.
    restored_at: float | None = None
    # The acceptance checks (`rollout.checks`) passed for this rollout's spec.
    checked: bool = False


class Memory(Value):
    version: int = MEMORY_VERSION
    boot_ids: dict[str, str] = Field(default_factory=dict)
    # Remediations, newest last, pruned to the budget window: budget and backoff count these.
    attempts: tuple[Attempt, ...] = ()
    # Attempts before this time no longer lengthen the backoff (set after a healthy period).
    backoff_reset_at: float = 0.0
    blocked: Blocked | None = None
    paused: Pause | None = None
    # The model launch sparkd made: when, with which spec, on which Ray nodes.
    launched_at: float | None = None
    launch_spec: str | None = None
    launch_nodes: tuple[str, ...] = ()
    model_ready_at: float | None = None
    # Probe bookkeeping: each probe is counted once, by its timestamp.
    last_probe_at: float | None = None
    # The latest probe of this launch: between probes it still says how the model answers.
    last_probe: ProbeResult | None = None
    consecutive_failures: int = 0
    # Since when Ray has been short of what it should be with no action taken (not answering,
    # short of GPUs): past the join timeout, that is repaired rather than waited on.
    ray_unsettled_since: float | None = None
    # Since when the model has served well (Plan.serving_well): lasting, it ends an incident.
    healthy_since: float | None = None
    # Ray node ids (ALIVE when last read) and when each was first seen: a node first seen
    # before its host's Ray container started is the old one, not yet dropped by Ray.
    ray_seen: dict[str, float] = Field(default_factory=dict)
    # When sparkd last (re)started each host's Ray container.
    ray_started: dict[str, float] = Field(default_factory=dict)
    load_mark: LoadMark | None = None
    # Consecutive busy probe timeouts: past the failure threshold, busy is no excuse.
    busy_streak: int = 0
    # Per host, what the last kernel log read from it held that may precede a silent wedge
    # (core.triage.omens): kept while the host is unreachable, the evidence of a wedge.
    kernel_omens: dict[str, str] = Field(default_factory=dict)
    # Per host, the data interface's carrier_changes last read, and when it last rose (wall
    # clock of the observation): a flap stays visible for `fabric.flap_window`.
    carrier_changes: dict[str, int] = Field(default_factory=dict)
    # Per host, since when (wall clock of the observation) it has failed every look.
    unreachable_since: dict[str, float] = Field(default_factory=dict)
    flapped_at: dict[str, float] = Field(default_factory=dict)
    # Per host, the data IP's RoCE v2 GID index last read, and (index before, index after, wall
    # time) of its last move: NCCL keeps the index it opened with until the model relaunches.
    gid_indexes: dict[str, int] = Field(default_factory=dict)
    gid_moved: dict[str, tuple[int, int, float]] = Field(default_factory=dict)
    last_phase: str | None = None
    last_reason: str | None = None
    clock: ClockAnchor | None = None
    # Hosts unreachable at the last look, and when each was last seen going unreachable
    # (this incident's, bounded): a latch says which host kept dropping out.
    unreachable: tuple[str, ...] = ()
    went_unreachable: dict[str, tuple[float, ...]] = Field(default_factory=dict)
    # Rollouts (core.rollout): the last-good spec, the latest rollout, how many there were, and
    # the healthy probes in a row of this launch (acceptance counts them).
    last_good: GoodSpec | None = None
    rollout: Rollout | None = None
    rollout_seq: int = 0
    healthy_probes: int = 0
    # The last accepted rollout's downtime, seconds (elapsed: daemon time).
    rollout_downtime: float | None = None
    # Since when a fabric fault has held Ray and model (re)starts, while the model launched
    # before it runs: once the fabric is sound, what hung over it is restarted (core.fabric).
    fabric_held_since: float | None = None
    # When that hold ended (the first look without it): only a probe since counts against the
    # model.
    fabric_sound_at: float | None = None
    # The model's token counter while it serves (core.hang): a hang under load is its standing
    # still with requests running.
    token_mark: TokenMark | None = None

    def evolve(self, **changes: Any) -> Memory:
        """This memory with `changes`, each a known field and validated as it would be when
        read from disk (`model_copy(update=...)` checks neither: a misspelt key vanishes)."""
        unknown = sorted(set(changes) - set(type(self).model_fields))
        if unknown:
            raise KeyError(f"not a memory field: {', '.join(unknown)}")
        return type(self).model_validate({**dict(self), **changes})

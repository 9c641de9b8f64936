"""What the planner remembers between cycles. Changed only by
`core.remembering.remember.remember()`.

Every stamp here is daemon time (see `sparkd.core.clock`), except a pause's, which is wall
clock: an operator's intent. Each field's meaning is its `description`: docs/snapshot.md's
tables are generated from them (`python -m tests.snapshot_doc`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from sparkd.model.base import Value
from sparkd.model.probe import ProbeResult
from sparkd.model.time import Clock, DaemonTime, MonotonicTime, Quantity, WallTime

MEMORY_VERSION = 1
# `backoff_reset_at`'s 0.0 is "never reset", on every box: it is no reading, never moved.
NeverOrDaemonTime = Annotated[float, Clock("daemon", never=0.0)]


class Attempt(Value):
    key: str = Field(
        description="what budget and backoff count it against: `kind:host:subject`, the "
        "subject being the target unless the action names a steadier one (a respawning "
        "process's name rather than its PID)"
    )
    at: DaemonTime = Field(description="when it was made")
    ok: bool = Field(description="whether it succeeded")
    reason: str = Field(
        "",
        description="what the action said it was for: a latch names the evidence it fought",
    )


class Pause(Value):
    reason: str = Field(description="the operator's reason")
    by: str = Field(description="who paused")
    since: WallTime = Field(description="when (wall clock)")
    until: WallTime | None = Field(
        None, description="when it ends (wall clock); null: until resumed"
    )

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until


class Blocked(Value):
    reason: str = Field(description="the evidence the budget latch fought")
    since: DaemonTime = Field(description="when it was set")


class LoadMark(Value):
    """The last time a load was seen to advance, and what it looked like then."""

    pid: int | None = Field(None, description="the serve process's PID")
    launch: DaemonTime = Field(
        description="when that process started (this look less the elapsed time its host reports)"
    )
    key: str = Field(description="where the load stood: `stage|percent|message` of its progress")
    cpu_seconds: Quantity | None = Field(None, description="CPU seconds the load had used")
    at: DaemonTime = Field(description="when the load was last seen to advance")
    entered: DaemonTime | None = Field(
        None,
        description="when the load entered the stage it is in (`key` last changed): silent "
        "stages are capped from here, however much CPU they burn",
    )


class TokenMark(Value):
    """vLLM's progress figures as last read from one serve process (its token counters and
    KV-cache usage), and since when (daemon time) they have stood still with requests running."""

    pid: int | None = Field(None, description="the serve process it was read from")
    tokens: Quantity = Field(description="`vllm:generation_tokens_total` as last read")
    since: DaemonTime = Field(
        description="the first look of the current run of looks with requests running and "
        "nothing moving (token counters and KV-cache usage); the look itself when one moved, "
        "the engine was idle, or the counter was first read"
    )
    running: bool = Field(False, description="whether requests were running at that look")
    prompt_tokens: Quantity | None = Field(
        None, description="`vllm:prompt_tokens_total` as last read (null: not exported)"
    )
    kv_cache_usage: Quantity | None = Field(
        None,
        description="`vllm:kv_cache_usage_perc` as last read (null: not exported): it moves "
        "with every engine step that takes or frees KV blocks, a long prefill's included",
    )
    quiet_since: DaemonTime | None = Field(
        None,
        description="the first look of the current run with requests running and no token "
        "counted, whether or not the KV cache moved (a long prefill); null: `since`",
    )


class ClockAnchor(Value):
    """How daemon time is read on the ops box: `monotonic() + offset`, valid while the box has
    not rebooted (its boot id, and a monotonic clock that never reads below `mono_at`). A
    restart in the same boot keeps it, so a wall-clock step while sparkd was down changes no
    remembered duration."""

    boot_id: str = Field(description="the ops box's boot id the anchor holds for")
    offset: Quantity = Field(description="daemon time minus the monotonic clock")
    mono_at: MonotonicTime = Field(description="the monotonic clock at the last look")


class GoodSpec(Value):
    """The spec that last reached lasting health: its Ray and model sections as configured
    (file paths, never a secret; the API key only by its fingerprint). A rollback launches the
    sections this box recorded under `hash` (core.deciding.known_specs), never these: etcd's record
    holds the hash alone."""

    hash: str = Field(description="its spec hash")
    ray: dict[str, Any] = Field(
        default_factory=dict,
        description="the `ray` section as configured (empty in etcd's record: the hash names it)",
    )
    model: dict[str, Any] = Field(
        default_factory=dict,
        description="the `model` section as configured (empty in etcd's record: the hash names it)",
    )
    key: str | None = Field(None, description="the API key's fingerprint")
    at: DaemonTime = Field(description="when it was recorded")


RolloutResult = Literal["in_progress", "accepted", "rolled_back", "rollback_failed", "superseded"]


class Rollout(Value):
    """One change of spec, from the last-good one to the desired one. Stamps are daemon time,
    except `started`, the wall clock shown to operators."""

    id: int = Field(description="its number (`rollout_seq` when it began)")
    started: WallTime = Field(description="when it began (wall clock, shown to operators)")
    began_at: DaemonTime = Field(description="when it began")
    from_hash: str = Field(description="the last-good spec's hash")
    to_hash: str = Field(description="the desired spec's hash")
    result: RolloutResult = Field("in_progress", description="how it stands or ended")
    stopped_at: DaemonTime | None = Field(
        None, description="the first stop of the old deployment (a model or Ray restart)"
    )
    accepted_at: DaemonTime | None = Field(None, description="when it was accepted")
    downtime: Quantity | None = Field(None, description="seconds the model did not serve")
    rolled_back: str | None = Field(None, description="why it was rolled back")
    rolled_back_at: DaemonTime | None = Field(None, description="when it was rolled back")
    restored_at: DaemonTime | None = Field(
        None, description="when the last-good spec served well again after the rollback"
    )
    checked: bool = Field(
        False, description="the acceptance checks (`rollout.checks`) passed for its spec"
    )


# Fields older versions wrote that this one no longer keeps: read and dropped, not reported as
# a newer version's (a state file or snapshot written before their removal still loads).
RETIRED_FIELDS: frozenset[str] = frozenset({"launch_spec"})


class Adopted(Value):
    """A hand-made deployment sparkd took over without a restart (core.judging.adopt): its
    containers keep their own names, which every later remedy removes before sparkd's own launch."""

    containers: dict[str, str] = Field(
        description="per configured host, the name of the Ray container adopted there"
    )
    serve_pid: int | None = Field(
        None, description="the `vllm serve` process adopted in the head's container (its PID)"
    )
    at: DaemonTime = Field(description="when it was adopted")


class Memory(Value):
    version: int = Field(MEMORY_VERSION, description="the memory schema's version (1)")
    boot_ids: dict[str, str] = Field(
        default_factory=dict, description="per host, the last boot id seen"
    )
    attempts: tuple[Attempt, ...] = Field(
        (),
        description="remediations, newest last (the latest 256): budget and "
        "backoff count those since `backoff_reset_at`",
    )
    backoff_reset_at: NeverOrDaemonTime = Field(
        0.0,
        description="attempts before this no longer lengthen the backoff (a healthy period passed)",
    )
    blocked: Blocked | None = Field(
        None, description="set while the budget latch holds; cleared by `sparkd resume`"
    )
    paused: Pause | None = Field(None, description="the operator's pause, if any")
    launched_at: DaemonTime | None = Field(None, description="when sparkd launched the model")
    launch_nodes: tuple[str, ...] = Field((), description="the Ray node ids that launch ran on")
    model_ready_at: DaemonTime | None = Field(
        None, description="when the model first answered after that launch"
    )
    last_probe_at: DaemonTime | None = Field(
        None, description="the latest probe's time: each probe is counted once, by it"
    )
    last_probe: ProbeResult | None = Field(
        None,
        description="the latest probe of this launch: between probes it still says how the "
        "model answers",
    )
    consecutive_failures: int = Field(0, description="unhealthy probes in a row")
    ray_unsettled_since: DaemonTime | None = Field(
        None,
        description="since when Ray has been short of what it should be (not answering, short "
        "of GPUs) with no action taken: past the join timeout, that is repaired rather than "
        "waited on",
    )
    healthy_since: DaemonTime | None = Field(
        None,
        description="since when the model has served well (healthy or degraded only while it "
        "answers): lasting, it ends an incident",
    )
    ray_seen: dict[str, DaemonTime] = Field(
        default_factory=dict,
        description="the Ray node ids ALIVE when last read, and when each was first seen: a "
        "node first seen before its host's Ray container started is the old one, not yet "
        "dropped by Ray",
    )
    ray_started: dict[str, DaemonTime] = Field(
        default_factory=dict, description="per host, when sparkd last (re)started its Ray container"
    )
    load_mark: LoadMark | None = Field(
        None, description="the last time the model's load was seen to advance"
    )
    busy_streak: int = Field(
        0,
        description="busy probe timeouts in a row (overloaded): reported, never counted as "
        "failures",
    )
    memory_held: bool = Field(
        False,
        description="the latest launch failed vLLM's free-memory check while another process "
        "held GPU memory: the host's state, so that failure is no evidence against the spec "
        "(cleared by the next launch)",
    )
    unknown_streak: int = Field(
        0,
        description="probe timeouts in a row whose busy-or-hung could not be told (vLLM's "
        "metrics unread): never counted as failures; at `policy.failure_threshold` the plan "
        "is `blocked` with what to check",
    )
    kernel_omens: dict[str, str] = Field(
        default_factory=dict,
        description="per host, what the last kernel log read from it held that may precede a "
        "silent wedge: kept while the host is unreachable, the evidence of a wedge",
    )
    carrier_changes: dict[str, int] = Field(
        default_factory=dict,
        description="per host, the data interface's carrier changes as last read",
    )
    unreachable_since: dict[str, DaemonTime] = Field(
        default_factory=dict,
        description="per host, since when (the reading's time) every look at it has met silence "
        "(no route, a timeout, a dropped connection); an answer such as a refused key ends it",
    )
    refusing_since: dict[str, DaemonTime] = Field(
        default_factory=dict,
        description="per host, since when (the reading's time) every look at it has met an SSH "
        "answer refusing sparkd (a refused key or connection, a changed host key): past "
        "`policy.hold_cap` the plan is `blocked` with what to check",
    )
    gpu_unknown_since: dict[str, DaemonTime] = Field(
        default_factory=dict,
        description="per host, since when (the reading's time) its `nvidia-smi` has failed at "
        "every look while the host answered: past `policy.hold_cap` the plan is `blocked`",
    )
    owner_unknown_since: dict[str, DaemonTime] = Field(
        default_factory=dict,
        description="per host, since when (the reading's time) a GPU process there has had an "
        "unknown owner at every look (a container's process list unreadable): past "
        "`policy.hold_cap` the plan is `blocked`",
    )
    omen_at: dict[str, DaemonTime] = Field(
        default_factory=dict,
        description="per host, when the wedge omen in `kernel_omens` was first seen (the "
        "reading's time): it explains a later silence only within `policy.omen_window`",
    )
    flapped_at: dict[str, DaemonTime] = Field(
        default_factory=dict,
        description="per host, when its carrier changes last rose (the reading's time): a "
        "flap stays visible for `fabric.flap_window`",
    )
    gid_indexes: dict[str, int] = Field(
        default_factory=dict, description="per host, the data IP's RoCE v2 GID row as last read"
    )
    gid_moved: dict[str, tuple[int, int, DaemonTime]] = Field(
        default_factory=dict,
        description="per host, its GID row's last move `[before, after, at]`: NCCL keeps the "
        "row it opened with until the model relaunches",
    )
    last_phase: str | None = Field(None, description="the phase of the last plan")
    last_reason: str | None = Field(None, description="the reason of the last plan")
    clock: ClockAnchor | None = Field(
        None, description="how daemon time is read: kept across a restart in the same boot"
    )
    observing_since: DaemonTime | None = Field(
        None,
        description="when this sparkd process began observing: memory it loaded from the state "
        "dir or adopted from etcd (a backup restored included) was written before, by a "
        "process that may have looked on another clock or long ago, and no destructive action "
        "relies on it alone until a look of this process confirms it (core.deciding.gate "
        "`inherited_memory`); null: no such boundary",
    )
    unreachable: tuple[str, ...] = Field((), description="the hosts unreachable at the last look")
    went_unreachable: dict[str, tuple[DaemonTime, ...]] = Field(
        default_factory=dict,
        description="per host, when it went unreachable in this incident (bounded): a latch "
        "names the host that kept dropping out",
    )
    last_good: GoodSpec | None = Field(
        None, description="the spec that last reached lasting health"
    )
    rollout: Rollout | None = Field(None, description="the latest rollout")
    rollout_seq: int = Field(0, description="how many rollouts there were")
    healthy_probes: int = Field(
        0, description="healthy probes in a row of this launch (a rollout's acceptance counts them)"
    )
    rollout_downtime: Quantity | None = Field(
        None, description="the last accepted rollout's downtime, in seconds"
    )
    fabric_held_since: DaemonTime | None = Field(
        None,
        description="since when a fabric fault has held Ray and model (re)starts while the "
        "model launched before it runs: once the fabric is sound, a model that does not answer "
        "has both ranks restarted",
    )
    fabric_sound_at: DaemonTime | None = Field(
        None,
        description="when that hold ended (the first look without it): only a probe taken "
        "since counts as the model not answering",
    )
    token_mark: TokenMark | None = Field(
        None,
        description="the model's progress figures while it serves: a hang under load is their "
        "standing still with requests running (past `policy.hang_window`)",
    )
    adopted: Adopted | None = Field(
        None,
        description="the hand-made deployment sparkd adopted on first contact, while it runs "
        "(core.judging.adopt); null once replaced by sparkd's own launch, or never adopted",
    )
    adopting_since: DaemonTime | None = Field(
        None,
        description="since when first contact has waited to adopt a matching deployment made by "
        "hand (its model to pass the probe); past `model.load_timeout` the operator is asked",
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_retired(cls, data: Any) -> Any:
        if isinstance(data, dict) and not RETIRED_FIELDS.isdisjoint(data):
            return {k: v for k, v in data.items() if k not in RETIRED_FIELDS}
        return data

    def evolve(self, **changes: Any) -> Memory:
        """This memory with `changes`, each a known field and validated as it would be when
        read from disk (`model_copy(update=...)` checks neither: a misspelt key vanishes)."""
        unknown = sorted(set(changes) - set(type(self).model_fields))
        if unknown:
            raise KeyError(f"not a memory field: {', '.join(unknown)}")
        return type(self).model_validate({**dict(self), **changes})

"""What the planner remembers between cycles. Changed only by `core.remember.remember()`."""

from __future__ import annotations

from pydantic import Field

from sparkd.model.base import Value
from sparkd.model.probe import ProbeResult

MEMORY_VERSION = 1


class Attempt(Value):
    key: str
    at: float
    ok: bool


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
    healthy_since: float | None = None
    last_phase: str | None = None
    last_reason: str | None = None

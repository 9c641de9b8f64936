"""The desired state of one cluster: what `plan()` compares observations with, and the policy,
fabric, power, maintenance and rollout sections it carries."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from sparkd.model import linear_regex
from sparkd.model.base import Value
from sparkd.model.duration import parse_duration
from sparkd.model.fields import Name, Seconds, unique
from sparkd.model.linear_regex import compile_regex
from sparkd.model.spec import (
    CleanupSpec,
    HostSpec,
    ModelSpec,
    ProbeSpec,
    RaySpec,
    SshSpec,
)


class PolicySpec(Value):
    failure_threshold: int = Field(default=3, ge=1)
    budget: int = Field(default=3, ge=1)
    # Accepted for old configs, no longer used: a budget counts the whole incident (core.policy).
    budget_window: Seconds = 3600.0
    backoff_initial: Seconds = 30.0
    backoff_max: Seconds = 900.0
    healthy_reset: Seconds = 600.0
    allow_kill_foreign_gpu: bool = False
    # Below this MemAvailable (bytes) on a host, memory pressure is reported, and during a load
    # the model is not started into it (GB10's GPU allocations come out of host memory).
    min_memory_available: int = Field(default=4 << 30, ge=0)
    # Requests running and vLLM's generation-token counter still this long (core.judging.hang): a
    # hung engine, restarted without waiting for `failure_threshold` probes.
    hang_window: Seconds = 60.0
    # A just-ready engine's stall clock starts this long after it was ready: vLLM's first-shape
    # compiles stall it for 30-70 s, with requests running and no token.
    hang_ready_grace: Seconds = 70.0
    # The slowest prefill sparkd allows for, in prompt tokens per second: a lone prefill emits
    # no token and moves no counter, so when `vllm:kv_cache_usage_perc` cannot show it working,
    # requests running and no token are a hang only after the longest prompt the engine takes
    # (`max_model_len`) could have been prefilled at this rate. Two Sparks prefill about 2000.
    prefill_rate: float = Field(default=1000.0, gt=0.0, allow_inf_nan=False)
    # A hold on an answer only a human changes ends `blocked` with what to check after this
    # long: a host whose SSH refuses sparkd (its key, a changed host key, a refused connection:
    # sshd restarting after a boot is back well within), or whose nvidia-smi fails without the
    # GPU being lost (an NVML driver/library mismatch after an upgrade without a reboot).
    hold_cap: Seconds = 600.0
    # A wedge omen (core.reading.kernel) explains a later silence of its host only when it was first
    # seen at most this long before the silence began: one from long before says nothing of
    # what cut the ops box off from every host at once.
    omen_window: Seconds = 1800.0

    @model_validator(mode="after")
    def _backoff(self) -> PolicySpec:
        if self.backoff_initial > self.backoff_max:
            raise ValueError("backoff_initial must not exceed backoff_max")
        return self


class FabricSpec(Value):
    """The data link's RDMA fabric: what it should look like (unset: not checked)."""

    # The RDMA port's rate below which the link is degraded (a 200 Gb/s link that trained at
    # 100 or fell back to 25 carries NCCL at a fraction of its speed).
    expected_rate_gbps: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # A carrier change (a flap) stays visible this long after the link is back.
    flap_window: Seconds = 600.0


class PowerSpec(Value):
    """When a host that does not answer is taken for wedged, and how it is power-cycled."""

    # Unreachable over SSH this long, whatever its last kernel log said: wedged, needs a power
    # cycle (a host that reboots comes back well within it).
    unreachable_for: Seconds = 600.0
    # The argv run on the ops box (never through a shell, never over SSH) to power-cycle a host
    # (a switched PDU's or a smart plug's CLI); every `{host}` in an element becomes the host's
    # name, inside that one element. Unset: sparkd says a host needs a power cycle, and waits.
    command: tuple[Annotated[str, Field(min_length=1)], ...] | None = None
    timeout: Seconds = 60.0

    @field_validator("command")
    @classmethod
    def _command(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("needs at least the program to run")
        if not any("{host}" in part for part in value):
            raise ValueError("must name the host to cycle: put {host} in one of its elements")
        if not value[0].startswith("/"):
            # No PATH lookup: which program powers hosts off is not left to the environment.
            raise ValueError(f"{value[0]!r}: the program must be an absolute path")
        return value

    @property
    def enabled(self) -> bool:
        return self.command is not None


class MaintenanceSpec(Value):
    """A recurring window in which the cluster is observed and nothing is acted on. Its cron is
    read where the config is loaded (`sparkd.shell.cron.cron_trigger`): APScheduler parses it, and
    whether it still fires depends on the clock, neither of which a value type may reach."""

    cron: Annotated[str, Field(min_length=1)]
    duration: Seconds
    reason: Annotated[str, Field(min_length=1)]
    # The cron's timezone; the host's own when unset.
    timezone: str | None = None

    @field_validator("duration", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, str) else value


class RolloutCheck(Value):
    """A completion a new spec must answer right before it is accepted. The expectation on the
    answer applies when there is content: a reasoning-only answer (the budget spent thinking)
    passes `contains` and `regex` as the probe passes it."""

    prompt: Annotated[str, Field(min_length=1)]
    max_tokens: int = Field(default=50, ge=1)
    contains: str | None = None
    regex: str | None = None
    min_completion_tokens: int | None = Field(default=None, ge=1)

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compile_regex(value)
            except linear_regex.Error as exc:
                raise ValueError(f"regex {value!r}: {exc}") from None
        return value


class RolloutSpec(Value):
    """How a change of the Ray or model spec is rolled out."""

    # A new spec that fails on evidence goes back to the last spec that served well.
    rollback: bool = True
    # Consecutive healthy probes of a new spec before it is accepted (and becomes last-good).
    acceptance_probes: int = Field(default=3, ge=1, le=100)
    # Completions a new spec must answer right, once, before it is accepted.
    checks: tuple[RolloutCheck, ...] = Field(default=(), max_length=16)


class ClusterSpec(Value):
    """The desired state of one cluster: what `plan()` compares observations with."""

    name: Name
    interval: Seconds = 30.0
    probe_interval: Seconds = 60.0
    recheck_interval: Seconds = 5.0
    hosts: tuple[HostSpec, ...]
    ssh: SshSpec
    ray: RaySpec
    model: ModelSpec
    probe: ProbeSpec = ProbeSpec()
    cleanup: CleanupSpec = CleanupSpec()
    policy: PolicySpec = PolicySpec()
    fabric: FabricSpec = FabricSpec()
    power: PowerSpec = PowerSpec()
    maintenance: tuple[MaintenanceSpec, ...] = ()
    rollout: RolloutSpec = RolloutSpec()
    # First contact with a deployment made by hand (core.judging.adopt, docs/adoption.md):
    # `matching` adopts one the config describes and shows, without touching it, one that differs;
    # `replace` is the operator's decision to replace a differing one by the config's launch.
    adopt: Literal["matching", "replace"] = "matching"

    @model_validator(mode="after")
    def _cross_checks(self) -> ClusterSpec:
        heads = [h.name for h in self.hosts if h.role == "head"]
        if len(heads) != 1:
            raise ValueError(f"needs exactly one host with role head, found {len(heads)}")
        unique("host name", [h.name for h in self.hosts])
        unique("host data_ip", [h.ip for h in self.hosts])
        if self.ray.expected_gpus < len(self.hosts):
            raise ValueError(
                f"ray.expected_gpus ({self.ray.expected_gpus}) is less than the number of hosts "
                f"({len(self.hosts)})"
            )
        if self.probe.timeout >= self.probe_interval:
            raise ValueError(
                f"probe.timeout ({self.probe.timeout:g}s) must be less than probe_interval "
                f"({self.probe_interval:g}s)"
            )
        parallel = self.model.tensor_parallel_size * self.model.pipeline_parallel_size
        if parallel != self.ray.expected_gpus:
            raise ValueError(
                f"model tensor_parallel_size x pipeline_parallel_size = {parallel}, "
                f"but ray.expected_gpus = {self.ray.expected_gpus}"
            )
        return self

    @property
    def head(self) -> HostSpec:
        return next(h for h in self.hosts if h.role == "head")

    @property
    def workers(self) -> tuple[HostSpec, ...]:
        return tuple(h for h in self.hosts if h.role == "worker")

    def host(self, name: str) -> HostSpec:
        return next(h for h in self.hosts if h.name == name)

    @property
    def model_host(self) -> str:
        """Where the model is reached from the head's SSH endpoint (default: its data IP)."""
        return self.model.tunnel_host or self.head.ip

"""Remediation budget and backoff, computed from remembered attempts."""

from __future__ import annotations

from sparkd.model.cluster import PolicySpec
from sparkd.model.memory import Attempt, Memory
from sparkd.model.observed import Observed
from sparkd.model.probe import ProbeResult

# Outcomes that never count toward the failure threshold: nothing was learnt about the model.
UNCOUNTED = frozenset({"not_run"})


def attempts_for(memory: Memory, key: str, since: float) -> tuple[Attempt, ...]:
    return tuple(a for a in memory.attempts if a.key == key and a.at >= since)


def incident(memory: Memory, key: str) -> tuple[Attempt, ...]:
    """The attempts at `key` in the current incident: every one since health last lasted
    `healthy_reset` (a remediation that helped, followed by sustained health, is forgiven).
    No fixed window: a fault slower than any window would be fought for ever."""
    return attempts_for(memory, key, memory.backoff_reset_at)


def budget_used(memory: Memory, key: str, policy: PolicySpec, now: float) -> int:
    """Attempts at `key` in this incident."""
    return len(incident(memory, key))


def backoff_until(memory: Memory, key: str, policy: PolicySpec, now: float) -> float:
    """When the next attempt at `key` is allowed; the first attempt never waits."""
    streak = incident(memory, key)
    if not streak:
        return now
    delay = min(policy.backoff_max, policy.backoff_initial * 2 ** (len(streak) - 1))
    # Never later than a delay from now: a stamp from before a clock step cannot stretch it.
    return float(min(streak[-1].at, now) + delay)


def is_new_probe(memory: Memory, probe: ProbeResult | None) -> bool:
    if probe is None:
        return False
    if memory.launched_at is not None and probe.at < memory.launched_at:
        return False
    return memory.last_probe_at is None or probe.at > memory.last_probe_at


def busy_streak_after(memory: Memory, probe: ProbeResult | None) -> int:
    """Consecutive busy probes once `probe` is taken into account (how long the overload has
    lasted, for the report)."""
    if probe is None or not is_new_probe(memory, probe):
        return memory.busy_streak
    return memory.busy_streak + 1 if probe.busy else 0


def unknown_streak_after(memory: Memory, probe: ProbeResult | None) -> int:
    """Consecutive timeouts whose busy-or-hung could not be told, once `probe` is taken into
    account (the cap on waiting for evidence: `policy.failure_threshold` of them)."""
    if probe is None or not is_new_probe(memory, probe):
        return memory.unknown_streak
    return memory.unknown_streak + 1 if probe.unknown_load else 0


def counts_as_failure(probe: ProbeResult) -> bool:
    """A failed probe that says the engine is broken. Not `not_run` (nothing learnt); not a busy
    timeout, however long the load lasts (the engine generates for others: a restart would drop
    their requests and meet the same load again); not an output fault (`no_answer`: the engine
    generated a whole turn and the template or reasoning parser left no content, which a
    restart reproduces); not a config fault (a deterministic 4xx answer, which a restart
    reproduces); not a timeout with nothing to tell busy from hung (vLLM's metrics unread:
    absent evidence is unknown, not a hang)."""
    verdict = probe.verdict
    if verdict.healthy is not False or verdict.outcome in UNCOUNTED:
        return False
    return not (probe.busy or probe.output_fault or probe.config_fault or probe.unknown_load)


def failures_after(memory: Memory, probe: ProbeResult | None) -> int:
    """Consecutive counted failures once `probe` is taken into account."""
    if probe is None or not is_new_probe(memory, probe):
        return memory.consecutive_failures
    if probe.verdict.healthy:
        return 0
    if counts_as_failure(probe):
        return memory.consecutive_failures + 1
    return memory.consecutive_failures


def rebooted(observed: Observed, memory: Memory) -> list[str]:
    """Hosts whose boot id changed since it was last remembered."""
    return [
        host.name
        for host in observed.hosts
        if host.boot_id and memory.boot_ids.get(host.name) not in (None, host.boot_id)
    ]

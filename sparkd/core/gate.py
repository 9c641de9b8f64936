"""The gate: the one place every action passes on its way into a plan. Pure.

A stage proposes an action on the evidence it reads; the evidence may have another cause than
the fault the action remedies (docs/decisions.md, the confounder table). The gate holds, per
action kind, the checks that rule those other causes out, as data: `TABLE` maps a kind to its
named checks, each a pure function of the cycle's context and the action that returns why the
action must not run, or None. The planner (core.planner.plan) passes every action through
`refusal` before budget and backoff, so an action the gate refuses is withheld with the reason
and spends no budget, and an action in a plan has always been through the gate (`Plan.gated`).

A kind with no check yet has an empty row: its confounders are then ruled out, where they are,
by the stage that proposes it (docs/decisions.md says which, and which are not yet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sparkd.core import policy
from sparkd.core.judge import Context, ago
from sparkd.model.observed import SILENT_ERRORS, HostErrorKind
from sparkd.model.plan import Action, ActionKind

# SSH failures that are silence (`model.observed.SILENT_ERRORS`).
SILENT: frozenset[HostErrorKind] = SILENT_ERRORS


@dataclass(frozen=True)
class Refusal:
    """Why an action may not run now."""

    reason: str
    # Only a human can settle it (the plan reads `blocked`, unlatched: it lifts by itself when
    # the evidence changes); otherwise the plan keeps its phase and the action waits.
    needs_a_human: bool = False


Check = Callable[[Context, Action], Refusal | None]


@dataclass(frozen=True)
class Named:
    """A check under the name docs/decisions.md gives it."""

    name: str
    check: Check


def observer_silence(ctx: Context, action: Action) -> Refusal | None:
    """Every host of the cluster went silent within one look of the others, and no kernel log
    seen from any of them held a wedge omen: what the ops box reads when its own path to the
    hosts is down (its NIC, a switch, a VLAN, a firewall change), not a wedge of each host at
    once. A power cycle cannot bring that path back, and may cut a model serving its clients
    all along. sparkd has already waited `power.unreachable_for` (the power stage proposes no
    cycle before that): a human checks the ops box's network. A host silent while another
    answers, or one whose last log held an omen, stays eligible."""
    hosts = ctx.desired.hosts
    stamps: list[float] = []
    for host in hosts:
        error = ctx.facts[host.name].error
        since = ctx.memory.unreachable_since.get(host.name)
        if error is None or error.kind not in SILENT or since is None:
            return None  # this host answers (or its silence has no start): not every host
        if host.name in ctx.memory.kernel_omens:
            return None  # a wedge omen: the silence has a cause on that host
        stamps.append(since)
    if max(stamps) - min(stamps) > ctx.desired.interval:
        return None
    every = "the only host" if len(hosts) == 1 else f"every host ({len(hosts)})"
    return Refusal(
        f"{every} of {ctx.desired.name} went silent at once ({ago(ctx.now - min(stamps))} ago) "
        "with no wedge omen in any last kernel log seen: check the ops box's own network path "
        "to the hosts (its NIC, switch, VLAN, firewall); power-cycle by hand only once the ops "
        "box is known to reach that network",
        needs_a_human=True,
    )


def inherited_memory(ctx: Context, action: Action) -> Refusal | None:
    """The action's evidence is memory this process did not see: loaded from the state dir,
    adopted from etcd or restored from a backup (`Memory.observing_since`, the boundary). It
    was written by a process that may have looked long ago, or on a clock that read earlier
    (an ops box that rebooted reads its wall clock anew, later than before when the RTC ran
    ahead and `time-sync.target` did not wait for a sync). Absent looks are unknown, never
    proof: the model may have answered, the host may have come back, meanwhile.

    - `restart_model` on the probe's failure count: the probe that proposed it was taken
      before this process began observing. It waits for a probe of its own (one, the next due
      within `probe_interval`): a failure then counts with the remembered ones, an answer ends
      the count.
    - `power_cycle`: a host silent since before this process began observing has been seen
      silent by it for less than `power.unreachable_for`. It waits for the rest of that on this
      process's own looks (the cap), then may be cycled.
    """
    boundary = ctx.memory.observing_since
    if boundary is None:
        return None
    if action.kind == "power_cycle":
        silent_from = ctx.memory.unreachable_since.get(action.host)
        limit = ctx.desired.power.unreachable_for
        own = ctx.now - boundary
        if silent_from is None or silent_from >= boundary or own >= limit:
            return None
        return Refusal(
            f"silent for {ago(ctx.now - silent_from)} by memory from before this sparkd began "
            f"observing ({ago(own)} ago); seen silent by its own looks for {ago(own)} of the "
            f"{ago(limit)} (power.unreachable_for) a cycle needs: it may have answered meanwhile"
        )
    if action.kind == "restart_model":
        latest = ctx.observed.probe or ctx.memory.last_probe
        threshold = ctx.desired.policy.failure_threshold
        if (
            latest is None
            or latest.at >= boundary
            or not policy.counts_as_failure(latest)
            or policy.failures_after(ctx.memory, ctx.observed.probe) < threshold
        ):
            return None  # its own probe, or not the probe's count that proposes it
        return Refusal(
            f"the failed probes it counts ({ctx.memory.consecutive_failures}, the last "
            f"{ago(ctx.now - latest.at)} ago) are memory from before this sparkd began "
            f"observing ({ago(ctx.now - boundary)} ago); waiting for a probe of its own"
        )
    return None


# Each action kind and the checks it must pass, in order; the first refusal withholds it.
TABLE: dict[ActionKind, tuple[Named, ...]] = {
    "stop_unit": (),
    "remove_container": (),
    "start_ray_head": (),
    "start_ray_worker": (),
    "restart_ray": (),
    "start_model": (),
    "restart_model": (Named("inherited_memory", inherited_memory),),
    "kill_gpu_process": (),
    "power_cycle": (
        Named("observer_silence", observer_silence),
        Named("inherited_memory", inherited_memory),
    ),
    "prune_cache": (),
}

# What a refused action would have done, for the withheld note.
VERBS: dict[ActionKind, str] = {
    "stop_unit": "stopping",
    "remove_container": "removing",
    "start_ray_head": "starting",
    "start_ray_worker": "starting",
    "restart_ray": "restarting",
    "start_model": "starting",
    "restart_model": "restarting",
    "kill_gpu_process": "killing",
    "power_cycle": "power-cycling",
    "prune_cache": "pruning",
}


def refusal(ctx: Context, action: Action) -> Refusal | None:
    """The first refusal of `action`'s checks, in the table's order; None: it may run."""
    for named in TABLE[action.kind]:
        found = named.check(ctx, action)
        if found is not None:
            return found
    return None


def note(action: Action, refused: Refusal) -> str:
    """What the plan says of a refused action, in place of what proposed it."""
    what = action.host if action.target == action.host else f"{action.target} on {action.host}"
    return f"not {VERBS[action.kind]} {what}: {refused.reason}"

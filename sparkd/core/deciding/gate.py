"""The gate: the one place every action passes on its way into a plan. Pure.

A stage proposes an action on the evidence it reads; the evidence may have another cause than
the fault the action remedies (docs/decisions.md, the confounder table). The gate holds, per
action kind, the checks that rule those other causes out, as data: `TABLE` maps a kind to its
named checks, each a pure function of the cycle's context and the action that returns why the
action must not run, or None. The planner (core.deciding.planner.plan) passes every action through
`refusal` before budget and backoff, so an action the gate refuses is withheld with the reason
and spends no budget, and an action in a plan has always been through the gate (`Plan.gated`).

A kind with no check yet has an empty row: its confounders are then ruled out, where they are,
by the stage that proposes it (docs/decisions.md says which, and which are not yet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sparkd.core import policy
from sparkd.core.judging.judge import Context, ago
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
    answers, or one whose last log held an omen seen shortly before its silence
    (`fresh_omen`), stays eligible."""
    hosts = ctx.desired.hosts
    stamps: list[float] = []
    for host in hosts:
        error = ctx.facts[host.name].error
        since = ctx.memory.unreachable_since.get(host.name)
        if error is None or error.kind not in SILENT or since is None:
            return None  # this host answers (or its silence has no start): not every host
        if fresh_omen(ctx, host.name, since):
            return None  # a wedge omen: the silence has a cause on that host
        stamps.append(since)
    if max(stamps) - min(stamps) > ctx.desired.interval:
        return None
    every = "the only host" if len(hosts) == 1 else f"every host ({len(hosts)})"
    return Refusal(
        f"{every} of {ctx.desired.name} went silent at once ({ago(ctx.now - min(stamps))} ago) "
        "with no recent wedge omen in any last kernel log seen: check the ops box's own network "
        "path to the hosts (its NIC, switch, VLAN, firewall); power-cycle by hand only once the "
        "ops box is known to reach that network",
        needs_a_human=True,
    )


def peer_view(ctx: Context, action: Action) -> Refusal | None:
    """One host is silent to the ops box while another answers: the ops box may have lost only
    its path to that host (a switch port, its management NIC, a firewall on port 22) while the
    host serves, and the probe and Ray, read through the head, say nothing when the head is
    the silent one. A cycle needs positive evidence that the host is down for the cluster too:
    no answering host reaches its data IP (one ping over the data link, each look), or, for a
    worker, the head's Ray read and not listing it ALIVE. A host that another still reaches has
    a kernel that answers: `blocked`, check the ops box's path. Neither read: unknown, never
    proof: `blocked`, with what to check. Every host silent is `observer_silence`'s."""
    silent = next((h for h in ctx.desired.hosts if h.name == action.host), None)
    if silent is None:
        return None
    others = [h for h in ctx.desired.hosts if h.name != silent.name and ctx.facts[h.name].reachable]
    if not others:
        return None
    views = {h.name: ctx.facts[h.name].reaches.get(silent.data_ip) for h in others}
    reaching = sorted(name for name, view in views.items() if view is True)
    path = (
        f"check the ops box's path to {silent.name} (its management NIC and switch port, a "
        f"firewall on port {silent.port}); power-cycle by hand only once it is known not to serve"
    )
    if reaching:
        return Refusal(
            f"{silent.name} is silent to the ops box, but {', '.join(reaching)} still "
            f"reach{'es' if len(reaching) == 1 else ''} its data IP ({silent.data_ip}): its "
            f"kernel answers; {path}",
            needs_a_human=True,
        )
    if any(view is False for view in views.values()):
        return None  # no answering host reaches it either: down for the cluster
    ray = ctx.observed.ray
    if silent.role == "worker" and ray is not None and ray.up and silent.ip not in ray.alive_ips:
        return None  # the head's Ray lost it too
    return Refusal(
        f"{silent.name} is silent to the ops box while {', '.join(sorted(views))} answer"
        f"{'s' if len(views) == 1 else ''}, and nothing says it is down for them (no ping of "
        f"its data IP read from them, Ray not showing it gone): {path}",
        needs_a_human=True,
    )


def fresh_omen(ctx: Context, host: str, since: float) -> bool:
    """Whether `host`'s last kernel log held a wedge omen first seen within
    `policy.omen_window` before its silence began (daemon time). An omen seen long before (a
    kernel warning from yesterday, still in the ring buffer) or of unknown age says nothing of
    a silence that every host shares: that is the ops box's path again."""
    if host not in ctx.memory.kernel_omens:
        return False
    seen = ctx.memory.omen_at.get(host)
    return seen is not None and since - seen <= ctx.desired.policy.omen_window


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
        Named("peer_view", peer_view),
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

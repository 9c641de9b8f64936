"""A wedged host, and the one remediation that fits it: a power cycle. Pure.

A host wedged after NV_ERR_NO_MEMORY, a fatal AER or soft lockups answers nothing, SSH included;
DGX Spark has no BMC, so only a switched PDU or a smart plug brings it back. sparkd runs the
operator's `power.command` for it only when every part of the safety rule holds:

1. the host has failed every look for `power.unreachable_for` (daemon time: it cannot step);
2. the triage says wedged: its last kernel log seen held a wedge omen, or it stayed silent past
   that deadline, which a host that reboots meets well within; and its SSH failure is silence
   (no route, timed out, dropped), not an answer such as a refused connection (the host's
   kernel sent the reset), a refused key or a changed host key, which says the host is up and
   the fault is sparkd's access to it;
3. no load of this cluster progresses on a sound fabric (a load that advances is the hosts
   working; one over a faulty fabric hangs anyway);
4. the model does not answer: no probe taken while the host was silent came back healthy or
   busy, and the head's Ray (when read) does not list the host's node ALIVE (SSH alone can
   fail, a firewall on port 22 or a dead sshd, while Ray and the model keep serving);
5. the host was not power-cycled yet in this incident (once, then `blocked`: a host that stays
   silent after a power cycle needs a human);
6. not paused, not in a maintenance window, not `--dry-run` (core.deciding.planner withholds every
   action then).

Without `power.command` the same evidence gives `blocked` "needs a power cycle".
"""

from __future__ import annotations

from sparkd.core import policy
from sparkd.core.deciding import gate
from sparkd.core.deciding.gate import SILENT
from sparkd.core.judging.judge import Context, Hold, Verdict, act, ago
from sparkd.core.judging.load import Load
from sparkd.model.plan import EVERYTHING, MODEL_STARTS, RAY_STARTS
from sparkd.model.probe import OUTPUT_FAULTS, ProbeResult
from sparkd.model.spec import HostSpec


def power_key(host: str) -> str:
    """The budget key of a power cycle of `host` (`Action.key` of the action below)."""
    return f"power_cycle:{host}:{host}"


def wedge_evidence(ctx: Context, host: HostSpec) -> str | None:
    """Why the unreachable `host` is taken for wedged, or None."""
    error = ctx.facts[host.name].error
    if error is None or error.kind not in SILENT:
        return None
    omen = ctx.memory.kernel_omens.get(host.name)
    if omen is not None:
        return f"last kernel log seen: {omen}"
    silent = silent_for(ctx, host)
    if silent is not None and silent >= ctx.desired.power.unreachable_for:
        return f"unreachable for {ago(silent)}, past power.unreachable_for"
    return None


def silent_for(ctx: Context, host: HostSpec) -> float | None:
    since = ctx.memory.unreachable_since.get(host.name)
    return None if since is None else max(0.0, ctx.now - since)


def judge_wedged(ctx: Context, load: Load, fabric_sound: bool) -> Verdict:
    """An unreachable host that the evidence says is wedged: nothing is done on it or what
    depends on it; with `power.command`, it is power-cycled once the safety rule holds."""
    verdict = Verdict()
    for host in ctx.unreachable:
        evidence = wedge_evidence(ctx, host)
        if evidence is None:
            continue
        why = f"{host.name} wedged: needs a power cycle ({evidence})"
        refused: gate.Refusal | None = None
        if not ctx.desired.power.enabled:
            # The advice to a human passes the gate as the cycle itself would: a power cycle
            # sparkd would refuse is no advice either (with a command, the planner's gate
            # refuses the action itself).
            cycle = act("power_cycle", host.name, host.name, why)
            refused = gate.refusal(ctx, cycle)
            why = why if refused is None else gate.note(cycle, refused)
        verdict.holds.append(Hold(why, EVERYTHING, frozenset({host.name})))
        verdict.holds.append(Hold(why, RAY_STARTS | MODEL_STARTS))
        if refused is None:
            verdict.triage = ["host_wedged"]
        if not ctx.desired.power.enabled:
            verdict.notes.append(why)
            verdict.phase = "blocked"
            continue
        _power(ctx, verdict, host, why, evidence, load, fabric_sound)
    return verdict


def _power(
    ctx: Context,
    verdict: Verdict,
    host: HostSpec,
    why: str,
    evidence: str,
    load: Load,
    fabric_sound: bool,
) -> None:
    limit = ctx.desired.power.unreachable_for
    silent = silent_for(ctx, host) or 0.0
    tried = policy.incident(ctx.memory, power_key(host.name))
    if tried:
        last = tried[-1]
        after = ctx.now - last.at
        if not last.ok:
            verdict.notes.append(
                f"{why}; its power cycle {ago(after)} ago did not succeed (see the event): "
                "not tried again in this incident, it needs a human"
            )
            verdict.phase = "blocked"
        elif after < limit:
            verdict.notes.append(
                f"{why}; power-cycled {ago(after)} ago, waiting up to power.unreachable_for "
                f"({ago(limit)}) for it to boot"
            )
            verdict.phase = "unreachable"
        else:
            verdict.notes.append(
                f"{why}; still unreachable {ago(after)} after its power cycle: sparkd "
                "power-cycles a host once per incident, it needs a human"
            )
            verdict.phase = "blocked"
        return
    verdict.phase = "unreachable"
    if silent < limit:
        verdict.notes.append(
            f"{why}; power-cycling it once it has been unreachable for power.unreachable_for "
            f"({ago(silent)} of {ago(limit)} so far)"
        )
        return
    model = ctx.desired.model
    if fabric_sound and load.progressing(model.load_stall, model.load_timeout):
        verdict.notes.append(
            f"{why}; not power-cycling it while a load of {ctx.desired.name} progresses on a "
            f"sound fabric ({load.where})"
        )
        return
    serving = still_serving(ctx, host)
    if serving is not None:
        # Past the cap the host works but sparkd cannot reach it: a firewall on port 22, a dead
        # sshd, a route. Nothing sparkd does changes that; waiting on would never end.
        verdict.notes.append(
            f"{why}; not power-cycling it: {serving}; its SSH has been silent for {ago(silent)}: "
            f"check sshd, port {host.port} and the path from the ops box to {host.name}"
        )
        verdict.phase = "blocked"
        return
    error = ctx.facts[host.name].error
    failure = f"{error.kind}: {error.detail}" if error is not None and error.detail else "silent"
    reason = (
        f"power-cycling {host.name}: {evidence}; every look failed for {ago(silent)} ({failure}), "
        f"past power.unreachable_for ({ago(limit)}); no load progressing on a sound fabric; "
        f"{_unanswered(ctx)}; the first power cycle of this incident"
    )
    verdict.notes.append(reason)
    verdict.actions.append(act("power_cycle", host.name, host.name, reason))


def _unanswered(ctx: Context) -> str:
    """What was read of the model and Ray, as the reason says it: both are read through the
    head, so with the head silent they were not read at all, which is not "dead"."""
    ray = "no ALIVE Ray node" if ctx.observed.ray is not None else "Ray unread"
    probe = ctx.observed.probe or ctx.memory.last_probe
    model = "no answering model" if probe is not None else "the model unread"
    return f"{model}, {ray}"


def generated(probe: ProbeResult) -> bool:
    """Whether the engine produced tokens for this probe: a tensor-parallel engine whose rank on
    a wedged host could not take part in a step produces none. A healthy answer does, and so
    does an output fault (`no_answer`: the text in the wrong field), which says nothing against
    the hosts."""
    if probe.verdict.healthy is True or probe.outcome in OUTPUT_FAULTS:
        return True
    return probe.outcome == "garbled" and (probe.verdict.completion_tokens or 0) > 0


def still_serving(ctx: Context, host: HostSpec) -> str | None:
    """What says the silent `host` still does its work, or None."""
    since = ctx.memory.unreachable_since.get(host.name)
    probe = ctx.observed.probe or ctx.memory.last_probe
    # A probe from before the silence says nothing of the host now.
    recent = probe is not None and since is not None and probe.at >= since
    if probe is not None and recent and (generated(probe) or probe.busy):
        answer = "busy" if probe.busy else probe.outcome
        return f"the model answered a probe {ago(ctx.now - probe.at)} ago ({answer})"
    ray = ctx.observed.ray
    if ray is not None and ray.up and host.ip in ray.alive_ips:
        return f"the head's Ray lists its node ({host.ip}) ALIVE"
    return None

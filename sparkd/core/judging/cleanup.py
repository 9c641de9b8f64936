"""Stage 1, the hosts: reachability, stale units, conflicting containers, foreign GPU processes.

Unknown is never empty: a `systemctl show` or `nvidia-smi` that failed (common right after boot,
exactly when sparkd acts) holds what depends on it instead of reading as "nothing there".
"""

from __future__ import annotations

import fnmatch
import posixpath
import re

from sparkd.core.judging import triage
from sparkd.core.judging.judge import Context, Hold, Verdict, act, ago
from sparkd.core.spec import LABEL_CLUSTER, container_prefix
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import Container, GpuProcess, HostFacts
from sparkd.model.plan import EVERYTHING, MODEL_STARTS, RAY_STARTS, START_MODEL, Action
from sparkd.model.spec import HostSpec

# What nvidia-smi prints for a GPU that only a reboot brings back (it exits 15; the kernel logs
# Xid 79), as opposed to "couldn't communicate with the NVIDIA driver" while it loads after boot.
_GPU_LOST = re.compile(
    r"Unable to determine the device handle for GPU|GPU is lost|fallen off the bus|"
    r"\bXid\b\D{0,20}\b79\b",
    re.I,
)


# What nvidia-smi prints when the loaded kernel module and the NVML library differ (a driver
# upgraded without a reboot): "Failed to initialize NVML: Driver/library version mismatch"
# (NVML's NVML_ERROR_LIB_RM_VERSION_MISMATCH, nvml.h "RM detects a driver/library version
# mismatch"). It lasts until the new module is loaded.
_NVML_MISMATCH = re.compile(r"Driver/library version mismatch", re.I)


def gpu_lost(error: str | None) -> bool:
    return error is not None and bool(_GPU_LOST.search(error))


def ours(desired: ClusterSpec, container: Container) -> bool:
    return container.label(LABEL_CLUSTER) == desired.name and container.name.startswith(
        container_prefix(desired)
    )


def judge_reachability(ctx: Context) -> Verdict:
    """An unreachable host: nothing is done on it, nor what depends on it."""
    verdict = Verdict()
    for host in ctx.unreachable:
        error = ctx.facts[host.name].error
        kind = error.kind if error is not None else "unknown"
        detail = f": {error.detail}" if error is not None and error.detail else ""
        verdict.notes.append(
            f"{host.name} ({host.role}) unreachable ({kind}{detail}); "
            "leaving alone what depends on it"
        )
        verdict.holds.append(Hold(f"{host.name} unreachable", EVERYTHING, frozenset({host.name})))
        if host.role == "head":
            # Workers join the head and the model runs in it: nothing of Ray or the model.
            verdict.holds.append(Hold(f"{host.name} unreachable", RAY_STARTS | MODEL_STARTS))
        else:
            # A new model needs every GPU; a hung one on ALIVE Ray nodes may still be restarted.
            verdict.holds.append(Hold(f"{host.name} unreachable", START_MODEL))
    if verdict.notes:
        verdict.phase = "unreachable"
    for host in ctx.unreachable:
        capped = _refused_past_cap(ctx, host)
        if capped is not None:
            verdict.notes.append(capped)
            verdict.phase = "blocked"
    for host in ctx.reachable:
        docker = ctx.facts[host.name].docker_error
        if docker is None:
            continue
        # The host answers: nothing that needs Docker is done on it, the model is still probed.
        why = f"Docker on {host.name} not answering"
        verdict.notes.append(
            f"{host.name} ({host.role}) is up but Docker is not answering ({docker}); holding "
            "what needs Docker, still probing the model"
        )
        verdict.holds.append(Hold(why, EVERYTHING, frozenset({host.name})))
        verdict.holds.append(
            Hold(why, RAY_STARTS | MODEL_STARTS if host.role == "head" else START_MODEL)
        )
        verdict.phase = verdict.phase or "degraded"
    return verdict


# What a human checks when a host's SSH keeps refusing sparkd, by the answer.
REFUSAL_CHECKS = {
    "auth": "its key was refused: check that sparkd's public key (of ssh.key_file) is in "
    "~{user}/.ssh/authorized_keys on {host} and that ssh.user is right",
    "host_key": "its host key does not match the known one: check whether {host} was "
    "reinstalled or its address now leads elsewhere, then update sparkd's known_hosts",
    "refused": "its port {port} refuses connections while the host is up: check that sshd "
    "runs on {host} and listens on port {port}, and any firewall before it",
    "exit_nonzero": "its commands fail over SSH: check the login shell and any forced command "
    "of {user} on {host}",
}


def _refused_past_cap(ctx: Context, host: HostSpec) -> str | None:
    """A host whose SSH has answered sparkd with a refusal past `policy.hold_cap`: nothing sparkd
    does changes that (a power cycle of a host that answers is no remedy), so the wait ends in
    `blocked` with what a human should check. Not latched: it lifts once the host answers."""
    error = ctx.facts[host.name].error
    since = ctx.memory.refusing_since.get(host.name)
    if error is None or error.kind not in REFUSAL_CHECKS or since is None:
        return None
    cap = ctx.desired.policy.hold_cap
    if ctx.now - since < cap:
        return None
    check = REFUSAL_CHECKS[error.kind].format(
        user=ctx.desired.ssh.user, host=host.name, port=host.port
    )
    return (
        f"{host.name}'s SSH has refused sparkd ({error.kind}) for {ago(ctx.now - since)}, past "
        f"policy.hold_cap ({ago(cap)}): {check}"
    )


def owner_unknown_past_cap(ctx: Context, host: HostSpec) -> str | None:
    """A GPU process whose owner has stayed unknown past `policy.hold_cap`: one container's
    `docker top` failing for a look is a race with its exit, for that long it is Docker."""
    since = ctx.memory.owner_unknown_since.get(host.name)
    cap = ctx.desired.policy.hold_cap
    if since is None or ctx.now - since < cap:
        return None
    return (
        f"unknown for {ago(ctx.now - since)}, past policy.hold_cap ({ago(cap)}): check "
        f"`docker top` of each running container on {host.name} and the Docker daemon there"
    )


def gpu_unknown_past_cap(ctx: Context, host: HostSpec, error: str) -> str | None:
    """A host that answers but whose nvidia-smi has failed past `policy.hold_cap`: the driver
    loading after a boot is done well within, so what remains needs a human."""
    since = ctx.memory.gpu_unknown_since.get(host.name)
    cap = ctx.desired.policy.hold_cap
    if since is None or ctx.now - since < cap:
        return None
    if _NVML_MISMATCH.search(error):
        check = (
            "the NVIDIA kernel module and its user-space library differ (a driver upgrade "
            f"without a reboot): reboot {host.name}, or reload the nvidia modules"
        )
    else:
        check = f"check nvidia-smi and the NVIDIA driver on {host.name}"
    return (
        f"GPU processes on {host.name} unknown for {ago(ctx.now - since)}, past "
        f"policy.hold_cap ({ago(cap)}): nvidia-smi fails ({error}): {check}"
    )


def judge_cleanup(ctx: Context) -> Verdict:
    verdict = Verdict()
    stops: list[Action] = []
    removals: list[Action] = []
    for host in ctx.reachable:
        seen = ctx.facts[host.name]
        if seen.units_error is not None and ctx.desired.cleanup.units:
            why = f"stale units on {host.name} unknown ({seen.units_error})"
            verdict.notes.append(f"{why}; waiting")
            verdict.holds.append(Hold(why, RAY_STARTS, frozenset({host.name})))
            verdict.holds.append(Hold(why, START_MODEL))
        stops.extend(_stale_units(ctx.desired, host, seen))
        removals.extend(_conflicting(ctx.desired, host, seen))
    # Units first: a unit may own a container and would start it again.
    verdict.actions = stops + removals
    doomed = {(a.host, a.target) for a in removals}
    blockers = _gpu_processes(ctx, verdict, doomed)
    blockers = _disks(ctx, verdict) or blockers
    if verdict.actions:
        # A cleanup may be what clears a blocker (a stale unit running a bare-metal vLLM holds
        # the GPU): clean first, and judge again on the next look.
        verdict.phase = "cleaning"
        verdict.notes.insert(0, summarize(verdict.actions))
    elif blockers:
        verdict.phase = "blocked"
    return verdict


def _stale_units(desired: ClusterSpec, host: HostSpec, seen: HostFacts) -> list[Action]:
    found = []
    for unit_name in desired.cleanup.units:
        unit = seen.unit(unit_name)
        if unit is None or not unit.exists or not (unit.active or unit.enabled):
            continue
        state = f"{unit.active_state}/{unit.unit_file_state or 'no unit file state'}"
        found.append(act("stop_unit", host.name, unit_name, f"stale unit is {state}"))
    return found


def _conflicting(desired: ClusterSpec, host: HostSpec, seen: HostFacts) -> list[Action]:
    found = []
    for container in seen.containers:
        if ours(desired, container):
            continue
        if any(fnmatch.fnmatchcase(container.name, p) for p in desired.cleanup.container_patterns):
            found.append(
                act(
                    "remove_container",
                    host.name,
                    container.name,
                    f"conflicting container ({container.image}, {container.state})",
                )
            )
    return found


def _gpu_processes(ctx: Context, verdict: Verdict, doomed: set[tuple[str, str]]) -> bool:
    """Foreign GPU processes: killed where the policy allows, else a reason to block. Returns
    whether something only a human may fix holds a GPU."""
    desired = ctx.desired
    blocked = False
    for host in ctx.reachable:
        seen = ctx.facts[host.name]
        lost = triage.gpu_lost_evidence(seen, gpu_lost(seen.gpu_error))
        if lost is not None:
            # Nothing that needs a GPU can apply until the host is rebooted.
            why = f"the GPU of {host.name} is lost: needs a reboot of {host.name} ({lost})"
            verdict.notes.append(why)
            verdict.holds.append(Hold(why, RAY_STARTS | MODEL_STARTS))
            verdict.triage.append("gpu_lost")
            blocked = True
            continue
        if seen.gpu_error is not None:
            why = f"GPU processes on {host.name} unknown ({seen.gpu_error})"
            capped = gpu_unknown_past_cap(ctx, host, seen.gpu_error)
            verdict.notes.append(f"{why}; waiting" if capped is None else capped)
            verdict.holds.append(Hold(why, START_MODEL))
            blocked = blocked or capped is not None
            continue
        unknown: list[GpuProcess] = []
        kept: list[GpuProcess] = []
        for proc in _foreign(desired, seen, doomed):
            what = describe(proc)
            if proc.owner_unknown:
                unknown.append(proc)
            elif desired.policy.allow_kill_foreign_gpu:
                verdict.actions.append(
                    act(
                        "kill_gpu_process",
                        host.name,
                        str(proc.pid),
                        f"foreign GPU process {what}",
                        subject=proc.name,
                    )
                )
            else:
                kept.append(proc)
        # One note per host, however many processes a host lists.
        if unknown:
            why = (
                f"{_listed('GPU process', unknown)} on {host.name} "
                f"{'has an unknown owner' if len(unknown) == 1 else 'have unknown owners'} "
                "(a container's process list could not be read); never killed"
            )
            capped = owner_unknown_past_cap(ctx, host)
            verdict.notes.append(why if capped is None else f"{why}: {capped}")
            verdict.holds.append(Hold(why, START_MODEL))
            blocked = blocked or capped is not None
        if kept:
            it = "it" if len(kept) == 1 else "them"
            why = (
                f"{_listed('foreign GPU process', kept)} on {host.name}; "
                f"policy does not allow killing {it}"
            )
            verdict.notes.append(why)
            verdict.holds.append(Hold(why, START_MODEL))
            blocked = True
    return blocked


# A note names at most this many processes, then counts the rest.
MAX_LISTED = 5


def _listed(what: str, procs: list[GpuProcess]) -> str:
    if len(procs) == 1:
        return f"{what} {describe(procs[0])}"
    named = ", ".join(describe(p) for p in procs[:MAX_LISTED])
    rest = len(procs) - MAX_LISTED
    return f"{what}es {named}" + (f" and {rest} more" if rest > 0 else "")


def _disks(ctx: Context, verdict: Verdict) -> bool:
    """A full file system under model.log_dir: a launch would fail at its first write and its
    frozen log is no stalled load. Nothing is started there until a human frees space."""
    least = ctx.desired.model.min_disk_free
    full = False
    for host in ctx.reachable:
        seen = ctx.facts[host.name]
        found = [
            (free, where)
            for free, where in (
                (seen.disk_free_bytes, str(ctx.desired.model.log_dir)),
                (seen.docker_disk_free_bytes, "Docker's data root"),
            )
            if free is not None and free < least
        ]
        if not found:
            continue
        free, where = min(found)
        why = f"disk full on {host.name} ({free} bytes free)"
        verdict.notes.append(f"{why}; free space under {where}")
        verdict.holds.append(Hold(why, RAY_STARTS, frozenset({host.name})))
        verdict.holds.append(Hold(why, MODEL_STARTS if host.role == "head" else START_MODEL))
        full = True
    return full


def _foreign(
    desired: ClusterSpec, seen: HostFacts, doomed: set[tuple[str, str]]
) -> list[GpuProcess]:
    harmless = set(desired.cleanup.harmless_gpu_processes)
    found = []
    for proc in seen.gpu_processes:
        if proc.name in harmless or posixpath.basename(proc.name) in harmless:
            continue
        if proc.container is not None:
            owner = seen.container(proc.container)
            if owner is not None and ours(desired, owner):
                continue
            if (seen.name, proc.container) in doomed:
                continue  # goes away with its container
        found.append(proc)
    return found


def others_on_gpu(ctx: Context, host: HostSpec) -> list[GpuProcess]:
    """The processes on `host`'s GPU that are not sparkd's (nor harmless)."""
    return _foreign(ctx.desired, ctx.facts[host.name], set())


def describe(proc: GpuProcess) -> str:
    memory = f", {proc.used_memory_mib} MiB" if proc.used_memory_mib is not None else ""
    where = f" in container {proc.container}" if proc.container else ""
    return f"pid {proc.pid} ({proc.name}{memory}){where}"


def summarize(actions: list[Action]) -> str:
    units = sum(1 for a in actions if a.kind == "stop_unit")
    boxes = sum(1 for a in actions if a.kind == "remove_container")
    kills = sum(1 for a in actions if a.kind == "kill_gpu_process")
    parts = []
    if units:
        parts.append(f"{units} stale unit(s) to stop")
    if boxes:
        parts.append(f"{boxes} conflicting container(s) to remove")
    if kills:
        parts.append(f"{kills} foreign GPU process(es) to kill")
    return ", ".join(parts)

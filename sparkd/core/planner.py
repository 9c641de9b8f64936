"""The planner: `plan(desired, observed, memory, now) -> Plan`. Pure: no I/O, no clock.

Rules (DESIGN section 6), in dependency order: clean up on every reachable host; stop for a
human when something only a human may fix is in the way; leave alone what depends on an
unreachable host; Ray head, then workers; then the model, whose load is protected by a grace
while it progresses, and which is restarted only after repeated counted probe failures. Every
remediation is gated by a per-target budget (spent: latch `blocked`) and exponential backoff.
"""

from __future__ import annotations

import fnmatch
import posixpath
from dataclasses import dataclass, field

from sparkd.core import policy
from sparkd.core.spec import (
    LABEL_CLUSTER,
    LABEL_SPEC,
    container_name,
    model_spec_hash,
    normalize_image,
    ray_spec_hash,
)
from sparkd.model.memory import Memory
from sparkd.model.observed import Container, HostError, HostFacts, Observed, RayState
from sparkd.model.plan import Action, ActionKind, Phase, Plan
from sparkd.settings import ClusterSpec, HostSpec

# Phase precedence when several stages have work: the earliest stage names the plan.
STAGE_ORDER: tuple[Phase, ...] = (
    "unreachable",
    "cleaning",
    "starting_ray",
    "starting_model",
    "loading",
    "probing",
    "degraded",
    "healthy",
)


@dataclass
class _Draft:
    """The plan before budget, backoff, pause and dry-run are applied."""

    phase: Phase
    reason: str
    actions: list[Action] = field(default_factory=list)
    model_ready: bool = False
    ray_unsettled: bool = False


def plan(
    desired: ClusterSpec,
    observed: Observed,
    memory: Memory,
    now: float,
    *,
    dry_run: bool = False,
) -> Plan:
    name = desired.name
    if memory.paused is not None and memory.paused.active(now):
        draft = _draft(desired, observed, memory, now)
        pause = memory.paused
        until = f" until {_ago(pause.until - now)} from now" if pause.until is not None else ""
        return Plan(
            cluster=name,
            phase="paused",
            reason=f"paused by {pause.by}{until}: {pause.reason}",
            withheld=tuple(draft.actions),
            model_ready=draft.model_ready,
        )
    if memory.blocked is not None:
        return Plan(
            cluster=name,
            phase="blocked",
            reason=f"{memory.blocked.reason} (latched; `sparkd resume {name}` to retry)",
        )
    draft = _draft(desired, observed, memory, now)
    reset = draft.phase == "healthy" and (
        memory.healthy_since is not None
        and now - memory.healthy_since >= desired.policy.healthy_reset
        and memory.backoff_reset_at < memory.healthy_since
    )
    allowed: list[Action] = []
    withheld: list[Action] = []
    reason = draft.reason
    for action in draft.actions:
        if withheld:
            withheld.append(action)
            continue
        used = policy.budget_used(memory, action.key, desired.policy, now)
        if used >= desired.policy.budget and not dry_run:
            latch = (
                f"budget spent: {action.kind} {action.target} on {action.host} ran {used} times "
                f"within {_ago(desired.policy.budget_window)}; not fighting it any longer"
            )
            return Plan(
                cluster=name,
                phase="blocked",
                reason=latch,
                withheld=tuple(draft.actions),
                latch=latch,
                model_ready=draft.model_ready,
                ray_unsettled=draft.ray_unsettled,
            )
        wait_until = policy.backoff_until(memory, action.key, desired.policy, now)
        if now < wait_until:
            withheld.append(action)
            reason = (
                f"{draft.reason}; backing off {action.kind} {action.target} on {action.host} "
                f"for {_ago(wait_until - now)}"
            )
            continue
        allowed.append(action)
    if dry_run:
        return Plan(
            cluster=name,
            phase=draft.phase,
            reason=f"dry-run: {reason}",
            withheld=tuple(allowed + withheld),
            model_ready=draft.model_ready,
            reset_backoff=reset,
            ray_unsettled=draft.ray_unsettled,
        )
    return Plan(
        cluster=name,
        phase=draft.phase,
        reason=reason,
        actions=tuple(allowed),
        withheld=tuple(withheld),
        model_ready=draft.model_ready,
        reset_backoff=reset,
        ray_unsettled=draft.ray_unsettled,
    )


def _draft(desired: ClusterSpec, observed: Observed, memory: Memory, now: float) -> _Draft:
    facts = {h.name: _facts(observed, h) for h in desired.hosts}
    reachable = [h for h in desired.hosts if facts[h.name].reachable]
    unreachable = [h for h in desired.hosts if not facts[h.name].reachable]

    cleanup = _cleanup(desired, facts, reachable)
    doomed = {(a.host, a.target) for a in cleanup if a.kind == "remove_container"}
    foreign = _foreign_gpu_processes(desired, facts, reachable, doomed)
    blockers: list[str] = []
    kills: list[Action] = []
    for host, pid, what, name in foreign:
        if desired.policy.allow_kill_foreign_gpu:
            kills.append(
                Action(
                    kind="kill_gpu_process",
                    host=host,
                    target=str(pid),
                    reason=f"foreign GPU process {what}",
                    subject=name,
                )
            )
        else:
            blockers.append(
                f"foreign GPU process {what} on {host}; policy does not allow killing it"
            )
    blockers.extend(_missing_images(desired, facts, reachable))
    if blockers:
        if cleanup:
            # The cleanup may be what clears it (a stale unit running a bare-metal vLLM holds
            # the GPU): clean first, and judge again on the next look.
            reason = f"{_summarize_cleanup(cleanup)} first; then: {'; '.join(blockers)}"
            return _Draft("cleaning", reason, cleanup)
        return _Draft("blocked", "; ".join(blockers))

    actions = cleanup + kills
    stage: Phase | None = "cleaning" if actions else None
    notes = [f"{name} rebooted (boot id changed)" for name in policy.rebooted(observed, memory)]
    if actions:
        notes.append(_summarize_cleanup(actions))

    head = desired.head
    if not facts[head.name].reachable:
        notes.insert(0, _unreachable_note(unreachable, facts))
        return _Draft("unreachable", "; ".join(notes), actions)

    serving = observed.endpoint is not None and observed.endpoint.serves(desired.model.id)
    unsettled_for = (
        now - memory.ray_unsettled_since if memory.ray_unsettled_since is not None else 0.0
    )
    ray_actions, ray_wait = _ray(desired, facts, observed.ray, now, unsettled_for, serving)
    if ray_actions or ray_wait:
        actions.extend(ray_actions)
        unsettled = bool(ray_wait) and not ray_actions
        if unreachable:
            notes.insert(0, _unreachable_note(unreachable, facts))
            return _Draft("unreachable", "; ".join(notes), actions, ray_unsettled=unsettled)
        notes.append(ray_wait or _summarize(ray_actions))
        return _Draft(stage or "starting_ray", "; ".join(notes), actions, ray_unsettled=unsettled)

    if unreachable:
        notes.insert(0, _unreachable_note(unreachable, facts))
        return _Draft("unreachable", "; ".join(notes), actions)

    model = _model(desired, observed, memory, now)
    actions.extend(model.actions)
    notes.append(model.reason)
    return _Draft(stage or model.phase, "; ".join(notes), actions, model.model_ready)


def _facts(observed: Observed, host: HostSpec) -> HostFacts:
    found = observed.host(host.name)
    if found is not None:
        return found
    return HostFacts(name=host.name, error=HostError(kind="timeout", detail="not observed"))


def _action(kind: ActionKind, host: str, target: str, reason: str) -> Action:
    return Action(kind=kind, host=host, target=target, reason=reason)


def _ours(desired: ClusterSpec, container: Container) -> bool:
    return container.label(LABEL_CLUSTER) == desired.name and container.name.startswith(
        f"sparkd-{desired.name}-"
    )


def _cleanup(
    desired: ClusterSpec, facts: dict[str, HostFacts], reachable: list[HostSpec]
) -> list[Action]:
    stops: list[Action] = []
    removals: list[Action] = []
    for host in reachable:
        seen = facts[host.name]
        for unit_name in desired.cleanup.units:
            unit = seen.unit(unit_name)
            if unit is None or not unit.exists or not (unit.active or unit.enabled):
                continue
            state = f"{unit.active_state}/{unit.unit_file_state or 'no unit file state'}"
            stops.append(_action("stop_unit", host.name, unit_name, f"stale unit is {state}"))
        for container in seen.containers:
            if _ours(desired, container):
                continue
            patterns = desired.cleanup.container_patterns
            if any(fnmatch.fnmatchcase(container.name, p) for p in patterns):
                removals.append(
                    _action(
                        "remove_container",
                        host.name,
                        container.name,
                        f"conflicting container ({container.image}, {container.state})",
                    )
                )
    # Units first: a unit may own a container and would start it again.
    return stops + removals


def _foreign_gpu_processes(
    desired: ClusterSpec,
    facts: dict[str, HostFacts],
    reachable: list[HostSpec],
    doomed: set[tuple[str, str]],
) -> list[tuple[str, int, str, str]]:
    found: list[tuple[str, int, str, str]] = []
    harmless = set(desired.cleanup.harmless_gpu_processes)
    for host in reachable:
        seen = facts[host.name]
        for proc in seen.gpu_processes:
            if proc.name in harmless or posixpath.basename(proc.name) in harmless:
                continue
            if proc.container is not None:
                owner = seen.container(proc.container)
                if owner is not None and _ours(desired, owner):
                    continue
                if (host.name, proc.container) in doomed:
                    continue  # goes away with its container
            memory = f", {proc.used_memory_mib} MiB" if proc.used_memory_mib is not None else ""
            where = f" in container {proc.container}" if proc.container else ""
            what = f"pid {proc.pid} ({proc.name}{memory}){where}"
            found.append((host.name, proc.pid, what, proc.name))
    return found


def _missing_images(
    desired: ClusterSpec, facts: dict[str, HostFacts], reachable: list[HostSpec]
) -> list[str]:
    wanted = normalize_image(desired.ray.image)
    missing: list[str] = []
    for host in reachable:
        seen = facts[host.name]
        if seen.images is None:
            continue
        ours = seen.container(container_name(desired, host))
        if ours is not None and ours.running:
            continue
        if wanted not in {normalize_image(i) for i in seen.images}:
            missing.append(
                f"image {desired.ray.image} missing on {host.name} "
                "(containers start with --pull=never: pull it on the host)"
            )
    return missing


def _ray(
    desired: ClusterSpec,
    facts: dict[str, HostFacts],
    ray: RayState | None,
    now: float,
    unsettled_for: float,
    serving: bool,
) -> tuple[list[Action], str]:
    """Ray actions in dependency order, or a reason to wait for Ray to settle."""
    head = desired.head
    actions: list[Action] = []
    waits: list[str] = []
    head_box = facts[head.name].container(container_name(desired, head))
    new_head = False
    if head_box is None or not head_box.running:
        state = "missing" if head_box is None else f"{head_box.state} ({head_box.status})"
        actions.append(
            _action(
                "start_ray_head",
                head.name,
                container_name(desired, head),
                f"Ray head container {state}",
            )
        )
        new_head = True
    elif head_box.label(LABEL_SPEC) != ray_spec_hash(desired, head):
        actions.append(
            _action(
                "restart_ray",
                head.name,
                container_name(desired, head),
                f"spec drift: running {head_box.label(LABEL_SPEC)}, "
                f"desired {ray_spec_hash(desired, head)}",
            )
        )
        new_head = True
    elif ray is None or not ray.up:
        age = _age(head_box, now)
        error = ray.error if ray is not None else "not observed"
        # One failed read is no reason to reload a 100 GB model: restart only when Ray has
        # not answered for the join timeout, and never while the model answers.
        if (
            not serving
            and age is not None
            and age > desired.ray.join_timeout
            and unsettled_for > desired.ray.join_timeout
        ):
            actions.append(
                _action(
                    "restart_ray",
                    head.name,
                    container_name(desired, head),
                    f"Ray head not answering for {_ago(unsettled_for)}: {error}",
                )
            )
            new_head = True
        elif serving:
            waits.append(f"Ray not answering ({error}) but the model serves; watching")
        else:
            waits.append(f"Ray head not answering ({error})")

    configured = {h.ip for h in desired.hosts}
    known = ray is not None and ray.up and ray.ips_known
    strangers = sorted(ray.alive_ips - configured) if ray is not None and known else []
    for worker in desired.workers:
        seen = facts[worker.name]
        if not seen.reachable:
            continue
        name = container_name(desired, worker)
        box = seen.container(name)
        if new_head:
            if box is not None:
                actions.append(
                    _action("restart_ray", worker.name, name, "new Ray head: workers must rejoin")
                )
            else:
                actions.append(
                    _action("start_ray_worker", worker.name, name, "Ray worker container missing")
                )
            continue
        if box is None or not box.running:
            state = "missing" if box is None else f"{box.state} ({box.status})"
            actions.append(
                _action("start_ray_worker", worker.name, name, f"Ray worker container {state}")
            )
            continue
        if box.label(LABEL_SPEC) != ray_spec_hash(desired, worker):
            actions.append(
                _action(
                    "restart_ray",
                    worker.name,
                    name,
                    f"spec drift: running {box.label(LABEL_SPEC)}, "
                    f"desired {ray_spec_hash(desired, worker)}",
                )
            )
            continue
        if ray is None or not ray.up or not ray.ips_known or worker.ip in ray.alive_ips:
            continue
        age = _age(box, now)
        if strangers:
            actions.append(
                _action(
                    "restart_ray",
                    worker.name,
                    name,
                    f"Ray node registered on {', '.join(strangers)}, not a configured "
                    f"data IP; {worker.ip} missing (wrong interface)",
                )
            )
        elif age is not None and age > desired.ray.join_timeout:
            actions.append(
                _action(
                    "restart_ray",
                    worker.name,
                    name,
                    f"worker {worker.ip} not in Ray {_ago(age)} after start",
                )
            )
        else:
            waits.append(f"Ray worker {worker.name} joining")
    if actions:
        return actions, ""
    if waits:
        return [], "; ".join(waits)
    if ray is not None and ray.up and ray.gpus_total < desired.ray.expected_gpus:
        short = f"Ray sees {ray.gpus_total:g} of {desired.ray.expected_gpus} GPUs"
        if unsettled_for <= desired.ray.join_timeout:
            return [], f"{short}; waiting"
        # Workers whose node shows no GPU (or, without node IPs, every worker) rejoin.
        gpus = {n.ip: n.gpus for n in ray.nodes if n.alive}
        suspects = [
            w
            for w in desired.workers
            if facts[w.name].reachable and (not ray.ips_known or gpus.get(w.ip, 0.0) < 1.0)
        ]
        repairs = [
            _action(
                "restart_ray",
                w.name,
                container_name(desired, w),
                f"{short} for {_ago(unsettled_for)}; rejoining",
            )
            for w in suspects
        ]
        return repairs, "" if repairs else f"{short}; waiting"
    return [], ""


@dataclass
class _ModelStep:
    phase: Phase
    reason: str
    actions: list[Action] = field(default_factory=list)
    model_ready: bool = False


def _model(desired: ClusterSpec, observed: Observed, memory: Memory, now: float) -> _ModelStep:
    head = desired.head
    model_id = desired.model.id
    serve = observed.serve
    endpoint = observed.endpoint
    want = model_spec_hash(desired)

    def start(kind: ActionKind, why: str, phase: Phase = "starting_model") -> _ModelStep:
        return _ModelStep(phase, why, [_action(kind, head.name, model_id, why)])

    if serve is None or not serve.running:
        if endpoint is not None and endpoint.status == "up" and model_id not in endpoint.models:
            others = ", ".join(endpoint.models) or "nothing"
            return _ModelStep(
                "blocked",
                f"port {desired.model.port} on {head.name} already serves {others}, not "
                f"{model_id}: stop that server by hand",
            )
        last = f" (last log: {serve.log_tail[-1]})" if serve and serve.log_tail else ""
        if memory.launched_at is not None:
            return start("start_model", f"vllm serve exited{last}")
        return start("start_model", "Ray has its GPUs; vllm serve is not running")
    if serve.spec_hash is not None and serve.spec_hash != want:
        return start("restart_model", f"spec drift: serving {serve.spec_hash}, desired {want}")
    ray_nodes = observed.ray.alive_node_ids if observed.ray is not None else ()
    if memory.launch_nodes and ray_nodes and ray_nodes != memory.launch_nodes:
        return start(
            "restart_model", "Ray nodes changed since launch (a worker rejoined): actors are gone"
        )

    launch = _launch_time(observed, memory)
    ready = endpoint is not None and endpoint.serves(model_id)
    # Against the launch the host reports: a launch memory missed (a daemon killed
    # mid-start, a relaunch by hand) is still loading, not a ready model gone dark.
    ever_ready = memory.model_ready_at is not None and (
        launch is None or memory.model_ready_at >= launch
    )
    if not ready and not ever_ready:
        return _loading(desired, observed, launch, now)
    return _probe(desired, observed, memory, launch, ready)


def _launch_time(observed: Observed, memory: Memory) -> float | None:
    serve = observed.serve
    if serve is not None and serve.elapsed_seconds is not None:
        return observed.observed_at - serve.elapsed_seconds
    return memory.launched_at


def _loading(
    desired: ClusterSpec, observed: Observed, launch: float | None, now: float
) -> _ModelStep:
    head, model = desired.head, desired.model
    serve = observed.serve
    progress = serve.progress if serve is not None else None
    started = launch if launch is not None else now
    since_launch = max(0.0, now - started)
    last = started
    if progress is not None and progress.progress_at is not None:
        last = max(last, progress.progress_at)
    since_progress = max(0.0, now - last)
    where = _progress_text(observed)

    def restart(why: str) -> _ModelStep:
        action = _action("restart_model", head.name, model.id, why)
        return _ModelStep("starting_model", why, [action])

    if progress is not None and progress.stage == "failed":
        return restart(f"load failed: {progress.message or where}")
    if since_launch > model.load_timeout:
        return restart(
            f"load not finished after {_ago(since_launch)} "
            f"(load_timeout {_ago(model.load_timeout)})"
        )
    if since_progress > model.load_stall:
        return restart(
            f"load stalled: no progress for {_ago(since_progress)} "
            f"(load_stall {_ago(model.load_stall)}); {where}"
        )
    return _ModelStep(
        "loading",
        f"loading {where} after {_ago(since_launch)}; left alone while it progresses "
        f"(stall limit {_ago(model.load_stall)}, timeout {_ago(model.load_timeout)})",
    )


def _progress_text(observed: Observed) -> str:
    serve = observed.serve
    progress = serve.progress if serve is not None else None
    if progress is None:
        return "(no progress in the log yet)"
    if progress.stage == "weights" and progress.percent is not None:
        return f"weights {progress.percent:g}%"
    if progress.stage == "graph_capture":
        return "CUDA-graph capture"
    return progress.stage


def _probe(
    desired: ClusterSpec,
    observed: Observed,
    memory: Memory,
    launch: float | None,
    ready: bool,
) -> _ModelStep:
    head, model = desired.head, desired.model
    # Between probes (probe_interval > interval) the last probe of this launch still speaks.
    probe = observed.probe or memory.last_probe
    state = "serving" if ready else "not answering (it was ready)"
    fresh = probe is not None and (launch is None or probe.at >= launch - 1.0)
    if probe is None or not fresh:
        if ready:
            return _ModelStep("probing", f"model is {state}; waiting for a probe", model_ready=True)
        endpoint = observed.endpoint
        detail = endpoint.detail or endpoint.status if endpoint is not None else "not observed"
        return _ModelStep("degraded", f"model is {state}: {detail}", model_ready=False)
    verdict = probe.verdict
    latency = f" in {probe.latency_seconds:.2f}s" if probe.latency_seconds is not None else ""
    if verdict.healthy:
        tokens = verdict.completion_tokens
        count = f", {tokens} completion tokens" if tokens is not None else ""
        return _ModelStep("healthy", f"probe {verdict.outcome}{latency}{count}", model_ready=ready)
    if verdict.outcome == "not_run":
        return _ModelStep(
            "degraded", f"probe could not run ({verdict.detail}); not counted", model_ready=ready
        )
    if probe.busy:
        return _ModelStep(
            "degraded",
            f"busy: probe timed out{latency} while generation tokens keep flowing; not counted",
            model_ready=ready,
        )
    failures = policy.failures_after(memory, probe)
    threshold = desired.policy.failure_threshold
    what = f"probe {verdict.outcome}"
    if verdict.detail:
        what = f"{what}: {verdict.detail}"
    if failures >= threshold:
        why = f"{failures} consecutive failed probes (last: {what})"
        return _ModelStep(
            "degraded", why, [_action("restart_model", head.name, model.id, why)], ready
        )
    return _ModelStep("degraded", f"{what}; failure {failures} of {threshold}", model_ready=ready)


def _age(container: Container, now: float) -> float | None:
    if container.started_at is None:
        return None
    return max(0.0, now - container.started_at)


def _unreachable_note(hosts: list[HostSpec], facts: dict[str, HostFacts]) -> str:
    parts = []
    for host in hosts:
        error = facts[host.name].error
        kind = error.kind if error is not None else "unknown"
        detail = f": {error.detail}" if error is not None and error.detail else ""
        parts.append(f"{host.name} ({host.role}) unreachable ({kind}{detail})")
    return "; ".join(parts) + "; leaving alone what depends on it"


def _summarize_cleanup(actions: list[Action]) -> str:
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


def _summarize(actions: list[Action]) -> str:
    return "; ".join(f"{a.host}: {a.reason}" for a in actions)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 1 else f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"

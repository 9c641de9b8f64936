"""Stage 3, Ray: head, then workers, then whether Ray really has every node and GPU.

Ray's own view lags reality by 15-70 s: a killed node stays ALIVE for ~15 s, a hung one for
~65 s, and a node restarted at once shows twice on its IP for a while. So a (re)started node
counts as joined only when an ALIVE node on its data IP was first seen after its container
started; a GPU total never proves it. Until then Ray is settling, and nothing that needs every
GPU starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkd.core import policy
from sparkd.core.judging.images import ImageVerdict
from sparkd.core.judging.judge import Context, Hold, Verdict, act, ago
from sparkd.core.judging.load import Load
from sparkd.core.spec import (
    LABEL_SPEC,
    container_name,
    ray_spec_hash,
    ray_spec_hashes,
    short_image_id,
)
from sparkd.model.observed import Container, RayNode, RayState
from sparkd.model.plan import MODEL_STARTS, RAY_STARTS, START_MODEL, Action, ActionKind, Plan
from sparkd.model.spec import HostSpec

# Docker's figure for a container's start comes from whole seconds of process age. (A node is new
# when first seen at or after its container started: sparkd records the start of its own
# restarts exactly, and a new node needs seconds to register, so no slack is needed there.)
ETIME_RESOLUTION = 1.0


@dataclass
class RayVerdict(Verdict):
    # Every node joined with its GPU, as Ray itself says: a model may start.
    ready: bool = False
    # Ray answered (its view may still be settling).
    readable: bool = False
    # Waiting on Ray with no action taken: past the join timeout that is repaired.
    unsettled: bool = False
    waits: list[str] = field(default_factory=list)
    # Per host whose data link cannot carry Ray (down, or without its data IP): why, as noted.
    link_problems: list[str] = field(default_factory=list)


def judge_ray(ctx: Context, images: ImageVerdict, load: Load, serving: bool) -> RayVerdict:
    desired = ctx.desired
    verdict = RayVerdict()
    for host in ctx.reachable:
        problem = ctx.facts[host.name].link_problem(host.ip)
        if problem is not None:
            why = f"{host.name}: {problem}"
            verdict.notes.append(why)
            verdict.link_problems.append(why)
            verdict.holds.append(Hold(why, RAY_STARTS, frozenset({host.name})))
            verdict.holds.append(Hold(why, START_MODEL))
    if not ctx.head_reachable:
        return verdict
    ray = ctx.observed.ray
    busy_model = serving or load.progressing(desired.model.load_stall, desired.model.load_timeout)
    unsettled_for = _unsettled_for(ctx)
    new_head = _head(ctx, verdict, images, ray, busy_model, serving, unsettled_for)
    _workers(ctx, verdict, images, new_head)
    if ray is not None and ray.up and not new_head:
        _membership(ctx, verdict, ray, unsettled_for)
    if verdict.actions:
        verdict.holds.append(Hold("Ray is being (re)started", MODEL_STARTS))
        verdict.phase = "starting_ray"
        verdict.notes.append("; ".join(f"{a.host}: {a.reason}" for a in verdict.actions))
        return verdict
    verdict.readable = ray is not None and ray.up
    if verdict.waits:
        why = "; ".join(verdict.waits)
        verdict.notes.append(why)
        verdict.unsettled = True
        if verdict.readable:
            # Ray says positively that a node is missing: a model (re)start would fail.
            verdict.holds.append(Hold(f"Ray not ready ({why})", MODEL_STARTS))
        else:
            verdict.holds.append(Hold(f"Ray not ready ({why})", START_MODEL))
        if verdict.phase is None:
            verdict.phase = "starting_ray"
        return verdict
    verdict.ready = verdict.readable
    return verdict


def needs_ray_status(last: Plan | None) -> bool:
    """Whether the next look reads `ray status` beside the node list. A node listed ALIVE can
    be placed on only once `ray status` counts its GPU, a few seconds later: needed only while
    Ray is not ready. On a ready Ray (converged, or the model loading on it for 15-30 min) the
    node list alone says it stays so, one `ray` call a look."""
    return last is None or not (last.converged or last.learned.ray_ready)


def rejoin_workers(ctx: Context) -> list[Action]:
    """After a new Ray head, a restart of every reachable worker: none rejoins by itself."""
    return [
        act(
            "restart_ray",
            worker.name,
            container_name(ctx.desired, worker),
            "new Ray head: workers must rejoin (they never rejoin by themselves)",
        )
        for worker in ctx.desired.workers
        if ctx.facts[worker.name].reachable
    ]


def _head(
    ctx: Context,
    verdict: RayVerdict,
    images: ImageVerdict,
    ray: RayState | None,
    busy_model: bool,
    serving: bool,
    unsettled_for: float,
) -> bool:
    """The head's container and whether Ray answers. Returns whether a new head is planned."""
    desired = ctx.desired
    head = desired.head
    name = container_name(desired, head)
    if not ctx.facts[head.name].docker_up:
        return False  # its container is unknown, not missing (the hosts stage says why)
    box = ctx.facts[head.name].container(name)
    if box is None or not box.running:
        reason = _not_running("Ray head container", box)
        if _exited_again(ctx, verdict, images, "start_ray_head", head, box, reason):
            return False
        verdict.actions.append(act("start_ray_head", head.name, name, reason))
        return True
    drift = _drift(ctx, head, box, images)
    if drift is not None:
        verdict.actions.append(act("restart_ray", head.name, name, drift))
        return True
    if ray is not None and ray.up:
        return False
    error = ray.error if ray is not None else "not observed"
    age = _age(box, ctx.now)
    if busy_model:
        # Direct evidence outranks a failed read: a serve process whose load advances, or a
        # model that answers, runs on a working Ray. Not healthy, though: Ray is not verified.
        what = "the model serves" if serving else "the model's load advances"
        verdict.notes.append(f"Ray not answering ({error}) but {what}; watching")
        verdict.phase = "degraded" if serving else "loading"
        return False
    join = desired.ray.join_timeout
    if age is None and unsettled_for > join:
        _ageless(ctx, verdict, head, name, f"Ray head not answering ({error})", unsettled_for)
        return False
    if age is not None and age > join and unsettled_for > join:
        verdict.actions.append(
            act(
                "restart_ray",
                head.name,
                name,
                f"Ray head not answering for {ago(unsettled_for)}: {error}",
            )
        )
        return True
    verdict.waits.append(f"Ray head not answering ({error})")
    return False


def _workers(ctx: Context, verdict: RayVerdict, images: ImageVerdict, new_head: bool) -> None:
    desired = ctx.desired
    for worker in desired.workers:
        if not ctx.facts[worker.name].docker_up:
            continue  # unreachable, or Docker not answering: its container is unknown
        name = container_name(desired, worker)
        box = ctx.facts[worker.name].container(name)
        if new_head:
            if box is not None and box.running:
                reason = "new Ray head: workers must rejoin (they never rejoin by themselves)"
                verdict.actions.append(act("restart_ray", worker.name, name, reason))
            else:
                verdict.actions.append(
                    act("start_ray_worker", worker.name, name, "Ray worker container missing")
                )
            continue
        if box is None or not box.running:
            reason = _not_running("Ray worker container", box)
            if not _exited_again(ctx, verdict, images, "start_ray_worker", worker, box, reason):
                verdict.actions.append(act("start_ray_worker", worker.name, name, reason))
            continue
        drift = _drift(ctx, worker, box, images)
        if drift is not None:
            verdict.actions.append(act("restart_ray", worker.name, name, drift))


def _not_running(what: str, box: Container | None) -> str:
    """Why a Ray container is to be started: missing, or how it ended. An exited one is told by
    its exit code and its last line (the same words each time it fails the same way: Docker's
    `Exited (127) 3 seconds ago` changes every look)."""
    if box is None:
        return f"{what} missing"
    if box.exit_code is None:
        return f"{what} {box.state} ({box.status})"
    said = f": {box.last_line}" if box.last_line else ""
    return f"{what} exited {box.exit_code}{said}"


def _exited_again(
    ctx: Context,
    verdict: RayVerdict,
    images: ImageVerdict,
    kind: ActionKind,
    host: HostSpec,
    box: Container | None,
    reason: str,
) -> bool:
    """Whether a Ray container of the desired spec and image failed the same way twice: it
    exited with an error (1-127: not a signal, which is someone else's doing) and the same last
    line as when sparkd last started it for that, with no lasting health since (the same
    incident: health that lasts forgives older attempts). Another start would fail the same way
    (an image without `ray` exits 127 at once, `ray: not found`): `blocked`, with what the
    container said, until the image or the spec changes (or `sparkd resume`)."""
    if box is None or box.exit_code is None or not 0 < box.exit_code < 128:
        return False
    if box.last_line is None or _drift(ctx, host, box, images) is not None:
        return False
    name = container_name(ctx.desired, host)
    tried = policy.incident(ctx.memory, f"{kind}:{host.name}:{name}")
    if not tried or tried[-1].reason != reason:
        return False
    check = (
        f"check that {ctx.desired.ray.image} has `ray` (NVIDIA's vLLM images ship without it "
        "from 26.05: install it in the image)"
        if box.exit_code == 127
        else f"check the image and `docker logs {name}` on {host.name}"
    )
    why = (
        f"{host.name}: the Ray container exited {box.exit_code} after each of two starts: "
        f"{box.last_line}; a restart cannot cure it: {check}"
    )
    verdict.phase = "blocked"
    verdict.notes.append(why)
    verdict.holds.append(Hold(why, RAY_STARTS, frozenset({host.name})))
    verdict.holds.append(Hold(why, START_MODEL))
    return True


def _drift(ctx: Context, host: HostSpec, box: Container, images: ImageVerdict) -> str | None:
    if images.unsafe:
        return None  # never replace a container before the image is right everywhere
    want = ray_spec_hash(ctx.desired, host)
    running = box.label(LABEL_SPEC)
    if running not in ray_spec_hashes(ctx.desired, host):
        return f"spec drift: running {running}, desired {want}"
    if images.image_id is not None and box.image_id is not None and box.image_id != images.image_id:
        return (
            f"image re-pulled: running {short_image_id(box.image_id)}, "
            f"{ctx.desired.ray.image} is now {short_image_id(images.image_id)}"
        )
    return None


def _membership(ctx: Context, verdict: RayVerdict, ray: RayState, unsettled_for: float) -> None:
    """Whether each configured host has exactly one, new, ALIVE node with its GPU."""
    desired = ctx.desired
    expected = desired.ray.expected_gpus
    alive = [n for n in ray.nodes if n.alive]
    if not ray.ips_known:
        _membership_by_count(ctx, verdict, ray, alive, unsettled_for)
        return
    configured = {h.ip for h in desired.hosts}
    strangers = sorted({n.ip for n in alive} - configured)
    join = desired.ray.join_timeout
    repairs: list[Action] = []
    acting = {a.host for a in verdict.actions}
    # Hosts with no ALIVE node on their data IP: who a stranger node may belong to.
    missing = [h for h in desired.hosts if not any(n.ip == h.ip for n in alive)]
    for host in desired.hosts:
        if host.name in acting:
            continue  # already being (re)started
        name = container_name(desired, host)
        on_ip = [n for n in alive if n.ip == host.ip]
        reachable = ctx.facts[host.name].reachable
        box = ctx.facts[host.name].container(name) if reachable else None
        started = _started(ctx, host.name, box)
        settling: tuple[str, str] | None = None
        if len(on_ip) > 1:
            settling = (
                f"Ray settling: {len(on_ip)} ALIVE nodes on {host.ip} (a dead one not yet dropped)",
                f"Ray still shows {len(on_ip)} nodes on {host.ip}",
            )
        elif on_ip and started is not None and _first_seen(ctx, on_ip[0]) < started:
            settling = (
                f"Ray settling: node {on_ip[0].node_id[:8]} on {host.ip} registered before "
                f"{host.name}'s Ray container started (waiting for a new node id)",
                f"{host.name} not rejoined Ray with a new node id",
            )
        if settling is not None:
            wait, overdue = settling
            verdict.waits.append(wait)
            if unsettled_for > join and reachable:
                reason = f"{overdue} after {ago(unsettled_for)}"
                repairs.append(act("restart_ray", host.name, name, reason))
            continue
        if len(on_ip) == 1:
            node = on_ip[0]
            if node.gpus < 1.0 and reachable:
                repairs.append(
                    act(
                        "restart_ray",
                        host.name,
                        name,
                        f"Ray node on {host.ip} registered with {node.gpus:g} GPUs",
                    )
                )
            continue
        if not reachable:
            verdict.waits.append(f"Ray has no node of unreachable {host.name}")
            continue
        age = _age(box, ctx.now) if box is not None else None
        theirs = _strangers_of(ctx, host, strangers, missing)
        # Its own management address is proof at once; an unowned one only once it is late.
        if theirs and (host.address in theirs or age is None or age > join):
            repairs.append(
                act(
                    "restart_ray",
                    host.name,
                    name,
                    f"Ray node registered on {', '.join(theirs)}, not a configured data IP; "
                    f"{host.ip} missing (wrong interface)",
                )
            )
            continue
        if age is not None and age > join:
            repairs.append(
                act(
                    "restart_ray",
                    host.name,
                    name,
                    f"{host.name} ({host.ip}) not in Ray {ago(age)} after start",
                )
            )
        elif age is None and box is not None and unsettled_for > join:
            _ageless(ctx, verdict, host, name, f"{host.name} ({host.ip}) not in Ray", unsettled_for)
        else:
            verdict.waits.append(f"Ray node on {host.name} joining")
    head_repair = next((a for a in repairs if a.host == desired.head.name), None)
    if head_repair is not None:
        # A new head means every worker rejoins: repair the head, and the workers follow.
        verdict.actions.append(head_repair)
        verdict.actions.extend(rejoin_workers(ctx))
        return
    verdict.actions.extend(repairs)
    if repairs or verdict.waits:
        return
    total = sum(n.gpus for n in alive)
    if total < expected or ray.gpus_total < expected:
        _short(ctx, verdict, ray, unsettled_for, "")
    elif ray.gpus_usable is not None and ray.gpus_usable < expected:
        usable = f"every node listed, {ray.gpus_usable:g} of {expected} GPUs usable"
        join = ctx.desired.ray.join_timeout
        if unsettled_for <= join:
            verdict.waits.append(f"Ray settling: {usable} yet")
            return
        # A GPU counted seconds after its node is listed is Ray settling; for longer it is a
        # report that stopped updating (autoscaler v1's `ray status` is what its monitor last
        # wrote to Ray's KV) or a layout not read. No node can be named: a human looks.
        verdict.phase = "blocked"
        verdict.waits.append(
            f"Ray's node list and `ray status` disagree for {ago(unsettled_for)}, past "
            f"ray.join_timeout ({ago(join)}): {usable} by `ray status`; check `ray status` on "
            f"{ctx.desired.head.name} (the autoscaler's report and its time)"
        )


def _ageless(
    ctx: Context, verdict: RayVerdict, host: HostSpec, name: str, what: str, waited: float
) -> None:
    """A Ray container whose start cannot be read (sparkd takes it from its processes' age, by
    `docker top`), with Ray unsettled past `ray.join_timeout` on sparkd's own looks. Its age is
    what tells a node that has failed to join from one that just (re)started (Docker's restart
    policy, a human): a restart on unknown age may cut a start short, so none; and the wait
    ends, `blocked` with what to check. Not latched: an age read, or Ray settling, lifts it."""
    join = ctx.desired.ray.join_timeout
    verdict.phase = "blocked"
    verdict.waits.append(
        f"{what} for {ago(waited)}, past ray.join_timeout ({ago(join)}), and when {name} "
        f"started is unknown (its processes' age unread): not restarting it on that; check "
        f"`docker top {name}` and `docker logs {name}` on {host.name}"
    )


def _strangers_of(
    ctx: Context, host: HostSpec, strangers: list[str], missing: list[HostSpec]
) -> list[str]:
    """The stranger nodes that are evidence against `host`: one on its management address
    (Ray picked the default route's interface), or, when no stranger names a host that way and
    `host` is the only one missing, all of them. A stranger never blames every missing host."""
    addresses = {h.address: h for h in ctx.desired.hosts}
    own = [ip for ip in strangers if ip == host.address]
    if own:
        return own
    unowned = [ip for ip in strangers if ip not in addresses]
    if unowned and len(missing) == 1 and missing[0].name == host.name:
        return unowned
    return []


def _membership_by_count(
    ctx: Context, verdict: RayVerdict, ray: RayState, alive: list[RayNode], unsettled_for: float
) -> None:
    """`ray status` names nodes but not their IPs: count them, and check that every restarted
    container has a node first seen after it started."""
    desired = ctx.desired
    hosts = len(desired.hosts)
    expected = desired.ray.expected_gpus
    if len(alive) > hosts or ray.gpus_total > expected:
        verdict.waits.append(
            f"Ray settling: {len(alive)} nodes, {ray.gpus_total:g} GPUs counted "
            "(a dead node not yet dropped)"
        )
        return
    starts = sorted(
        (s for h in desired.hosts if (s := _started(ctx, h.name, _box(ctx, h))) is not None),
        reverse=True,
    )
    seen = sorted((_first_seen(ctx, n) for n in alive), reverse=True)
    # Nested sets: the k latest-started containers need k nodes first seen after the k-th.
    for k, start in enumerate(starts, 1):
        if sum(1 for s in seen if s >= start) < k:
            verdict.waits.append("Ray settling: waiting for restarted nodes to register anew")
            return
    if len(alive) < hosts or ray.gpus_total < expected:
        _short(ctx, verdict, ray, unsettled_for, " (`ray status` does not say which node)")


def _short(
    ctx: Context, verdict: RayVerdict, ray: RayState, unsettled_for: float, which: str
) -> None:
    expected = ctx.desired.ray.expected_gpus
    short = f"Ray sees {ray.gpus_total:g} of {expected} GPUs"
    if unsettled_for <= ctx.desired.ray.join_timeout:
        verdict.waits.append(f"{short}; waiting")
        return
    # No node can be named: restarting a healthy one would not help. A human looks.
    verdict.phase = "blocked"
    verdict.waits.append(f"Ray short of GPUs for {ago(unsettled_for)}: {short}{which}")


def _unsettled_for(ctx: Context) -> float:
    """How long Ray has been settling, in daemon time, but never longer than its youngest
    container has existed as its host reports (a container's age cannot step): a restarted
    node starts its own wait, and a stamp carried across a reboot of the ops box cannot
    stretch it."""
    since = ctx.memory.ray_unsettled_since
    if since is None:
        return 0.0
    waited = max(0.0, ctx.now - since)
    ages = [
        age
        for host in ctx.desired.hosts
        if (box := _box(ctx, host)) is not None
        and box.running
        and (age := _age(box, ctx.now)) is not None
    ]
    return min([waited, *ages])


def _box(ctx: Context, host: HostSpec) -> Container | None:
    seen = ctx.facts[host.name]
    return seen.container(container_name(ctx.desired, host)) if seen.reachable else None


def _started(ctx: Context, host: str, box: Container | None) -> float | None:
    """When the host's Ray container last started, as a lower bound: sparkd's own record of
    its (re)start, unless Docker says the container started again since. Docker's figure comes
    from whole seconds of process age, so the start may lie up to a second before it."""
    recorded = ctx.memory.ray_started.get(host)
    docker = (
        box.started_at - ETIME_RESOLUTION
        if box is not None and box.running and box.started_at is not None
        else None
    )
    if docker is None:
        return recorded
    if recorded is None or docker > recorded + ETIME_RESOLUTION:
        return docker
    return recorded


def _first_seen(ctx: Context, node: RayNode) -> float:
    return ctx.memory.ray_seen.get(node.node_id, ctx.observed.observed_at)


def _age(box: Container, now: float) -> float | None:
    if box.started_at is None:
        return None
    return max(0.0, now - box.started_at)

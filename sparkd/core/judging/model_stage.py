"""Stage 4, the model: `vllm serve` in the head container, started once Ray has its GPUs.

A load fails only on evidence: the serve process exited, or a signature that the engine is gone.
A live load that advances is left alone up to `load_timeout`; one that stopped advancing for
`load_stall` is restarted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sparkd.core.judging.cleanup import describe, others_on_gpu
from sparkd.core.judging.images import ImageVerdict
from sparkd.core.judging.judge import Context, Hold, Verdict, act, ago
from sparkd.core.judging.load import Load
from sparkd.core.judging.ray_stage import RayVerdict, rejoin_workers
from sparkd.core.reading.placement import placed_nodes, placement_waiting
from sparkd.core.spec import container_name, model_spec_hash, model_spec_hashes
from sparkd.model.plan import MODEL_STARTS, START_MODEL, ActionKind


@dataclass
class ModelVerdict(Verdict):
    # The load is over: the probe stage judges the model.
    to_probe: bool = False
    # Waiting for a stopped serve's engine processes to go: past ORPHAN_GRACE, Ray is restarted.
    waiting: bool = False
    # This launch failed on evidence that another try of the same spec would fail the same way
    # (an argument error, an engine that failed to start, a load that stalled or timed out): a
    # rollout goes back to the last-good spec rather than try again (core.deciding.rollout).
    failed: str | None = None
    # The launch failed for GPU memory another process held (`memory_held`, for remember()).
    memory_held: bool = False


# A serve stopped by SIGTERM takes its engine with it within ~2.5 s; one that stays longer was
# orphaned (its API server SIGKILLed) and stays for good. Waited out for this share of Ray's
# join_timeout (30 s at the default), like the other waits on Ray's side.
ORPHAN_GRACE = 0.25


def judge_model(
    ctx: Context, ray: RayVerdict, load: Load, serving: bool, images: ImageVerdict
) -> ModelVerdict:
    desired = ctx.desired
    verdict = ModelVerdict()
    serve = ctx.observed.serve
    endpoint = ctx.observed.endpoint
    if not ctx.head_reachable:
        return verdict
    head = desired.head.name
    if serve is None:
        # Docker did not answer: the serve process is unknown, but the model's port still
        # answers over SSH. A model that serves, or was ready, is still probed.
        docker_down = not ctx.facts[head].docker_up
        verdict.to_probe = docker_down and (serving or ctx.memory.model_ready_at is not None)
        return verdict
    name = ctx.model_name

    def start(kind: ActionKind, why: str, failed: bool = False) -> ModelVerdict:
        verdict.phase = "starting_model"
        verdict.notes.append(why)
        verdict.actions.append(act(kind, head, desired.model.id, why))
        verdict.failed = why if failed else None
        return verdict

    if not serve.running and serve.orphans and serving:
        return _served_unrecognised(ctx, verdict, serve.orphans)
    if not serve.running and serve.orphans:
        return _orphans(ctx, verdict, ray, serve.orphans)
    if not serve.running and serving:
        return _served_elsewhere(ctx, verdict)
    if not serve.running:
        if endpoint is not None and endpoint.status == "up" and name not in endpoint.models:
            others = ", ".join(endpoint.models) or "nothing"
            verdict.phase = "blocked"
            verdict.notes.append(
                f"port {desired.model.port} on {head} already serves {others}, not {name}: "
                "stop that server by hand"
            )
            return verdict
        last = f" (last log: {serve.log_tail[-1]})" if serve.log_tail else ""
        # The log's tail is its latest launch's: one that exited at once (an argument error)
        # never counted as launched, yet says why it will fail again.
        cause = exit_cause(serve.log_tail)
        held = held_by_others(ctx, serve.log_tail) if cause is not None else None
        if cause is not None and held is not None:
            return _host_memory(ctx, verdict, start, "start_model", cause, held)
        if cause is not None and _retry_after_memory(ctx, serve.log_tail):
            return start("start_model", f"{_RETRY}: {cause}")
        if cause is not None:
            return start("start_model", f"vllm serve exited: {cause}", failed=True)
        if ctx.memory.launched_at is not None:
            return start("start_model", f"vllm serve exited{last}")
        return start("start_model", "vllm serve is not running")
    key = ctx.observed.api_key_fingerprint
    want = model_spec_hash(desired, key)
    # A configured key that could not be read says nothing about drift (the endpoint reports
    # the unreadable file); judged without it, every keyed model would look drifted.
    key_unknown = desired.model.api_key_file is not None and key is None
    drifted = (
        not key_unknown
        and serve.spec_hash is not None
        and serve.spec_hash not in model_spec_hashes(desired, key)
    )
    if drifted and images.unsafe:
        # A restart now would load the old image again, 15-30 min for nothing, and once more
        # when the image arrives: drift rolls once, Ray then model, when the image is right.
        verdict.notes.append(
            f"spec drift (serving {serve.spec_hash}, desired {want}) waits until the image is "
            "the same on every host"
        )
    elif drifted:
        return start("restart_model", f"spec drift: serving {serve.spec_hash}, desired {want}")
    rejoined = _rejoined(ctx)
    if ray.ready and rejoined:
        return start(
            "restart_model",
            f"Ray nodes changed since launch (a node rejoined with a new id): {rejoined}'s "
            "node is not one the model was launched on; the model's Ray actors are gone",
        )
    if load.was_ready:
        verdict.to_probe = True
        return verdict
    model = desired.model
    if load.failed is not None:
        held = held_by_others(ctx, serve.log_tail)
        if held is not None:
            return _host_memory(ctx, verdict, start, "restart_model", load.failed, held)
        if _retry_after_memory(ctx, serve.log_tail):
            return start("restart_model", f"{_RETRY}: {load.failed}")
        return start("restart_model", f"load failed: {load.failed}", failed=True)
    if load.overdue is not None:
        return start("restart_model", f"load stuck in a silent stage: {load.overdue}", failed=True)
    if load.since_launch > model.load_timeout:
        return start(
            "restart_model",
            f"load not finished after {ago(load.since_launch)} "
            f"(load_timeout {ago(model.load_timeout)})",
            failed=True,
        )
    if load.stalled_for > model.load_stall:
        return start(
            "restart_model",
            f"load stalled: no progress for {ago(load.stalled_for)} "
            f"(load_stall {ago(model.load_stall)}); {load.where}",
            failed=True,
        )
    verdict.phase = "loading"
    verdict.notes.append(
        f"loading {load.where} after {ago(load.since_launch)}; left alone while it progresses "
        f"(stall limit {ago(model.load_stall)}, timeout {ago(model.load_timeout)})"
    )
    return verdict


# argparse's last line on a bad argument (`vllm: error: unrecognized arguments: ...` in vLLM
# 0.32, `vllm serve: error: ...` for a bad value), exit status 2.
_ARG_ERROR = re.compile(r"^(?:usage: .*\n)?(vllm(?: serve)?: error: .+)$")
# An exception line of a traceback (`FileNotFoundError: ...`, `torch.OutOfMemoryError: ...`).
_EXCEPTION = re.compile(r"(?:^|\s)((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): .+)$")
_WRAPPER = "Engine core initialization failed"
# vLLM's check at engine start that the GPU has the free memory `gpu_memory_utilization` asks
# for (vllm-project/vllm `vllm/v1/worker/utils.py` `request_memory`, main at 0027b02, from the
# worker's device init in `vllm/v1/worker/gpu_worker.py`): "Free memory on device cuda:0
# (F/T GiB) on startup is less than desired GPU memory utilization (U, R GiB). Decrease GPU
# memory utilization or reduce GPU memory used by other processes." It compares against what is
# free now: what another process holds (on GB10 out of the same unified memory) fails it.
_FREE_MEMORY = re.compile(
    r"Free memory on device\b.{0,80}on startup is less than desired GPU memory utilization"
)


def held_by_others(ctx: Context, log_tail: tuple[str, ...]) -> str | None:
    """Who else holds GPU memory, when the launch failed vLLM's free-memory check: processes
    on a host's GPU outside sparkd's containers, and engine processes a stopped serve left
    behind. None when the log shows no such failure, or nobody else is listed (then the
    spec's `gpu_memory_utilization` is what asked too much)."""
    if not any(_FREE_MEMORY.search(line) for line in log_tail):
        return None
    serve = ctx.observed.serve
    held = [f"{what} on {ctx.desired.head.name}" for what in (serve.orphans if serve else ())]
    for host in ctx.reachable:
        held.extend(f"{describe(p)} on {host.name}" for p in others_on_gpu(ctx, host))
    return ", ".join(held) or None


def _host_memory(
    ctx: Context,
    verdict: ModelVerdict,
    start: Callable[[ActionKind, str, bool], ModelVerdict],
    kind: ActionKind,
    failure: str,
    held: str,
) -> ModelVerdict:
    """A launch that failed for GPU memory another process holds: the host's state, not the
    spec. No rollback and no budget: the start waits (a hold) until those processes are gone
    (the hosts stage kills a foreign one where the policy allows, or says `blocked`)."""
    why = (
        f"the launch failed for GPU memory held by others ({held}): the host's state, not the "
        f"spec ({failure}); waiting for them to go"
    )
    verdict.holds.append(Hold(why, MODEL_STARTS))
    verdict.memory_held = True
    return start(kind, why, False)


_RETRY = (
    "starting again: the last launch failed for GPU memory another process held then, which "
    "says nothing of the spec"
)


def _retry_after_memory(ctx: Context, log_tail: tuple[str, ...]) -> bool:
    """The free-memory failure in the log is the launch that met another process's memory
    (`Memory.memory_held`), now gone: the next start is a retry, not the spec's failure."""
    return ctx.memory.memory_held and any(_FREE_MEMORY.search(line) for line in log_tail)


def exit_cause(log_tail: tuple[str, ...]) -> str | None:
    """Why a serve that exited will fail again with the same spec: an argument error, or an
    engine that failed to start (the root cause, not vLLM's wrapping RuntimeError). None for an
    exit that says nothing of the spec (a crash after it served, a signal)."""
    for line in reversed(log_tail):
        match = _ARG_ERROR.match(line.strip())
        if match:
            return f"argument error: {match.group(1)}"
    if not any(_WRAPPER in line or "EngineCore failed to start" in line for line in log_tail):
        return None
    causes = [m.group(1) for line in log_tail if (m := _EXCEPTION.search(line.strip()))]
    roots = [c for c in causes if _WRAPPER not in c]
    return f"engine failed to start: {(roots or causes or [_WRAPPER])[-1]}"


def _served_unrecognised(
    ctx: Context, verdict: ModelVerdict, engines: tuple[str, ...]
) -> ModelVerdict:
    """The engine processes of a model that answers: its API server runs under a command line
    that is not `vllm serve` (an operator's `python3 -m vllm.entrypoints.openai.api_server`,
    which vLLM 0.32.0 still runs: entrypoints/openai/api_server.py). The same processes as a
    SIGKILLed API server's orphans, but an endpoint that lists the served name with /health 200
    rules that out: a teardown of Ray would stop a model that serves. Left serving, named for
    the operator; no start on top of it. If it stops answering, the orphans' grace applies."""
    desired = ctx.desired
    head = desired.head.name
    why = (
        f"{ctx.model_name} answers on {head}:{desired.model.port}, served by a process that is "
        f"not `vllm serve` ({', '.join(engines)} in {head}'s Ray container): sparkd leaves it "
        "serving and cannot restart it; restart it with `vllm serve` for sparkd to manage it"
    )
    verdict.holds.append(Hold(why, START_MODEL))
    verdict.phase = "degraded"
    verdict.notes.append(why)
    return verdict


def _served_elsewhere(ctx: Context, verdict: ModelVerdict) -> ModelVerdict:
    """The port answers with the served name and /health 200 while no `vllm serve` (nor any
    engine process) runs in the head's Ray container: a server sparkd does not run holds the
    port (an operator's own container with host networking, or one on the host itself). A start
    on top cannot make the port serve better: vLLM binds its socket before it builds its engine,
    with SO_REUSEPORT in the releases that set it (entrypoints/openai/api_server.py
    `setup_server`, `create_server_socket`), so the second server either fails for the port
    (counted against the spec) or loads a second engine into the memory the first one uses.
    Left serving, named; once it stops answering, sparkd starts its own."""
    desired = ctx.desired
    head = desired.head.name
    why = (
        f"{ctx.model_name} answers on {head}:{desired.model.port}, but no `vllm serve` runs in "
        f"{head}'s Ray container: a server sparkd does not run holds the port (another "
        "container, or the host itself); not starting a second one on top of it: stop that "
        "server for sparkd to launch its own"
    )
    verdict.holds.append(Hold(why, START_MODEL))
    verdict.phase = "degraded"
    verdict.notes.append(why)
    return verdict


def _orphans(
    ctx: Context, verdict: ModelVerdict, ray: RayVerdict, orphans: tuple[str, ...]
) -> ModelVerdict:
    """vLLM's engine outlives a SIGKILLed API server and keeps the GPUs (vLLM issue 55510): a
    launch now would fail for memory. Past a grace, Ray's containers go, and the engine with
    them; until then, no model start."""
    desired = ctx.desired
    head = desired.head.name
    why = (
        f"no vllm serve, but engine processes still hold the GPUs in {head}'s Ray container: "
        f"{', '.join(orphans)}"
    )
    verdict.holds.append(Hold(why, START_MODEL))
    verdict.phase = "starting_model"
    if ray.actions:
        verdict.notes.append(f"{why}; they go with Ray's restart")
        return verdict
    since = ctx.memory.ray_unsettled_since
    waited = ctx.now - since if since is not None else 0.0
    if waited <= ORPHAN_GRACE * desired.ray.join_timeout:
        verdict.waiting = True
        verdict.notes.append(f"{why}; waiting for them to exit")
        return verdict
    verdict.phase = "starting_ray"
    reason = f"{why} after {ago(waited)}"
    verdict.notes.append(reason)
    verdict.actions.append(act("restart_ray", head, container_name(desired, desired.head), reason))
    verdict.actions.extend(rejoin_workers(ctx))
    return verdict


def _rejoined(ctx: Context) -> str | None:
    """The configured host whose Ray node is not one the model was launched on: it rejoined with a
    new id, and the model's actors there are gone. Only the configured hosts' addresses count: a
    node Ray lists on any other address (a machine someone joined to the cluster by hand) coming or
    going says nothing of the model's actors on the configured hosts, and a restart of a serving
    model for it drops every request in flight. A launch node that is gone with no new node on a
    configured host leaves Ray short (core.judging.ray_stage's to judge).

    The nodes are the ones the log says the placement group went to, where it names them; else
    the ones Ray listed alive when sparkd launched (a look can list a node whose container has
    just exited). A launch whose log shows its placement group still waiting has no actors on any
    node: the node that joins is where the group goes, and a relaunch would only start the wait
    again (core.reading.placement)."""
    ray = ctx.observed.ray
    if placement_waiting(ctx.observed.serve):
        return None
    launch = set(placed_nodes(ctx.observed.serve) or ctx.memory.launch_nodes)
    if ray is None or not launch:
        return None
    for host in ctx.desired.hosts:
        ours = {host.data_ip, host.address}
        for node in ray.nodes:
            if node.alive and node.ip in ours and node.node_id not in launch:
                return host.name
    return None

"""Stage 4, the model: `vllm serve` in the head container, started once Ray has its GPUs.

A load fails only on evidence: the serve process exited, or a signature that the engine is gone.
A live load that advances is left alone up to `load_timeout`; one that stopped advancing for
`load_stall` is restarted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkd.core.images import ImageVerdict
from sparkd.core.judge import Context, Hold, Verdict, act, ago
from sparkd.core.load import Load
from sparkd.core.ray_stage import RayVerdict, rejoin_workers
from sparkd.core.spec import container_name, model_spec_hash, model_spec_hashes
from sparkd.model.plan import START_MODEL, ActionKind


@dataclass
class ModelVerdict(Verdict):
    # The load is over: the probe stage judges the model.
    to_probe: bool = False
    # Waiting for a stopped serve's engine processes to go: past ORPHAN_GRACE, Ray is restarted.
    waiting: bool = False
    # This launch failed on evidence that another try of the same spec would fail the same way
    # (an argument error, an engine that failed to start, a load that stalled or timed out): a
    # rollout goes back to the last-good spec rather than try again (core.rollout).
    failed: str | None = None


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

    if not serve.running and serve.orphans:
        return _orphans(ctx, verdict, ray, serve.orphans)
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
    nodes = ctx.observed.ray.alive_node_ids if ctx.observed.ray is not None else ()
    launch_nodes = ctx.memory.launch_nodes
    if ray.ready and launch_nodes and nodes and nodes != launch_nodes:
        return start(
            "restart_model",
            "Ray nodes changed since launch (a node rejoined with a new id): the model's "
            "Ray actors are gone",
        )
    if load.was_ready:
        verdict.to_probe = True
        return verdict
    model = desired.model
    if load.failed is not None:
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

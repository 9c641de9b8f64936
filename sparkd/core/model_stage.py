"""Stage 4, the model: `vllm serve` in the head container, started once Ray has its GPUs.

A load fails only on evidence: the serve process exited, or a signature that the engine is gone.
A live load that advances is left alone up to `load_timeout`; one that stopped advancing for
`load_stall` is restarted.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkd.core.judge import Context, Verdict, act, ago
from sparkd.core.load import Load
from sparkd.core.ray_stage import RayVerdict
from sparkd.core.spec import model_spec_hash, model_spec_hashes
from sparkd.model.plan import ActionKind


@dataclass
class ModelVerdict(Verdict):
    # The load is over: the probe stage judges the model.
    to_probe: bool = False


def judge_model(ctx: Context, ray: RayVerdict, load: Load, serving: bool) -> ModelVerdict:
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

    def start(kind: ActionKind, why: str) -> ModelVerdict:
        verdict.phase = "starting_model"
        verdict.notes.append(why)
        verdict.actions.append(act(kind, head, desired.model.id, why))
        return verdict

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
        if ctx.memory.launched_at is not None:
            return start("start_model", f"vllm serve exited{last}")
        return start("start_model", "vllm serve is not running")
    key = ctx.observed.api_key_fingerprint
    want = model_spec_hash(desired, key)
    # A configured key that could not be read says nothing about drift (the endpoint reports
    # the unreadable file); judged without it, every keyed model would look drifted.
    key_unknown = desired.model.api_key_file is not None and key is None
    if (
        not key_unknown
        and serve.spec_hash is not None
        and serve.spec_hash not in model_spec_hashes(desired, key)
    ):
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
        return start("restart_model", f"load failed: {load.failed}")
    if load.since_launch > model.load_timeout:
        return start(
            "restart_model",
            f"load not finished after {ago(load.since_launch)} "
            f"(load_timeout {ago(model.load_timeout)})",
        )
    if load.stalled_for > model.load_stall:
        return start(
            "restart_model",
            f"load stalled: no progress for {ago(load.stalled_for)} "
            f"(load_stall {ago(model.load_stall)}); {load.where}",
        )
    verdict.phase = "loading"
    verdict.notes.append(
        f"loading {load.where} after {ago(load.since_launch)}; left alone while it progresses "
        f"(stall limit {ago(model.load_stall)}, timeout {ago(model.load_timeout)})"
    )
    return verdict

"""The example snapshots in examples/snapshots/, built from the toy cluster.

`python -m tests.examples` rewrites them; tests check the files still match and replay them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from sparkd.core.deciding.planner import plan
from sparkd.core.remembering.remember import remember
from sparkd.core.spec import container_name
from sparkd.model.memory import Memory
from sparkd.model.observed import Container, GpuProcess, RayNode
from sparkd.model.probe import ProbeResult, ProbeVerdict
from sparkd.model.snapshot import dump_snapshot
from tests.toy import ROOT, Toy

EXAMPLES = ROOT / "examples" / "snapshots"


@dataclass(frozen=True)
class Example:
    name: str
    build: Callable[[], tuple[Toy, Memory]]
    phase: str
    kinds: tuple[str, ...]


def _seed_morning() -> tuple[Toy, Memory]:
    return Toy.seed_morning(), Memory()


def _one_gpu_of_two() -> tuple[Toy, Memory]:
    toy = Toy.healthy()
    worker = toy.cluster.workers[0]
    name = container_name(toy.cluster, worker)
    box = toy.containers[worker.name][name]
    toy.containers[worker.name][name] = box.model_copy(
        update={"state": "exited", "status": "Exited (137) 20 seconds ago"}
    )
    toy.ray_nodes = [n for n in toy.ray_nodes if n.ip != worker.ip]
    toy.serve_running = False
    toy.ready = False
    toy.log_tail = ("ray.exceptions.RayActorError: The actor died unexpectedly",)
    return toy, Memory(launched_at=toy.now - 3600, model_ready_at=toy.now - 2700)


def _loading(stalled: bool) -> tuple[Toy, Memory]:
    toy = Toy.healthy()
    toy.apply(_action(toy, "restart_model"))
    memory = Memory(launched_at=toy.now, launch_nodes=_node_ids(toy))
    if stalled:
        toy.advance(360)
        toy.load_stalled_at = toy.now
        # sparkd looked when the load stopped: its memory holds where the load stood then.
        seen = toy.observe()
        memory = remember(memory, seen, (), toy.now, plan(toy.cluster, seen, memory, toy.now))
        toy.advance(660)
    else:
        toy.advance(360)
    return toy, memory


def _healthy() -> tuple[Toy, Memory]:
    toy = Toy.healthy()
    memory = Memory(
        launched_at=toy.now - 1000,
        launch_nodes=_node_ids(toy),
        model_ready_at=toy.now - 100,
        last_probe_at=toy.now - 60,
        healthy_since=toy.now - 60,
    )
    return toy, memory


def _failed_probes() -> tuple[Toy, Memory]:
    toy, memory = _healthy()
    toy.probe_style = "http_error"
    return toy, memory.model_copy(update={"consecutive_failures": 2, "healthy_since": None})


def _busy() -> tuple[Toy, Memory]:
    toy, memory = _healthy()
    toy.probe_style = "timeout"
    toy.probe_busy = True
    return toy, memory


def _worker_rebooted() -> tuple[Toy, Memory]:
    toy, memory = _healthy()
    worker = toy.cluster.workers[0]
    toy.reboot(worker.name)
    toy.serve_running = True  # the serve process has not noticed yet
    toy.ready = True
    toy.ray_nodes.append(
        RayNode(
            node_id="node02",
            ip=worker.ip,
            alive=False,
            gpus=1.0,
            state_message="Unexpected termination: health check failed due to missing too many "
            "heartbeats",
        )
    )
    return toy, memory.model_copy(update={"boot_ids": {worker.name: "boot-spark-b-1"}})


def _stray_gpu() -> tuple[Toy, Memory]:
    toy, memory = _healthy()
    toy.gpu[toy.cluster.head.name].append(
        GpuProcess(pid=48213, name="/usr/bin/python3", used_memory_mib=96073)
    )
    return toy, memory


def _action(toy: Toy, kind: str) -> object:
    from sparkd.model.plan import Action

    return Action(kind=kind, host=toy.cluster.head.name, target=toy.cluster.model.id, reason="")  # type: ignore[arg-type]


def _node_ids(toy: Toy) -> tuple[str, ...]:
    return tuple(sorted(n.node_id for n in toy.ray_nodes if n.alive))


EXAMPLE_SET: tuple[Example, ...] = (
    Example(
        "seed-morning",
        _seed_morning,
        "cleaning",
        ("stop_unit",) * 4 + ("remove_container",) * 2 + ("start_ray_head", "start_ray_worker"),
    ),
    Example("one-gpu-of-two", _one_gpu_of_two, "starting_ray", ("start_ray_worker",)),
    Example("loading-40pct", lambda: _loading(stalled=False), "loading", ()),
    Example("load-stalled", lambda: _loading(stalled=True), "starting_model", ("restart_model",)),
    Example("healthy-reasoning-only", _healthy, "healthy", ()),
    Example("three-failed-probes", _failed_probes, "degraded", ("restart_model",)),
    Example("busy", _busy, "degraded", ()),
    Example(
        "worker-rebooted", _worker_rebooted, "cleaning", ("remove_container", "start_ray_worker")
    ),
    Example("stray-gpu", _stray_gpu, "blocked", ()),
)


def render(example: Example) -> str:
    toy, memory = example.build()
    return dump_snapshot(toy.observe(), memory) + "\n"


def main() -> int:
    EXAMPLES.mkdir(parents=True, exist_ok=True)
    for example in EXAMPLE_SET:
        (EXAMPLES / f"{example.name}.json").write_text(render(example))
    return 0


# Keep the names used by the examples importable for type checkers.
__all__ = ["EXAMPLE_SET", "Container", "ProbeResult", "ProbeVerdict", "render"]

if __name__ == "__main__":
    sys.exit(main())

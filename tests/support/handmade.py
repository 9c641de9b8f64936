"""A deployment made by hand, as sparkd first sees it: the example cluster's Ray head and
worker in containers of the operator's own naming (no sparkd labels), started by a script on
the data IPs, and `vllm serve` started in the head with `docker exec -d` (its process in the
head container's `docker top`)."""

from __future__ import annotations

from typing import Any

from sparkd.core.spec import container_name
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import Container, ForeignContainer, Observed, ServeState
from tests.toy import Toy

HEAD_BOX = "ray-head"
WORKER_BOX = "ray-worker"
SERVE_PID = 4242
# What `docker top` shows of the process `docker exec -d HEAD vllm serve ...` runs.
VLLM = "/usr/bin/python3 /usr/local/bin/vllm serve"


def ray_command(cluster: ClusterSpec, role: str, ip: str) -> list[str]:
    if role == "head":
        return ["ray", "start", "--block", "--head", f"--node-ip-address={ip}", "--port=6379"]
    head = cluster.head.ip
    return ["ray", "start", "--block", f"--address={head}:6379", f"--node-ip-address={ip}"]


def serve_words(cluster: ClusterSpec) -> list[str]:
    """The operator's `vllm serve`: the config's arguments, in their own order and spelling."""
    model = cluster.model
    return [
        model.id,
        f"--tensor-parallel-size={model.tensor_parallel_size}",
        "--port",
        str(model.port),
        *model.extra_args,
        "--distributed-executor-backend",
        "ray",
    ]


def handmade(
    *,
    image: str | None = None,
    env: dict[str, str] | None = None,
    ray_args: dict[str, list[str]] | None = None,
    serve: list[str] | None = None,
) -> tuple[Toy, Memory, Observed]:
    """The example cluster serving from a hand-made deployment; each keyword makes it differ
    from the config (`ray_args`: per host, the `ray start` words)."""
    toy = Toy.healthy()
    toy.probe_at = toy.now
    cluster = toy.cluster
    observed = toy.observe()
    hosts = []
    for facts in observed.hosts:
        spec = cluster.host(facts.name)
        own = container_name(cluster, spec)
        name = HEAD_BOX if spec.role == "head" else WORKER_BOX
        boxes = tuple(
            Container(
                name=name,
                image=image or cluster.ray.image,
                state="running",
                started_at=c.started_at,
                status="Up 3 hours",
            )
            if c.name == own
            else c
            for c in facts.containers
        )
        command = (ray_args or {}).get(facts.name) or ray_command(cluster, spec.role, spec.ip)
        processes = ["12 /usr/bin/python3 /usr/local/bin/ray start --block"]
        if spec.role == "head":
            words = serve if serve is not None else serve_words(cluster)
            processes.append(f"{SERVE_PID} {VLLM} {' '.join(words)}")
        foreign = ForeignContainer(
            name=name,
            image=image or cluster.ray.image,
            env={**cluster.ray.env, "PATH": "/usr/bin", **(env or {})},
            command=("/opt/nvidia/nvidia_entrypoint.sh", *command),
            processes=tuple(processes),
        )
        hosts.append(facts.model_copy(update={"containers": boxes, "foreign": (foreign,)}))
    update: dict[str, Any] = {
        "hosts": tuple(hosts),
        # Read in sparkd's own head container, there is none: no serve process of its own.
        "serve": ServeState(running=False),
    }
    return toy, Memory(), observed.model_copy(update=update)

"""The deployments made by hand, before sparkd, by a script: Ray head and worker containers of
the operator's own naming (no sparkd labels) started on the data IPs, and `vllm serve` started
in the head container with `docker exec -d` (no log file, no PID file, no spec hash: nothing of
sparkd's). Two of them, one implementation:

* `handmade` (`ADOPTABLE`): exactly what the world's config describes (its env, its `vllm serve`
  arguments), so sparkd's first look adopts it;
* `hand-made` (`SEED`): the seed's own, as `sparkd init` meets it: containers named `ray-head` and
  `ray-worker` with `--restart unless-stopped`, `NCCL_IB_DISABLE` set, the old `vllm-*` units
  still enabled (stopped), and no `--distributed-executor-backend` (vLLM picks Ray itself for a
  multi-node placement).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from sparkd_sim.hosts import SimHost
from sparkd_sim.reference import INTERFACE, MODEL_ID, STALE_UNITS
from sparkd_sim.scenarios import Scenarios
from sparkd_sim.state import RestartPolicy, Unit

_ENV = {
    "NCCL_SOCKET_IFNAME": INTERFACE,
    "GLOO_SOCKET_IFNAME": INTERFACE,
    "RAY_memory_monitor_refresh_ms": "0",
}


@dataclass(frozen=True)
class Made:
    """How one operator's script runs it."""

    head: str
    worker: str
    env: Mapping[str, str]
    restart: RestartPolicy = "no"
    # The old units the seed's operator left enabled (stopped).
    stale_units: bool = False
    # `--distributed-executor-backend ray` on `vllm serve`.
    backend_flag: bool = True
    serve_first: tuple[str, ...] = field(default=("--tensor-parallel-size", "--port"))


ADOPTABLE = Made("vllm-ray-head", "vllm-ray-worker", _ENV)
SEED = Made(
    "ray-head",
    "ray-worker",
    {**_ENV, "NCCL_IB_DISABLE": "0"},
    restart="unless-stopped",
    stale_units=True,
    backend_flag=False,
    serve_first=("--port", "--tensor-parallel-size"),
)


def serve_argv(gpus: int, made: Made = ADOPTABLE) -> list[str]:
    """The operator's `vllm serve`: the world's config's arguments, in their own order."""
    first = {"--tensor-parallel-size": str(gpus), "--port": "30000"}
    argv = ["vllm", "serve", MODEL_ID]
    for flag in made.serve_first:
        argv += [flag, first[flag]]
    argv += [
        "--reasoning-parser", "qwen3",
        "--tool-call-parser", "qwen3_coder",
        "--enable-auto-tool-choice",
    ]  # fmt: skip
    if made.backend_flag:
        argv += ["--distributed-executor-backend", "ray"]
    return argv


async def bring_up(scenarios: Scenarios, made: Made = ADOPTABLE) -> None:
    """Every cluster's hand-made Ray and `vllm serve` (which then loads)."""
    for cluster in sorted({h.cluster for h in scenarios.state.hosts.values()}):
        members = [h for h in scenarios.state.hosts.values() if h.cluster == cluster]
        head = members[0]
        if made.stale_units:
            for unit in STALE_UNITS:
                head.state.units[unit] = Unit(unit, enabled=True, active=False)
        head_ip = head.state.data_ip
        port = scenarios.state.ray_port
        scenarios.create(
            head,
            made.head,
            {},
            {**made.env, "VLLM_HOST_IP": head_ip},
            ["ray", "start", "--block", "--head", f"--node-ip-address={head_ip}", f"--port={port}"],
            restart=made.restart,
        )
        for worker in members[1:]:
            ip = worker.state.data_ip
            scenarios.create(
                worker,
                made.worker,
                {},
                {**made.env, "VLLM_HOST_IP": ip},
                [
                    "ray",
                    "start",
                    "--block",
                    f"--address={head_ip}:{port}",
                    f"--node-ip-address={ip}",
                ],
                restart=made.restart,
            )
        scenarios.launches.append(
            scenarios.state.spawn(_launch(scenarios, head, len(members), made))
        )


async def _launch(scenarios: Scenarios, head: SimHost, gpus: int, made: Made) -> None:
    """`docker exec -d HEAD vllm serve ...`, once Ray has every host's GPU."""
    await scenarios.ray_ready(head, gpus)
    command = shlex.join(["docker", "exec", "-d", made.head, *serve_argv(gpus, made)])
    rc, _, err = await head.ssh.run_local(command)
    if rc != 0:
        raise RuntimeError(f"could not launch the model on {head.name}: {err.strip()}")

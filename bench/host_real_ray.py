"""Part of `host`: what the head's fact script costs with a real Ray 2.60 behind `docker exec
HEAD ray ...` (the real-Ray tier's world, run in this process), with Ray read and with Ray's last
reading reused (a quiet converged cluster between probes), and with Ray read from the head's
dashboard over HTTP as observing now does (and those reads alone: the head's cost of a Ray read).

The cost is every process's CPU on the host side: the fact script's processes and the `ray` CLI
(children of this process once they end) and Ray's own daemons answering it (the dashboard, the
GCS; live descendants of this process), read from /proc before and after each script."""

from __future__ import annotations

import asyncio
import os
import resource
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from sparkd.model.observed import RayState
from sparkd.runtime.controller import Controller
from sparkd.runtime.state import StateDir
from sparkd.settings import load_settings
from sparkd.shell import catalogue, ray_http
from sparkd.shell.observe import runner, tool_timeout
from sparkd.shell.ssh import SshPool
from sparkd_sim import real_ray
from sparkd_sim.openssh import descendants
from sparkd_sim.timing import Timing
from sparkd_sim.world import World

TICK = os.sysconf("SC_CLK_TCK")
IDLE = "nothing read (Ray's own background in the same window)"
FIRST_ADDRESS = "127.78.0.2"


def host_cpu() -> float:
    """CPU seconds of this process's ended children and of its live descendants."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = ended.ru_utime + ended.ru_stime
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


async def measure(runs: int) -> dict[str, Any] | None:
    """Per variant: CPU seconds and wall time of one head fact script (medians), or None when
    real Ray cannot run here (the reason is printed)."""
    why = real_ray.unavailable()
    if why is not None:
        print(f"host, real Ray: skipped ({why})")
        return None
    with tempfile.TemporaryDirectory(prefix="sparkd-bench-") as tmp:
        async with World(
            Path(tmp) / "world",
            scenario="seed-morning",
            ray="real",
            timing=Timing.fast(),
            first_address=FIRST_ADDRESS,
            noisy_load_logs=False,
        ) as world:
            cluster = load_settings(world.config_path).clusters[0]
            cluster = cluster.model_copy(
                update={
                    "recheck_interval": 1.0,
                    "ray": cluster.ray.model_copy(update={"join_timeout": 90.0}),
                }
            )
            pool = SshPool()
            try:
                controller = Controller(cluster, pool, StateDir(Path(tmp) / "state"))
                task = asyncio.create_task(controller.run())
                deadline = time.monotonic() + 240
                while not (controller.view.plan and controller.view.plan.converged):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the real-Ray world did not become healthy")
                    await asyncio.sleep(0.5)
                controller.stop()
                await task
                head = cluster.head
                conn = pool.connection(head, cluster.ssh)
                t = tool_timeout(cluster)
                bare = catalogue.reads.fact_script(cluster, head, t, read_ray=False)
                port = cluster.ray.dashboard_port
                dashboard = runner(conn)

                async def over_http(settling: bool) -> None:
                    ray = await ray_http.read_ray(dashboard, port, settling, t)
                    if not isinstance(ray, RayState) or len(ray.nodes) != len(cluster.hosts):
                        raise RuntimeError(f"the real dashboard did not answer: {ray}")

                # (script, then the dashboard's reads beside it: None, the node list, or the
                # node list and the cluster status)
                variants: dict[str, tuple[str | None, bool | None]] = {
                    "head, Ray by `ray list nodes` (1 `ray` call)": (
                        catalogue.reads.fact_script(cluster, head, t).command,
                        None,
                    ),
                    "head, Ray over HTTP (as observing runs it)": (bare.command, False),
                    "head, Ray reused (no read)": (bare.command, None),
                    "Ray over HTTP alone: node list": (None, False),
                    "Ray over HTTP alone: node list + cluster status": (None, True),
                    # Ray's daemons use CPU of their own all along: the same window, no read.
                    IDLE: (None, None),
                }
                samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
                for _ in range(runs):
                    for name, (script, http) in variants.items():  # alternated
                        await asyncio.sleep(1.0)  # Ray's own background work settles
                        before, started = host_cpu(), time.perf_counter()
                        reads: list[Awaitable[object]] = []
                        if script is not None:
                            reads.append(conn.run(script, timeout=60))
                        if http is not None:
                            reads.append(over_http(http))
                        await asyncio.gather(*reads)
                        wall = time.perf_counter() - started
                        await asyncio.sleep(0.3)  # processes that ended are reaped
                        samples[name].append((host_cpu() - before, wall))
            finally:
                await pool.close()
    return {name: rows for name, rows in samples.items()}

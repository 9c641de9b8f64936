"""`host`: CPU seconds one cycle costs each simulated host (the fact script: every fake tool is a
bash process talking to the world), measured as the world process's CPU over repeated fact scripts
of one host at a time: the head's script with `ray list nodes` (the steady state), with `ray
status` beside it (while Ray settles), with no `ray` call (Ray's last reading reused between
probes), and the worker's. The simulated `ray` answers from a model: a real `ray` CLI call costs
0.6-3 s of a core on the head (shared/samples/ray-real), which the projection adds per call.
Where real Ray can run (root, unshare, the `realray` extra), the head's script is also measured
against Ray 2.60 itself, with Ray read and with Ray's last reading reused (`host_real_ray`)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from bench import host_real_ray
from bench.common import median, sim_world, table, wait_healthy, write_result
from sparkd.shell import catalogue
from sparkd.shell.observe import tool_timeout
from sparkd.shell.ssh import SshPool

REAL_RAY_CALL_CPU = (0.6, 3.0)  # seconds of a core per real `ray` CLI call (samples/ray-real)
INTERVAL = 30.0


def tool_calls(script: str) -> int:
    """Sections the script runs (one tool call each) plus one `docker top` per running
    container (2 here: the Ray container; the head also serves from it)."""
    return len(re.findall(r"^s \S+|; s \S+|then s ", script, flags=re.M))


async def main(quick: bool = False) -> None:
    runs = 10 if quick else 30
    async with sim_world("healthy") as world:
        await wait_healthy(world)
        cluster = world.settings.clusters[0]
        head, worker = cluster.head, cluster.workers[0]
        t = tool_timeout(cluster)
        # (script, `ray` calls it makes on a healthy head): `ray status` only runs when the node
        # list fails, or while Ray settles.
        variants = {
            "head, Ray read (list nodes)": (head, catalogue.fact_script(cluster, head, t), 1),
            "head, Ray settling (list nodes + status)": (
                head,
                catalogue.fact_script(cluster, head, t, ray_status=True),
                2,
            ),
            "head, Ray reused (no call)": (
                head,
                catalogue.fact_script(cluster, head, t, read_ray=False),
                0,
            ),
            "worker": (worker, catalogue.fact_script(cluster, worker, t), 0),
        }
        pool = SshPool()
        results: dict[str, Any] = {}
        try:
            for name, (host, remote, rays) in variants.items():
                script = remote.command
                conn = pool.connection(host, cluster.ssh)
                await conn.run(script, timeout=30)
                cpu, wall = [], []
                for _ in range(runs):
                    before, started = world.cpu(), time.perf_counter()
                    await conn.run(script, timeout=30)
                    wall.append(time.perf_counter() - started)
                    cpu.append(world.cpu() - before)
                    await asyncio.sleep(0.05)
                # The mean: /proc counts CPU in 10 ms ticks, coarse for one script.
                sim_cpu = sum(cpu) / len(cpu)
                results[name] = {
                    "host": host.name,
                    "world_cpu_s": sim_cpu,
                    "wall_s": median(wall),
                    "ray_calls": rays,
                    "real_cpu_s_low": sim_cpu + rays * REAL_RAY_CALL_CPU[0],
                    "real_cpu_s_high": sim_cpu + rays * REAL_RAY_CALL_CPU[1],
                }
        finally:
            await pool.close()
    rows = [
        [
            name,
            r["world_cpu_s"] * 1000,
            r["wall_s"] * 1000,
            r["ray_calls"],
            f"{r['real_cpu_s_low']:.2f}-{r['real_cpu_s_high']:.2f}",
            f"{100 * r['real_cpu_s_low'] / INTERVAL:.1f}-"
            f"{100 * r['real_cpu_s_high'] / INTERVAL:.1f}",
        ]
        for name, r in results.items()
    ]
    text = table(
        "host: CPU per cycle on each simulated host (fact script), and projected with real Ray",
        ["script", "sim CPU ms", "wall ms", "ray calls", "real CPU s/cycle", "% core @30s"],
        rows,
    )
    real = await host_real_ray.measure(3 if quick else 7)
    measured: dict[str, Any] = {}
    if real is not None:
        for name, samples in real.items():
            measured[name] = {
                "cpu_s": median([cpu for cpu, _ in samples]),
                "wall_s": median([wall for _, wall in samples]),
                "samples": samples,
            }
        text += "\n\n" + table(
            "host, real Ray 2.60: the head's fact script, host CPU (script, `ray` CLI, Ray's "
            "daemons answering it), median",
            ["script", "CPU s", "wall s", "% core @30s"],
            [
                [name, m["cpu_s"], m["wall_s"], f"{100 * m['cpu_s'] / INTERVAL:.1f}"]
                for name, m in measured.items()
            ],
        )
    write_result(
        "host",
        {"runs": runs, "interval": INTERVAL, "scripts": results, "real_ray": measured},
        text,
    )

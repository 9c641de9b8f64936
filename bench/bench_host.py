"""`host`: CPU seconds one cycle costs each simulated host (the fact script: every fake tool is a
bash process talking to the world), measured as the world process's CPU over repeated fact scripts
of one host at a time: the head's script with `ray list nodes` (the steady state), with `ray
status` beside it (while Ray settles), with no `ray` call (Ray's last reading reused between
probes), and the worker's. The simulated `ray` answers from a model: a real `ray` CLI call costs
0.6-3 s of a core on the head (shared/samples/ray-real), which the projection adds per call.
Processes per look (every fork and exec, `strace -f`) are counted for the scripts observing sends
(`host_processes`). Where real Ray can run (root, unshare, the `realray` extra), the head's script
is also measured against Ray 2.60 itself: Ray read by `ray list nodes`, over the dashboard's HTTP
API as observing now reads it, reused, and the HTTP reads alone (`host_real_ray`)."""

from __future__ import annotations

import asyncio
import functools
import re
import time
from typing import Any

from bench import host_processes, host_real_ray
from bench.common import median, sim_world, table, wait_healthy, write_result
from sparkd.shell import catalogue
from sparkd.shell.observe import tool_timeout
from sparkd.shell.ssh import SshPool

SHELLS = ("sh", "bash")

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
        facts = functools.partial(
            catalogue.reads.fact_script, cluster, tool_timeout=tool_timeout(cluster)
        )
        # (script, `ray` calls it makes on a healthy head): `ray status` only runs when the node
        # list fails, or while Ray settles.
        variants = {
            "head, Ray read (list nodes)": (head, facts(head), 1),
            "head, Ray settling (list nodes + status)": (head, facts(head, ray_status=True), 2),
            "head, Ray reused (no call)": (head, facts(head, read_ray=False), 0),
            "worker": (worker, facts(worker), 0),
        }
        pool = SshPool()
        results: dict[str, Any] = {}
        # Processes per look: the scripts observing sends (with the dashboard, no `ray` in the
        # head's), counted under each shell.
        looks = {
            "head (Ray over HTTP: no `ray` call)": (head, facts(head, read_ray=False)),
            "head, `ray list nodes` (no dashboard)": (head, facts(head, read_ray=True)),
            "worker": (worker, facts(worker)),
        }
        counted: dict[str, dict[str, tuple[int, int]]] = {}
        try:
            for name, (host, remote) in looks.items():
                conn = pool.connection(host, cluster.ssh)
                counted[name] = {
                    shell: await host_processes.processes(conn, remote.command, shell, shell)
                    for shell in SHELLS
                }
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
    text += "\n\n" + table(
        "host: processes one look starts on a simulated host (strace -f: forks and execs)",
        ["script", *(f"{s}: processes / execs" for s in SHELLS)],
        [[name, *(f"{by[s][0]} / {by[s][1]}" for s in SHELLS)] for name, by in counted.items()],
    )
    real = await host_real_ray.measure(5 if quick else 15)
    measured: dict[str, Any] = {}
    if real is not None:
        # /proc counts CPU in 10 ms ticks: the mean over the runs, less Ray's own background
        # over the same window (the idle row), is a read's cost.
        idle = real[host_real_ray.IDLE]
        background = sum(cpu for cpu, _ in idle) / len(idle)
        for name, samples in real.items():
            mean = sum(cpu for cpu, _ in samples) / len(samples)
            measured[name] = {
                "cpu_s": median([cpu for cpu, _ in samples]),
                "cpu_s_mean": mean,
                "cpu_s_net": mean - background,
                "wall_s": median([wall for _, wall in samples]),
                "samples": samples,
            }
        text += "\n\n" + table(
            "host, real Ray 2.60: the head's fact script, host CPU (script, `ray` CLI, Ray's "
            "daemons answering it): median, mean, and mean less the idle row",
            ["script", "CPU s", "mean s", "net ms", "wall s", "% core @30s"],
            [
                [
                    name,
                    m["cpu_s"],
                    m["cpu_s_mean"],
                    m["cpu_s_net"] * 1000,
                    m["wall_s"],
                    f"{100 * m['cpu_s'] / INTERVAL:.1f}",
                ]
                for name, m in measured.items()
            ],
        )
    write_result(
        "host",
        {
            "runs": runs,
            "interval": INTERVAL,
            "scripts": results,
            "processes": counted,
            "real_ray": measured,
        },
        text,
    )

"""`fanout`: observe wall time and the daemon's own CPU per host-observation for 2, 8, 32 and 64
hosts (as many 2-host clusters), every cluster observed at once over warm connections. The world's
CPU over the same cycle tells what bounds the wall time: the simulated hosts' tools (their bash
processes on this machine's cores) or sparkd."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from bench.common import median, own_cpu, sim_world, table, wait_healthy, write_result
from sparkd.shell.observe import observe
from sparkd.shell.ssh import SshPool


async def measure(hosts: int, runs: int) -> dict[str, Any]:
    async with sim_world("healthy", hosts=hosts, clusters=hosts // 2) as world:
        await wait_healthy(world, within=600)
        clusters = world.settings.clusters
        pool = SshPool()
        try:

            async def cycle() -> None:
                await asyncio.gather(
                    *(observe(c, pool, probe_due=lambda e: False) for c in clusters)
                )

            await cycle()
            samples = []
            for _ in range(runs):
                cpu, sim_cpu, started = own_cpu(), world.cpu(), time.perf_counter()
                await cycle()
                wall = time.perf_counter() - started
                samples.append(
                    {
                        "wall_s": wall,
                        "daemon_cpu_s": own_cpu() - cpu,
                        "world_cpu_s": world.cpu() - sim_cpu,
                    }
                )
                await asyncio.sleep(0.2)
        finally:
            await pool.close()
    wall = median([s["wall_s"] for s in samples])
    daemon = median([s["daemon_cpu_s"] for s in samples])
    world_cpu = median([s["world_cpu_s"] for s in samples])
    cores = os.cpu_count() or 1
    return {
        "hosts": hosts,
        "samples": samples,
        "wall_s": wall,
        "daemon_cpu_per_host_ms": 1000 * daemon / hosts,
        "world_cpu_per_host_ms": 1000 * world_cpu / hosts,
        # Both processes' CPU over the wall time on this machine's cores: near 1 means the
        # machine was busy all along (CPU-bound); the larger share says whose CPU it was.
        "busy_share": (daemon + world_cpu) / (wall * cores),
        "bound_by": "simulated hosts" if world_cpu > daemon else "sparkd",
    }


async def main(quick: bool = False) -> None:
    sizes = (2, 8, 32) if quick else (2, 8, 32, 64)
    runs = 3 if quick else 5
    results = [await measure(n, runs) for n in sizes]
    text = table(
        "fanout: one observe cycle of every cluster at once (2-host clusters)",
        ["hosts", "wall ms", "daemon CPU ms/host", "world CPU ms/host", "cores busy", "bound by"],
        [
            [
                r["hosts"],
                r["wall_s"] * 1000,
                r["daemon_cpu_per_host_ms"],
                r["world_cpu_per_host_ms"],
                f"{r['busy_share']:.0%}",
                r["bound_by"],
            ]
            for r in results
        ],
    )
    write_result("fanout", {"runs": runs, "sizes": results}, text)

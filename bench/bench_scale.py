"""`scale`: how many 2-host clusters one daemon keeps at the default 30 s interval. This machine
cannot host hundreds of simulated clusters next to the daemon (2 cores, each simulated host's
tools are real bash processes), so: one daemon runs every cluster of a 32-cluster world
(`Controller.run`, events on, dry run so nothing is changed) for a window, and its own CPU per
cluster-cycle gives clusters per core = interval / CPU per cluster-cycle; no cycle may have been
late (a cycle is late when it starts more than a second after the interval it was due at)."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    SimWorld,
    median,
    own_cpu,
    sim_world,
    table,
    wait_healthy,
    write_result,
)
from sparkd.runtime.cluster_view import CycleRecord
from sparkd.runtime.controller import Controller
from sparkd.runtime.state import StateDir
from sparkd.shell.ssh import SshPool

INTERVAL = 30.0


async def run_mode(world: SimWorld, window: float) -> dict[str, Any]:
    """Every cluster's controller, events on, for `window` seconds."""
    pool = SshPool()
    starts: dict[str, list[float]] = {}
    durations: list[float] = []

    def on_record(controller: Controller, record: CycleRecord) -> None:
        starts.setdefault(controller.cluster.name, []).append(time.monotonic() - record.seconds)
        durations.append(record.seconds)

    return await _run_mode(world, window, pool, starts, durations, on_record)


async def _run_mode(
    world: SimWorld,
    window: float,
    pool: SshPool,
    starts: dict[str, list[float]],
    durations: list[float],
    on_record: Callable[[Controller, CycleRecord], None],
) -> dict[str, Any]:
    try:
        with tempfile.TemporaryDirectory() as state:
            controllers = [
                Controller(
                    c.model_copy(update={"interval": INTERVAL}),
                    pool,
                    StateDir(Path(state)),
                    dry_run=True,
                    on_record=on_record,
                )
                for c in world.settings.clusters
            ]
            tasks = [asyncio.create_task(c.run()) for c in controllers]
            await asyncio.sleep(5)  # first cycles, connections and event streams up
            cpu, world_cpu, started = own_cpu(), world.cpu(), time.monotonic()
            counted = len(durations)
            await asyncio.sleep(window)
            cpu, world_cpu = own_cpu() - cpu, world.cpu() - world_cpu
            elapsed = time.monotonic() - started
            cluster_cycles = len(durations) - counted
            for c in controllers:
                c.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await pool.close()
    late = 0
    for times in starts.values():
        for a, b in itertools.pairwise(times):
            late += b - a > INTERVAL + max(durations) + 1.0
    per_cycle = cpu / max(1, cluster_cycles)
    clusters = len(world.settings.clusters)
    return {
        "window_s": elapsed,
        "cluster_cycles": cluster_cycles,
        "cycles_per_cluster_per_interval": cluster_cycles / clusters / (elapsed / INTERVAL),
        "daemon_cpu_s": cpu,
        "daemon_cpu_per_cluster_cycle_ms": 1000 * per_cycle,
        "daemon_core_share": cpu / elapsed,
        "world_core_share": world_cpu / elapsed,
        "cycle_seconds_median": median(durations),
        "cycle_seconds_max": max(durations),
        "late_cycles": late,
        # At one cycle per cluster per interval: what one core of daemon CPU keeps.
        "clusters_per_core": INTERVAL / per_cycle,
        # At the pace actually seen (wake-ups, probes due): what one core keeps.
        "clusters_per_core_at_seen_pace": clusters / (cpu / elapsed) if cpu else float("inf"),
    }


async def main(quick: bool = False) -> None:
    clusters_n = 8 if quick else 32
    window = 70.0 if quick else 100.0
    async with sim_world("healthy", hosts=2 * clusters_n, clusters=clusters_n) as world:
        await wait_healthy(world, within=900)
        modes = [await run_mode(world, window)]
    rows: list[list[object]] = []
    labels = {
        "cycles per cluster per 30 s": "cycles_per_cluster_per_interval",
        "daemon CPU per cluster-cycle (ms)": "daemon_cpu_per_cluster_cycle_ms",
        "daemon share of a core (%)": "daemon_core_share",
        "world share of a core (%)": "world_core_share",
        "cycle seconds median": "cycle_seconds_median",
        "cycle seconds max": "cycle_seconds_max",
        "late cycles": "late_cycles",
        "clusters per core, one cycle per 30 s": "clusters_per_core",
        "clusters per core at the pace seen": "clusters_per_core_at_seen_pace",
    }
    for label, key in labels.items():
        values = [m[key] * (100 if key.endswith("share") else 1) for m in modes]
        rows.append([label, *values])
    text = table(
        f"scale: {clusters_n} two-host clusters, one daemon (dry run), {INTERVAL:.0f} s interval, "
        f"{window:.0f} s window per mode",
        ["measure", "value"],
        rows,
    )
    write_result("scale", {"clusters": clusters_n, "interval": INTERVAL, "modes": modes}, text)

"""`detect`: kill the serve process, kill the worker's Ray container, reboot the worker; the time
from the fault to the controller's first plan that remediates it, with the docker events streams
and with the interval cycle only (`watch_events=False`, interval 30 s). The fault lands at a
random point of the interval, as a real one does.

Then a hang under load (`hang-under-load`: requests running, the token counter still; no event
announces it) at the defaults (interval 30 s, `policy.hang_window` 60 s, `probe_interval` 60 s):
from the fault, and from the first look that saw the counter where it stands, to the restart;
`hang_main` runs only that part."""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.common import (
    FIRST_ADDRESS,
    SimWorld,
    median,
    sim_world,
    table,
    until,
    wait_healthy,
    write_result,
)
from sparkd.model.cluster import ClusterSpec
from sparkd.runtime.controller import Controller
from sparkd.runtime.state import StateDir
from sparkd.shell.ssh import SshPool

FAULTS = {
    "serve process killed": ("crash-model", "spark-a", None),
    "worker container killed": ("kill-container", "spark-b", "sparkd-sparks-ray-worker"),
    "worker host rebooted": ("reboot", "spark-b", None),
}


def bench_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """The shipped interval (30 s) and recheck (5 s: a wake-up after a cycle rests a tenth of
    it); no remediation budget or backoff, so that the runs one after another never block the
    cluster."""
    return cluster.model_copy(
        update={
            "recheck_interval": 5.0,
            "policy": cluster.policy.model_copy(
                update={"budget": 1000, "backoff_initial": 0.1, "backoff_max": 0.5}
            ),
        }
    )


MODES = ("events", "interval")
HANG = ("hang-under-load", "spark-a", None)


@contextlib.asynccontextmanager
async def running(controller: Controller, within: float) -> AsyncIterator[None]:
    """The controller's loop, converged before the block and back to converged after it (the
    next run starts healthy), all within `within` seconds; stopped on the way out."""

    def converged() -> bool:
        return controller.view.plan is not None and controller.view.plan.converged

    task = asyncio.create_task(controller.run())
    try:
        async with asyncio.timeout(within):
            await until(converged, 0.1)
            yield
            await until(converged, 0.1)
    finally:
        controller.stop()
        await asyncio.wait_for(task, 60)


async def one_run(
    world: SimWorld, pool: SshPool, fault: tuple[str, str, str | None], mode: str
) -> dict[str, Any]:
    return await _one_run(world, pool, fault, events=mode == "events")


async def _one_run(
    world: SimWorld, pool: SshPool, fault: tuple[str, str, str | None], events: bool
) -> dict[str, Any]:
    cluster = bench_cluster(world.settings.clusters[0])
    noticed: list[float] = []
    remediated: list[float] = []
    faulted_at: list[float] = []

    def on_plan(controller: Controller) -> None:
        plan = controller.view.plan
        if not faulted_at or plan is None:
            return
        now = time.monotonic()
        if plan.phase != "healthy" and not noticed:
            noticed.append(now)
        if plan.actions and not remediated:
            remediated.append(now)

    with tempfile.TemporaryDirectory() as state:
        controller = Controller(
            cluster, pool, StateDir(Path(state)), watch_events=events, on_plan=on_plan
        )
        async with running(controller, within=120):
            # Anywhere in the interval for the interval-only mode (what it waits depends on it);
            # a fault a moment after a cycle for the event modes.
            spread = cluster.interval if not events else 3.0
            await asyncio.sleep(random.uniform(0.5, spread))
            faulted_at.append(time.monotonic())
            await world.fault(*fault)
            await until(lambda: remediated)
    return {
        "noticed_s": noticed[0] - faulted_at[0] if noticed else None,
        "remediation_s": remediated[0] - faulted_at[0],
        "cycles": controller.view.cycles,
    }


async def main(quick: bool = False) -> None:
    runs = 1 if quick else 3
    results: dict[str, Any] = {}
    async with sim_world("healthy") as world:
        await wait_healthy(world)
        pool = SshPool()
        try:
            for name, fault in FAULTS.items():
                results[name] = {mode: [] for mode in MODES}
                for _ in range(runs):
                    for mode in MODES:
                        results[name][mode].append(await one_run(world, pool, fault, mode))
        finally:
            await pool.close()
    rows = []
    summaries = {}
    for name, modes in results.items():
        ev = median([r["remediation_s"] for r in modes["events"]])
        iv = median([r["remediation_s"] for r in modes["interval"]])
        summaries[name] = {"events_s": ev, "interval_s": iv}
        rows.append([name, ev, iv, iv / ev])
    text = table(
        "detect: fault -> first remediating plan (s), median; interval 30 s",
        ["fault", "events", "interval only", "ratio"],
        rows,
    )
    text += "\n(a rebooted host's remediation waits for it to answer SSH again)"
    write_result(
        "detect",
        {"runs": runs, "interval": 30.0, "faults": results, "summary": summaries},
        text,
    )
    await hang_main(quick)


async def hang_run(world: SimWorld, pool: SshPool) -> dict[str, Any]:
    """A hang under load at a random point of the interval, past the just-ready grace."""
    cluster = bench_cluster(world.settings.clusters[0])
    faulted_at: list[float] = []
    remediated: list[tuple[float, str, float | None]] = []

    def on_plan(controller: Controller) -> None:
        plan = controller.view.plan
        if not faulted_at or plan is None or remediated:
            return
        if plan.actions:
            mark = controller.memory.token_mark
            since = mark.since if mark is not None else None
            # The stall's first look, in monotonic time (daemon time is monotonic + offset).
            first = None if since is None else time.monotonic() - (controller.clock.now() - since)
            remediated.append((time.monotonic(), plan.actions[0].reason, first))

    with tempfile.TemporaryDirectory() as state:
        controller = Controller(cluster, pool, StateDir(Path(state)), on_plan=on_plan)
        async with running(controller, within=600):
            # A model that has served a while: past the first-shape grace.
            await asyncio.sleep(cluster.policy.hang_ready_grace)
            await asyncio.sleep(random.uniform(0.5, cluster.interval))
            faulted_at.append(time.monotonic())
            await world.fault(*HANG)
            await until(lambda: remediated)
    at, reason, first = remediated[0]
    return {
        "remediation_s": at - faulted_at[0],
        "from_first_still_look_s": None if first is None else at - first,
        "reason": reason,
        "cycles": controller.view.cycles,
    }


async def hang_main(quick: bool = False, first_address: str = FIRST_ADDRESS) -> None:
    runs = 1 if quick else 3
    async with sim_world("healthy", first_address=first_address) as world:
        await wait_healthy(world)
        pool = SshPool()
        try:
            results = [await hang_run(world, pool) for _ in range(runs)]
        finally:
            await pool.close()
    cluster = bench_cluster(world.settings.clusters[0])
    fault_s = [r["remediation_s"] for r in results]
    looked_s = [r["from_first_still_look_s"] for r in results if r["from_first_still_look_s"]]
    text = table(
        f"detect: hang under load -> first remediating plan (s), {runs} runs; interval "
        f"{cluster.interval:g} s, hang_window {cluster.policy.hang_window:g} s",
        ["from", "median", "min", "max"],
        [
            ["the fault", median(fault_s), min(fault_s), max(fault_s)],
            ["the first look of the stall", median(looked_s), min(looked_s), max(looked_s)],
        ],
    )
    text += "\n(the first look after the hang still sees the tokens made before it)"
    write_result(
        "detect_hang",
        {"runs": runs, "interval": cluster.interval, "results": results},
        text,
    )

"""`recover`: `sparkd run`'s controller (events on, the printed config's 30 s interval and 5 s
recheck) from the seed-morning world with tool latencies and load time at ~0 (`sparkd sim
--scale 0.01`) to `healthy`. The time is split into what the tools and SSH took (the union of
every SSH command's and model request's time in flight) and sparkd itself (planning, scheduling,
and the waits it imposes between them)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import median, own_cpu, sim_world, table, until, write_result
from sparkd.runtime.controller import Controller
from sparkd.runtime.state import StateDir
from sparkd.shell import model_http, ssh
from sparkd.shell.ssh import SshPool


class Busy:
    """Intervals during which an SSH command or a model request was in flight."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def _wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        spans = self.spans

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return await original(*args, **kwargs)
            finally:
                spans.append((started, time.monotonic()))

        self._saved.append((owner, name, original))
        setattr(owner, name, timed)

    def __enter__(self) -> Busy:
        self._wrap(ssh.HostConnection, "run")
        self._wrap(model_http, "request")
        self._wrap(model_http, "stream_lines")
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)

    def covered(self, start: float, end: float) -> float:
        total, reach = 0.0, start
        for a, b in sorted(self.spans):
            a, b = max(a, reach), min(b, end)
            if b > a:
                total += b - a
                reach = b
        return total


async def one_run() -> dict[str, Any]:
    async with sim_world("seed-morning", scale=0.01) as world:
        cluster = world.settings.clusters[0]
        pool = SshPool()
        phases: list[tuple[float, str]] = []
        with tempfile.TemporaryDirectory() as state, Busy() as busy:
            controller = Controller(
                cluster,
                pool,
                StateDir(Path(state)),
                on_plan=lambda c: (
                    phases.append((time.monotonic(), c.view.plan.phase)) if c.view.plan else None
                ),
            )
            cpu, started = own_cpu(), time.monotonic()
            task = asyncio.create_task(controller.run())
            try:
                async with asyncio.timeout(300):
                    await until(
                        lambda: controller.view.plan and controller.view.plan.phase == "healthy",
                        0.01,
                    )
                ended = time.monotonic()
                cpu = own_cpu() - cpu
            finally:
                controller.stop()
                await asyncio.wait_for(task, 60)
                await pool.close()
            tools = busy.covered(started, ended)
            total = ended - started
            return {
                "total_s": total,
                "tools_ssh_s": tools,
                "sparkd_s": total - tools,
                "sparkd_cpu_s": cpu,
                "cycles": len(phases),
                "phases": [(round(t - started, 3), p) for t, p in phases],
            }


async def main(quick: bool = False) -> None:
    runs = [await one_run() for _ in range(1 if quick else 3)]
    summary = {k: median([r[k] for r in runs]) for k in ("total_s", "tools_ssh_s", "sparkd_s")}
    summary["sparkd_cpu_s"] = median([r["sparkd_cpu_s"] for r in runs])
    rows = [
        [i + 1, r["total_s"], r["tools_ssh_s"], r["sparkd_s"], r["sparkd_cpu_s"], r["cycles"]]
        for i, r in enumerate(runs)
    ]
    rows.append(["median", *summary.values(), ""])
    text = table(
        "recover: seed-morning at ~0 tool latency -> healthy (s)",
        ["run", "total", "tools+SSH", "sparkd itself", "sparkd CPU", "cycles"],
        rows,
    )
    write_result("recover", {"runs": runs, "summary": summary}, text)

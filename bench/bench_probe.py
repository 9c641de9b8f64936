"""`probe`: a probe's latency as sparkd measures it (through the SSH tunnel: a direct-tcpip
channel per request on the head's warm connection) vs the simulated server's own record of the
same request (its handler's time): the difference is the tunnel's overhead. Then `sparkd probe`
as a whole command (a new process: imports, config, SSH connect, the probe) vs the completion's
own latency."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from bench.common import median, p95, sim_world, table, wait_healthy, write_result
from sparkd.shell.observe import probe_once
from sparkd.shell.ssh import SshPool
from sparkd.sim.control import send_query


async def cli_probe(config: str) -> float:
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c",
        "import sys; from sparkd.cli import main; raise SystemExit(main(sys.argv[1:]))",
        "probe", "--config", config,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await process.wait()
    return time.perf_counter() - started


async def main(quick: bool = False) -> None:
    runs = 10 if quick else 40
    async with sim_world("healthy") as world:
        await wait_healthy(world)
        cluster = world.settings.clusters[0]
        pool = SshPool()
        samples: list[dict[str, Any]] = []
        try:
            await probe_once(cluster, pool)  # warm
            for _ in range(runs):
                result = await probe_once(cluster, pool)
                served = await send_query(world.directory / "control.sock", "requests", "spark-a")
                posts = [r for r in served if r["method"] == "POST"]
                if result.latency_seconds is None or not posts:
                    continue
                server = posts[-1]["seconds"]
                samples.append(
                    {
                        "sparkd_s": result.latency_seconds,
                        "server_s": server,
                        "overhead_s": result.latency_seconds - server,
                    }
                )
                await asyncio.sleep(0.05)
        finally:
            await pool.close()
        commands = [await cli_probe(str(world.config_path)) for _ in range(3 if quick else 5)]
    overhead = [s["overhead_s"] for s in samples]
    completion = median([s["sparkd_s"] for s in samples])
    summary = {
        "sparkd_median_ms": 1000 * completion,
        "server_median_ms": 1000 * median([s["server_s"] for s in samples]),
        "overhead_median_ms": 1000 * median(overhead),
        "overhead_p95_ms": 1000 * p95(overhead),
        "command_median_s": median(commands),
        "command_over_completion": median(commands) / completion,
    }
    text = table(
        f"probe: {len(samples)} probes through the tunnel; "
        f"`sparkd probe` run {len(commands)} times",
        ["measure", "median", "p95"],
        [
            ["sparkd's latency (ms)", summary["sparkd_median_ms"],
             1000 * p95([s["sparkd_s"] for s in samples])],
            ["server's own record (ms)", summary["server_median_ms"],
             1000 * p95([s["server_s"] for s in samples])],
            ["tunnel overhead (ms)", summary["overhead_median_ms"], summary["overhead_p95_ms"]],
            ["`sparkd probe` command (s)", summary["command_median_s"], max(commands)],
            ["command / completion", summary["command_over_completion"], ""],
        ],
    )  # fmt: skip
    write_result("probe", {"samples": samples, "commands": commands, "summary": summary}, text)

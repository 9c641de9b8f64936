"""`probe`: a probe's latency as sparkd measures it (through the SSH tunnel: a direct-tcpip
channel per request on the head's warm connection) vs the simulated server's own record of the
same request (its handler's time): the difference is the tunnel's overhead. Then `sparkd probe`
as a whole command (a new process: imports, config, SSH connect, the probe) vs the completion's
own latency; and `sparkd status` (a new process reading a `sparkd run` daemon's API) vs a bare
`python -c pass`, alternated."""

from __future__ import annotations

import asyncio
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_footprint import daemon_config, wait_for_cycle
from bench.common import (
    FIRST_ADDRESS,
    SimWorld,
    free_port,
    median,
    p95,
    sim_world,
    table,
    wait_healthy,
    write_result,
)
from sparkd.shell.observe import probe_once
from sparkd.shell.ssh import SshPool
from sparkd_sim.control import send_query


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


async def timed(*argv: str) -> tuple[float, float]:
    """A command's wall time and CPU time (user + system; less swayed by a loaded machine)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    code = await process.wait()
    wall = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"{argv} exited {code}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


async def cli_status(
    world: SimWorld, runs: int
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """`sparkd status` against a running daemon, and a bare Python start, alternated: (wall,
    CPU) of each."""
    bare: list[tuple[float, float]] = []
    status: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port("127.0.0.1")
        config = daemon_config(world, Path(tmp) / "sparkd.toml", Path(tmp) / "state", port, 30.0)
        daemon = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sparkd.cli", "run", "--config", str(config),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await wait_for_cycle(port, within=60)
            for _ in range(runs):
                bare.append(await timed(sys.executable, "-c", "pass"))
                status.append(
                    await timed(
                        sys.executable, "-m", "sparkd.cli", "status", "--config", str(config)
                    )
                )
        finally:
            daemon.send_signal(signal.SIGTERM)
            await asyncio.wait_for(daemon.wait(), 60)
    return bare, status


async def main(quick: bool = False, first_address: str = FIRST_ADDRESS) -> None:
    runs = 10 if quick else 40
    async with sim_world("healthy", first_address=first_address) as world:
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
        bare, status = await cli_status(world, 5 if quick else 20)
    overhead = [s["overhead_s"] for s in samples]
    completion = median([s["sparkd_s"] for s in samples])
    summary = {
        "sparkd_median_ms": 1000 * completion,
        "server_median_ms": 1000 * median([s["server_s"] for s in samples]),
        "overhead_median_ms": 1000 * median(overhead),
        "overhead_p95_ms": 1000 * p95(overhead),
        "command_median_s": median(commands),
        "command_over_completion": median(commands) / completion,
        "bare_python_median_s": median([w for w, _ in bare]),
        "status_median_s": median([w for w, _ in status]),
        "status_beyond_bare_s": median([s[0] - b[0] for s, b in zip(status, bare, strict=True)]),
        "bare_python_cpu_median_s": median([c for _, c in bare]),
        "status_cpu_median_s": median([c for _, c in status]),
        "status_cpu_beyond_bare_s": median(
            [s[1] - b[1] for s, b in zip(status, bare, strict=True)]
        ),
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
            ["bare `python -c pass` (s)", summary["bare_python_median_s"],
             p95([w for w, _ in bare])],
            ["`sparkd status` (s)", summary["status_median_s"], p95([w for w, _ in status])],
            ["`sparkd status` beyond bare (s)", summary["status_beyond_bare_s"],
             p95([s[0] - b[0] for s, b in zip(status, bare, strict=True)])],
            ["bare `python -c pass` CPU (s)", summary["bare_python_cpu_median_s"], ""],
            ["`sparkd status` CPU (s)", summary["status_cpu_median_s"], ""],
            ["`sparkd status` CPU beyond bare (s)", summary["status_cpu_beyond_bare_s"], ""],
        ],
    )  # fmt: skip
    write_result(
        "probe",
        {
            "samples": samples,
            "commands": commands,
            "bare_python": bare,
            "status": status,
            "summary": summary,
        },
        text,
    )

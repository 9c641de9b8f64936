"""`footprint`: `sparkd run` as its own process on a healthy 2-host world: RSS, CPU, open file
descriptors and threads over many fast cycles (interval and recheck 0.05 s), then idle at the
default 30 s interval: 10,000 cycles (about half an hour here: the simulated hosts' fact scripts
bound the pace) and 5 idle minutes; `--quick` runs a minute of each."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import (
    SimWorld,
    free_port,
    median,
    open_fds,
    process_cpu,
    rss_mb,
    sim_world,
    table,
    wait_healthy,
    write_result,
)


def daemon_config(world: SimWorld, path: Path, state: Path, port: int, interval: float) -> Path:
    text = world.config_path.read_text()
    text = re.sub(r"^interval = .*$", f"interval = {interval}", text, flags=re.M)
    text = re.sub(r"^recheck_interval = .*$", f"recheck_interval = {interval}", text, flags=re.M)
    text = re.sub(r"^listen = .*$", f'listen = "127.0.0.1:{port}"', text, flags=re.M)
    text = re.sub(r"^state_dir = .*$", f'state_dir = "{state}"', text, flags=re.M)
    path.write_text(text)
    return path


async def wait_for_cycle(port: int, within: float) -> None:
    """Returns once the daemon on `port` has completed a cycle (its metrics say so)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if cycles(port) >= 1:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("sparkd run did not complete a cycle")
        await asyncio.sleep(0.2)


def cycles(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return int(
        sum(
            float(m.group(1))
            for m in re.finditer(r"^sparkd_reconcile_cycles_total\{[^}]*\} (\S+)$", text, re.M)
        )
    )


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def sample(pid: int, port: int) -> dict[str, Any]:
    return {
        "t": time.monotonic(),
        "cycles": cycles(port),
        "rss_mb": rss_mb(pid),
        "cpu_s": process_cpu(pid),
        "fds": open_fds(pid),
        "threads": threads(pid),
    }


async def run_daemon(
    world: SimWorld, interval: float, seconds: float, until_cycles: int | None = None
) -> list[dict[str, Any]]:
    """Samples of `sparkd run` for `seconds`, or until `until_cycles` if that comes first."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port("127.0.0.1")
        config = daemon_config(
            world, Path(tmp) / "sparkd.toml", Path(tmp) / "state", port, interval
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c",
            "import sys; from sparkd.cli import main; raise SystemExit(main(sys.argv[1:]))",
            "run", "--config", str(config),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        samples: list[dict[str, Any]] = []
        try:
            await wait_for_cycle(port, within=30)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                samples.append(sample(process.pid, port))
                if until_cycles is not None and samples[-1]["cycles"] >= until_cycles:
                    break
                await asyncio.sleep(min(5.0, seconds / 20))
            samples.append(sample(process.pid, port))
        finally:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 60)
    return samples


def at_cycle(samples: list[dict[str, Any]], n: int) -> dict[str, Any]:
    return next((s for s in samples if s["cycles"] >= n), samples[-1])


async def main(quick: bool = False) -> None:
    # At most an hour of cycles: a loaded machine slows the simulated hosts, not the count.
    busy_seconds, idle_seconds = (60.0, 60.0) if quick else (3600.0, 300.0)
    target = None if quick else 10_000
    async with sim_world("healthy") as world:
        await wait_healthy(world)
        busy = await run_daemon(world, 0.05, busy_seconds, until_cycles=target)
        idle = await run_daemon(world, 30.0, idle_seconds)
    busy_seconds = busy[-1]["t"] - busy[0]["t"]
    first, last = at_cycle(busy, 10), busy[-1]
    per_cycle_ms = (
        1000 * (last["cpu_s"] - first["cpu_s"]) / max(1, last["cycles"] - first["cycles"])
    )
    idle_cpu = (idle[-1]["cpu_s"] - idle[0]["cpu_s"]) / (idle[-1]["t"] - idle[0]["t"])
    summary = {
        "cycles": last["cycles"],
        "busy_seconds": busy_seconds,
        "rss_at_10_mb": first["rss_mb"],
        "rss_at_end_mb": last["rss_mb"],
        "rss_growth_mb": last["rss_mb"] - first["rss_mb"],
        "rss_max_mb": max(s["rss_mb"] for s in busy + idle),
        "cpu_per_cycle_ms": per_cycle_ms,
        "fds": (first["fds"], last["fds"]),
        "threads": (first["threads"], last["threads"]),
        "idle_seconds": idle_seconds,
        "idle_cpu_share": idle_cpu,
        "idle_rss_mb": median([s["rss_mb"] for s in idle]),
        # The daemon inherits the environment: `MALLOC_ARENA_MAX=2 python -m bench footprint`
        # measures glibc's allocator with that limit.
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
    }
    text = table(
        f"footprint: sparkd run on 2 hosts, {summary['cycles']} fast cycles in "
        f"{busy_seconds:.0f} s, then {idle_seconds:.0f} s idle at a 30 s interval",
        ["measure", "value"],
        [
            ["RSS at cycle 10 (MB)", first["rss_mb"]],
            [f"RSS at cycle {last['cycles']} (MB)", last["rss_mb"]],
            ["RSS growth (MB)", summary["rss_growth_mb"]],
            ["RSS max (MB)", summary["rss_max_mb"]],
            ["CPU per cycle (ms)", per_cycle_ms],
            ["open fds, cycle 10 -> end", f"{first['fds']} -> {last['fds']}"],
            ["threads, cycle 10 -> end", f"{first['threads']} -> {last['threads']}"],
            ["idle CPU (% of a core)", f"{100 * idle_cpu:.2f}"],
            ["MALLOC_ARENA_MAX", summary["malloc_arena_max"] or "unset (glibc default)"],
        ],
    )
    write_result("footprint", {"summary": summary, "busy": busy, "idle": idle}, text)

"""What every benchmark shares: a simulated world in its own process, CPU and memory readings,
medians, tables and result files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import resource
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkd.settings import Settings, load_settings
from sparkd_sim.control import send_fault

RESULTS = Path(__file__).with_name("results")
REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# Worlds of the benchmarks live here, apart from the tests' 127.0.0.x worlds on the same machine.
FIRST_ADDRESS = "127.77.0.2"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p95(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def process_cpu(pid: int) -> float:
    """CPU seconds of a process and of its children it has waited for (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime + cutime + cstime) / CLK_TCK


def own_cpu() -> float:
    """This process's own CPU seconds (the daemon's, when sparkd runs in-process)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mb(pid: int | None = None) -> float:
    pages = int(Path(f"/proc/{pid or os.getpid()}/statm").read_text().split()[1])
    return pages * PAGE / 1e6


def open_fds(pid: int | None = None) -> int:
    return len(os.listdir(f"/proc/{pid or os.getpid()}/fd"))


@dataclass
class SimWorld:
    """`sparkd sim` running as a separate process."""

    process: asyncio.subprocess.Process
    directory: Path
    config_path: Path
    settings: Settings
    banner: list[str]

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu(self) -> float:
        """The world's CPU seconds so far: its SSH servers, fake tools and model servers."""
        return process_cpu(self.pid)

    async def fault(self, name: str, host: str, arg: str | None = None) -> str:
        answer = await send_fault(self.directory / "control.sock", name, host, arg)
        if not answer.get("ok"):
            raise RuntimeError(f"fault {name} {host}: {answer.get('message')}")
        return str(answer.get("message", ""))


@contextlib.asynccontextmanager
async def sim_world(
    scenario: str = "healthy",
    *,
    hosts: int = 2,
    clusters: int = 1,
    scale: float | None = None,
    first_address: str = FIRST_ADDRESS,
) -> AsyncIterator[SimWorld]:
    with tempfile.TemporaryDirectory(prefix="sparkd-bench-") as tmp:
        directory = Path(tmp) / "world"
        argv = [
            sys.executable, "-m", "sparkd.cli", "sim",
            "--scenario", scenario, "--hosts", str(hosts), "--clusters", str(clusters),
            "--dir", str(directory), "--first-address", first_address, "--no-noisy-logs",
        ]  # fmt: skip
        if scale is not None:
            argv += ["--scale", str(scale)]
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, cwd=REPO
        )
        assert process.stdout is not None
        banner: list[str] = []
        try:
            async with asyncio.timeout(120):
                while True:
                    line = (await process.stdout.readline()).decode()
                    if not line:
                        raise RuntimeError("sparkd sim exited: " + "".join(banner))
                    banner.append(line)
                    if line.startswith("Ctrl-C stops the world."):
                        break
            config = directory / "sparkd.toml"
            yield SimWorld(process, directory, config, load_settings(config), banner)
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    async with asyncio.timeout(30):
                        await process.wait()
                except TimeoutError:
                    process.kill()
                    await process.wait()


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in header]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def write_result(name: str, data: dict[str, Any], text: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    document = {
        "benchmark": name,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average": os.getloadavg(),
        },
        **data,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(text)
    print(f"-> {path.relative_to(RESULTS.parent.parent)}\n", flush=True)
    return path


class Counting:
    """Counts what sparkd's SSH layer does (connections made, commands run, channels opened),
    by wrapping HostConnection's methods for the life of the context."""

    def __init__(self) -> None:
        self.connects = 0
        self.execs = 0
        self.channels = 0
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> Counting:
        from sparkd.shell import ssh

        cls = ssh.HostConnection
        self._saved = {n: getattr(cls, n) for n in ("_connect", "run", "open_connection")}
        counter = self

        async def _connect(conn: Any, *a: Any, **k: Any) -> Any:
            counter.connects += 1
            return await counter._saved["_connect"](conn, *a, **k)

        async def run(conn: Any, *a: Any, **k: Any) -> Any:
            counter.execs += 1
            return await counter._saved["run"](conn, *a, **k)

        async def open_connection(conn: Any, *a: Any, **k: Any) -> Any:
            counter.channels += 1
            return await counter._saved["open_connection"](conn, *a, **k)

        setattr(cls, "_connect", _connect)  # noqa: B010 (a wrapper of the method, for counting)
        setattr(cls, "run", run)  # noqa: B010
        setattr(cls, "open_connection", open_connection)  # noqa: B010
        return self

    def __exit__(self, *exc: object) -> None:
        from sparkd.shell import ssh

        for name, value in self._saved.items():
            setattr(ssh.HostConnection, name, value)

    def snapshot(self) -> tuple[int, int, int]:
        return self.connects, self.execs, self.channels


async def wait_healthy(world: SimWorld, within: float = 180.0) -> None:
    """Dry-run cycles of every cluster until each is healthy (the world's own bring-up)."""
    from sparkd.runtime.controller import Controller
    from sparkd.runtime.state import StateDir
    from sparkd.shell.ssh import SshPool

    pool = SshPool()
    try:
        with tempfile.TemporaryDirectory() as state:
            pending = list(world.settings.clusters)
            deadline = time.monotonic() + within
            while pending:
                controllers = [
                    Controller(c, pool, StateDir(Path(state)), dry_run=True, watch_events=False)
                    for c in pending
                ]
                plans = await asyncio.gather(*(c.cycle() for c in controllers))
                pending = [c for c, p in zip(pending, plans, strict=True) if p.phase != "healthy"]
                if pending and time.monotonic() > deadline:
                    raise RuntimeError(f"{len(pending)} clusters not healthy: {plans[0].reason}")
                await asyncio.sleep(0.5)
    finally:
        await pool.close()


def free_port(address: str) -> int:
    """A TCP port free on `address` now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


async def until(predicate: Callable[[], object], poll: float = 0.02) -> None:
    """Poll `predicate` until it holds (a benchmark watches state it does not own)."""
    while not predicate():  # noqa: ASYNC110
        await asyncio.sleep(poll)

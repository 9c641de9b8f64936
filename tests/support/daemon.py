"""Helpers for the real daemon (controllers, executor, API) against the simulated world over SSH."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from sparkd.model.cluster import ClusterSpec
from sparkd.model.plan import Plan
from sparkd.runtime.controller import Controller
from sparkd.runtime.daemon import Daemon
from sparkd.runtime.state import StateDir
from sparkd.settings import Settings, load_settings
from sparkd.shell.execute import ExecutorTiming
from sparkd.shell.ssh import SshPool
from sparkd.web.serve import serve_api
from sparkd_sim.timing import FAST_FACTOR
from sparkd_sim.world import CommandRecord, World

FAST_EXECUTOR = ExecutorTiming(poll=0.03, serve_appear=5.0, stop_grace=2.0)
# Tool calls that change something on a host; everything else sparkd runs only reads.
MUTATING = (
    ("docker", "run"),
    ("docker", "rm"),
    ("docker", "stop"),
    ("docker", "kill"),
    ("systemctl", "stop"),
    ("systemctl", "disable"),
    ("systemctl", "start"),
    ("systemctl", "restart"),
    ("kill",),
    ("vllm", "serve"),
)


def mutations(world: World, host: str | None = None, since: float = 0.0) -> list[CommandRecord]:
    found = []
    for record in world.commands(host):
        if record.source != "tool" or record.at < since:
            continue
        words = record.command.split()
        if words and words[0] == "sudo":
            words = words[2:] if len(words) > 1 and words[1] == "-n" else words[1:]
        if any(tuple(words[: len(m)]) == m for m in MUTATING):
            found.append(record)
    return found


def fast_cluster(cluster: ClusterSpec, **changes: Any) -> ClusterSpec:
    """Intervals and graces in fractions of a second."""
    base: dict[str, Any] = {
        "interval": 1.0,
        "recheck_interval": 0.2,
        # Generous against a loaded 2-core CI machine: a fast completion takes ~0.1s here.
        "probe_interval": 1.2,
        "probe": cluster.probe.model_copy(update={"timeout": 1.0}),
        "ssh": cluster.ssh.model_copy(update={"connect_timeout": 1.0, "command_timeout": 3.0}),
        # Ray's timers keep their real ratio to the recheck interval (sim.timing.FAST_FACTOR):
        # a dead node lingers ~3 rechecks, a hung one ~13, the join timeout 24.
        "ray": cluster.ray.model_copy(update={"join_timeout": 120.0 * FAST_FACTOR}),
        # The silent stages' caps keep their real ratio to load_timeout (1800 and 900 of 3600 s).
        "model": cluster.model.model_copy(
            update={
                "load_stall": 5.0,
                "load_timeout": 30.0,
                "compile_timeout": 15.0,
                "graph_capture_timeout": 7.5,
            }
        ),
        "policy": cluster.policy.model_copy(
            update={
                "backoff_initial": 0.1,
                "backoff_max": 0.5,
                "healthy_reset": 5.0,
                # Two intervals, and the first-shape grace, at their real ratio (30 s interval);
                # so is the prefill rate, which sets how long one engine step or one prompt's
                # prefill may last against the window.
                "hang_window": 2.0,
                "hang_ready_grace": 70.0 / 30.0,
                "prefill_rate": 1000.0 * 30.0,
            }
        ),
        # Below vLLM: the flap window and the wedge's unreachable time keep their real ratio.
        "fabric": cluster.fabric.model_copy(update={"flap_window": 600.0 * FAST_FACTOR}),
        "power": cluster.power.model_copy(update={"unreachable_for": 600.0 * FAST_FACTOR}),
    }
    for key, value in changes.items():
        if isinstance(value, dict):
            base[key] = (base.get(key) or getattr(cluster, key)).model_copy(update=value)
        else:
            base[key] = value
    return cluster.model_copy(update=base)


def world_settings(world: World, state: Path, **changes: Any) -> Settings:
    loaded = load_settings(world.config_path)
    return Settings.model_construct(
        daemon=loaded.daemon.model_copy(update={"state_dir": state, "listen": "127.0.0.1:0"}),
        clusters=tuple(fast_cluster(c, **changes) for c in loaded.clusters),
    )


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], within: float = 15.0, poll: float = 0.05
) -> None:
    deadline = time.monotonic() + within
    while True:
        outcome = check()
        if isinstance(outcome, Awaitable):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(poll)


@contextlib.asynccontextmanager
async def running(ctl: Controller) -> AsyncIterator[Controller]:
    """The controller's own loop in the background, stopped and awaited on the way out."""
    task = asyncio.create_task(ctl.run())
    try:
        yield ctl
    finally:
        ctl.stop()
        await task


async def converge(controller: Controller, cycles: int = 60, pause: float = 0.1) -> list[Any]:
    """Cycle until converged; return every plan made on the way."""
    plans = []
    for _ in range(cycles):
        plan = await controller.cycle()
        plans.append(plan)
        if plan.converged:
            return plans
        await asyncio.sleep(pause)
    raise AssertionError(f"not converged after {cycles} cycles: {plans[-1].reason}")


@contextlib.asynccontextmanager
async def daemon_on(world: World, state: Path, **changes: Any) -> AsyncIterator[Daemon]:
    """The whole daemon (controllers, executor, API) on the world's config with scaled times
    (and the cluster `changes`, as `fast_cluster` takes them), stopped on the way out."""
    daemon = Daemon(
        world_settings(world, state, **changes),
        world.config_path,
        executor_timing=FAST_EXECUTOR,
        api=serve_api,
    )
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


def controller(world: World, pool: SshPool, state: Path, **kwargs: Any) -> Controller:
    cluster_changes = kwargs.pop("cluster", {})
    settings = world_settings(world, state, **cluster_changes)
    return Controller(
        settings.clusters[0],
        pool,
        StateDir(state),
        executor_timing=FAST_EXECUTOR,
        **kwargs,
    )


async def converged(
    world: World, pool: SshPool, state: Path, cycles: int = 60, **kwargs: Any
) -> tuple[Controller, float]:
    """A controller (as `controller` makes it) cycled until converged, and the wall clock then:
    what a test's world does after it is what the test checks."""
    ctl = controller(world, pool, state, **kwargs)
    await converge(ctl, cycles=cycles)
    return ctl, time.time()


async def after_its_own_launch(world: World) -> float:
    """The wall clock once a `healthy` world has launched its own model (just after it starts):
    only sparkd's commands after it count."""
    await eventually(lambda: bool(mutations(world)), within=10)
    return time.time()


async def cycles(ctl: Controller, count: int, pause: float = 0.0) -> list[Plan]:
    plans = []
    for _ in range(count):
        plans.append(await ctl.cycle())
        if pause:
            await asyncio.sleep(pause)
    return plans


async def cycle_until(ctl: Controller, done: str, limit: int = 300) -> list[Plan]:
    """Cycle until a plan's reason holds `done` or its phase is `done`; the plans on the way."""
    plans = []
    for _ in range(limit):
        plan = await ctl.cycle()
        plans.append(plan)
        if done in plan.reason or plan.phase == done:
            return plans
    raise AssertionError(f"never {done!r}: {plans[-1].phase}: {plans[-1].reason}")


FAST_TOML = {
    r"^interval = .*$": "interval = 1.0",
    r"^probe_interval = .*$": "probe_interval = 1.2",
    r"^recheck_interval = .*$": "recheck_interval = 0.2",
    r"^(\s*)timeout = .*$": r"\1timeout = 1.0",
    r"^(\s*)connect_timeout = .*$": r"\1connect_timeout = 1.0",
    r"^(\s*)command_timeout = .*$": r"\1command_timeout = 3.0",
    r"^(\s*)load_stall = .*$": r"\1load_stall = 5.0",
    r"^(\s*)load_timeout = .*$": r"\1load_timeout = 30.0",
    r"^(\s*)backoff_initial = .*$": r"\1backoff_initial = 0.1",
    r"^(\s*)backoff_max = .*$": r"\1backoff_max = 0.5",
}


def write_fast_config(
    world: World, path: Path, state: Path, port: int, token_file: Path | None = None
) -> Path:
    """The world's generated config, with scaled intervals, for a daemon in another process."""
    import re

    text = world.config_path.read_text()
    for pattern, replacement in FAST_TOML.items():
        text = re.sub(pattern, replacement, text, flags=re.M)
    text = re.sub(r"^listen = .*$", f'listen = "127.0.0.1:{port}"', text, flags=re.M)
    text = re.sub(r"^state_dir = .*$", f'state_dir = "{state}"', text, flags=re.M)
    if token_file is not None:
        text = text.replace("[daemon]\n", f'[daemon]\ncontrol_token_file = "{token_file}"\n', 1)
    path.write_text(text)
    load_settings(path)  # fail here, not in the daemon, if the substitutions broke it
    return path


def fast_config_in(world: World, directory: Path) -> tuple[Path, int]:
    """`write_fast_config` for a daemon on a free port: the config `directory`/sparkd.toml, the
    state in `directory`/state. The config and the port."""
    port = free_port()
    return write_fast_config(world, directory / "sparkd.toml", directory / "state", port), port


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port

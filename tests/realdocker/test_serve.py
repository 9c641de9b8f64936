"""The model's process in the real head container: launched by `docker exec -d` with its PID
file, found by `docker top`, signalled by its recorded PID, and the `docker events` stream that
wakes the controller when it ends, read by sparkd's own event watch."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkd.core.reading import parsers
from sparkd.core.spec import container_name, serve_pid_path
from sparkd.shell import catalogue
from sparkd.shell.events import EventWatch
from sparkd_sim.real_docker import IMAGE
from tests.realdocker.conftest import Tier, start_ray

pytestmark = [pytest.mark.realdocker, pytest.mark.asyncio(loop_scope="module")]


async def until(check: Callable[[], object], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def launched(tier: Tier) -> parsers.TopRow:
    """The head's container and the model in it, as sparkd starts them; the serve's row."""
    rc, _, err = await tier.run(start_ray(tier))
    assert rc == 0, err
    rc, _, err = await tier.run(catalogue.actions.start_model(tier.cluster, 20).command)
    assert rc == 0, err
    serve: parsers.TopRow | None = None
    deadline = time.monotonic() + 10
    while serve is None:
        assert time.monotonic() < deadline, "the serve process never showed in docker top"
        rows = await top(tier)
        serve = parsers.find_serve(rows)
    return serve


async def stream_up(tier: Tier, wakes: list[str]) -> None:
    """Until the event watch reports: a container matching the cleanup patterns starts."""
    deadline = time.monotonic() + 15
    while "glm-ready start" not in wakes:
        assert time.monotonic() < deadline, "the event stream never came up"
        await tier.daemon.docker("rm", "-f", "glm-ready")
        rc, _, err = await tier.daemon.docker(
            "run", "-d", "--name", "glm-ready", "--network", "none", IMAGE, "true"
        )
        assert rc == 0, err
        await asyncio.sleep(0.3)


async def engine_of(tier: Tier, serve: parsers.TopRow) -> int:
    """The host PID of the serve's engine process: its child."""
    head = container_name(tier.cluster, tier.host)
    rc, out, err = await tier.daemon.docker("top", head, "-eo", "pid,ppid")
    assert rc == 0, err
    children = [
        int(p) for p, pp in (line.split() for line in out.splitlines()[1:]) if int(pp) == serve.pid
    ]
    assert len(children) == 1, out
    return children[0]


async def top(tier: Tier) -> tuple[parsers.TopRow, ...]:
    rc, out, err = await tier.run(catalogue.reads.serve_processes(tier.cluster, 20).command)
    assert rc == 0, err
    return parsers.parse_docker_top(out)


async def test_the_serve_process_is_found_and_its_pid_file_names_it(clean: Tier) -> None:
    serve = await launched(clean)
    head = container_name(clean.cluster, clean.host)
    # `docker top` gives host PIDs; the file holds the PID inside the container, where
    # `signal_serve` uses it. Both name the one `vllm serve` process (`exec` replaced `sh -c`).
    rc, pid, _ = await clean.daemon.docker("exec", head, "cat", serve_pid_path(clean.cluster))
    assert rc == 0 and pid.strip().isdigit()
    rc, cmdline, _ = await clean.daemon.docker("exec", head, "cat", f"/proc/{pid.strip()}/cmdline")
    assert rc == 0 and "vllm\0serve\0" in cmdline
    host_cmdline = Path(f"/proc/{serve.pid}/cmdline").read_text()  # noqa: ASYNC240
    assert host_cmdline == cmdline
    reading = await clean.read()
    assert reading.extras is not None
    assert reading.extras.serve.running
    assert reading.extras.serve.pid == serve.pid
    assert reading.extras.serve.elapsed_seconds is not None
    assert reading.extras.serve.cpu_seconds is not None


async def test_events_wake_on_the_serve_ending_and_not_on_sparkds_own_execs(clean: Tier) -> None:
    wakes: list[str] = []
    watch = EventWatch(clean.cluster, clean.pool, lambda host, why: wakes.append(why))
    watch.start()
    try:
        await stream_up(clean, wakes)
        serve = await launched(clean)
        head = container_name(clean.cluster, clean.host)
        await until(lambda: f"{head} start" in wakes)
        # A read of sparkd's own (`docker exec` of a shell that is not `vllm serve`) ends too,
        # and wakes nothing.
        before = len(wakes)
        since = time.time()
        rc, _, _ = await clean.run(catalogue.actions.signal_serve(clean.cluster, "0", 20).command)
        assert rc == 0
        events = await clean.events(since, "--filter", f"container={head}")
        assert [e["action"].partition(":")[0] for e in events] == [
            "exec_create",
            "exec_start",
            "exec_die",
        ]
        await asyncio.sleep(0.5)
        assert wakes[before:] == []
        # The engine killed underneath: vLLM's API server then exits with status 0.
        engine = await engine_of(clean, serve)
        before = len(wakes)
        since = time.time()
        os.kill(engine, signal.SIGKILL)
        await until(lambda: f"{head} exec_die" in wakes[before:])
        assert wakes[before:] == [f"{head} exec_die"]
        events = await clean.events(since, "--filter", f"container={head}")
        assert [(e["action"], e.get("exitCode")) for e in events] == [("exec_die", "0")]
        assert parsers.find_serve(await top(clean)) is None
        del serve
    finally:
        await watch.stop()


async def test_signal_serve_stops_the_recorded_process(clean: Tier) -> None:
    await launched(clean)
    rc, _, err = await clean.run(catalogue.actions.signal_serve(clean.cluster, "TERM", 20).command)
    assert rc == 0, err
    deadline = time.monotonic() + 10
    while parsers.find_serve(await top(clean)) is not None:
        assert time.monotonic() < deadline, "the serve process did not end"


async def test_the_daemon_stopping_wakes_the_event_watch(clean: Tier) -> None:
    """dockerd stopping (an upgrade, a restart) ends every container without live-restore, and
    the stream with it: the controller looks at once."""
    wakes: list[str] = []
    watch = EventWatch(clean.cluster, clean.pool, lambda host, why: wakes.append(why))
    watch.start()
    try:
        await stream_up(clean, wakes)
        rc, _, err = await clean.run(start_ray(clean))
        assert rc == 0, err
        head = container_name(clean.cluster, clean.host)
        await until(lambda: f"{head} start" in wakes)
        before = len(wakes)
        assert clean.world.real_docker is not None
        await clean.world.real_docker.stop_daemon(clean.host.name)
        await until(lambda: len(wakes) > before)
        # dockerd signals its containers on the way down: their events come before the end.
        assert wakes[before] in (f"{head} kill", f"{head} die"), wakes[before:]
    finally:
        await watch.stop()

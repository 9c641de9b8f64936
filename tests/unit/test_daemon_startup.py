"""A start-up that fails midway undoes exactly what it had set up: the API's listener is closed,
the maintenance scheduler stopped, HA's renewals and the controllers' tasks ended."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkd.ha.config import HaSpec
from sparkd.runtime.controller import Controller
from sparkd.runtime.daemon import Daemon
from sparkd.runtime.maintenance import MaintenanceScheduler
from sparkd.runtime.startup import StartupError
from sparkd.settings import Settings, load_settings
from sparkd.web.serve import serve_api
from tests.support.daemon import free_port
from tests.toy import EXAMPLE_CONFIG


class StepFailed(Exception):
    pass


def settings(tmp_path: Path, port: int, *, ha: bool = False) -> Settings:
    base = load_settings(EXAMPLE_CONFIG)
    first = base.clusters[0]
    daemon = base.daemon.model_copy(
        update={"listen": f"127.0.0.1:{port}", "state_dir": tmp_path / "state"}
    )
    # etcd at a loopback port nobody listens on: HA's renewals run, and reach nothing.
    spec = HaSpec(etcd_endpoints=(f"http://127.0.0.1:{free_port()}",)) if ha else None
    return base.model_copy(
        update={
            "daemon": daemon,
            "clusters": (first, first.model_copy(update={"name": "second"})),
            "ha": spec,
        }
    )


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def port() -> Iterator[int]:
    yield free_port()


async def started_and_failed(daemon: Daemon) -> BaseException:
    with pytest.raises((StepFailed, StartupError)) as failed:
        await daemon.start()
    await asyncio.sleep(0)  # anything left scheduled would now run
    return failed.value


def nothing_running(daemon: Daemon, port: int) -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert others == [], others
    assert not listening(port)
    assert daemon.runner is None
    assert not daemon.maintenance.scheduler.running
    assert all(task.done() for task in daemon.tasks.values())


async def test_a_busy_port_leaves_nothing_of_the_earlier_steps(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        daemon = Daemon(settings(tmp_path, port, ha=True), tmp_path / "sparkd.toml", api=serve_api)
        failed = await started_and_failed(daemon)
        assert isinstance(failed, StartupError) and "is in use" in failed.line
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == [], others
        assert daemon.runner is None
        assert not daemon.maintenance.scheduler.running
        assert daemon.tasks == {}


async def test_a_failure_after_the_api_is_bound_closes_its_listener(
    tmp_path: Path, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: MaintenanceScheduler) -> None:
        assert listening(port)  # the step before it did bind the API
        raise StepFailed("scheduler")

    monkeypatch.setattr(MaintenanceScheduler, "start", fail)
    daemon = Daemon(settings(tmp_path, port), tmp_path / "sparkd.toml", api=serve_api)
    await started_and_failed(daemon)
    nothing_running(daemon, port)


async def test_a_failure_starting_ha_stops_the_scheduler_and_the_api(
    tmp_path: Path, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkd.ha.ownership import Ownership

    def fail(self: Ownership) -> None:
        raise StepFailed("ha")

    monkeypatch.setattr(Ownership, "start", fail)
    daemon = Daemon(settings(tmp_path, port, ha=True), tmp_path / "sparkd.toml", api=serve_api)
    await started_and_failed(daemon)
    nothing_running(daemon, port)


async def test_a_failure_starting_the_second_controller_ends_the_first(
    tmp_path: Path, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Daemon._run
    started: list[asyncio.Task[None]] = []

    def run(self: Daemon, controller: Controller) -> asyncio.Task[None]:
        if started:
            raise StepFailed("second controller")
        started.append(real(self, controller))
        return started[0]

    monkeypatch.setattr(Daemon, "_run", run)
    daemon = Daemon(settings(tmp_path, port, ha=True), tmp_path / "sparkd.toml", api=serve_api)
    await started_and_failed(daemon)
    assert started and started[0].done()
    nothing_running(daemon, port)
    assert daemon.ha is not None and daemon.ha._stopping

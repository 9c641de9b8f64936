"""sparkd's own forced-command wrapper in front of every host of a simulated world with real
OpenSSH: the commands the running daemon really sends (Ray's reading reused included) all pass,
so a converged cluster stays converged."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sparkd.runtime.cluster_view import CycleRecord
from sparkd.runtime.controller import Controller
from sparkd.shell import forced
from sparkd.shell.ssh import SshPool
from sparkd_demo.cli import sparkd_spec_labels
from tests.e2e.test_events import until
from tests.support.daemon import controller, running
from tests.support.sshd import openssh_world

pytestmark = pytest.mark.sshd


async def test_a_converged_cluster_behind_the_wrapper_stays_healthy_with_ray_reused(
    tmp_path: Path, pool: SshPool
) -> None:
    async with openssh_world(
        tmp_path / "world", "healthy", spec_labels=sparkd_spec_labels
    ) as world:
        records: list[CycleRecord] = []

        def keep(_: Controller, record: CycleRecord) -> None:
            records.append(record)

        ctl = controller(
            world,
            pool,
            tmp_path / "state",
            cluster={"interval": 0.2, "probe_interval": 2.0},
            on_record=keep,
        )
        # Built from the daemon's own cluster: the timeouts are part of each command's text.
        for host in ctl.cluster.hosts:
            program = forced.wrapper(ctl.cluster, host, forced.public_key(ctl.cluster.ssh))
            world.install_forced_command(host.name, program)
        async with running(ctl):
            await until(lambda: ctl.view.plan is not None and ctl.view.plan.converged, 30)
            start, since = len(records), time.time()
            await until(lambda: len(records) - start >= 15, 60)
        after = records[start:]
        ray_calls = [
            r
            for r in world.commands("spark-a")
            if r.at >= since and r.command.split()[:1] == ["ray"]
        ]
        assert len(ray_calls) < len(after), (len(ray_calls), len(after))
        assert any(
            r.observed is not None and r.observed.ray is not None and r.observed.ray.reused
            for r in after
        )
        for record in after:
            assert record.ok and record.observed is not None and record.plan is not None
            errors = [h.error for h in record.observed.hosts if h.error is not None]
            assert errors == [], errors
            assert record.plan.phase == "healthy" and record.plan.converged, record.plan.reason

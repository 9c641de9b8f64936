"""Maintenance windows against the simulated world: observed, nothing acted on, then back."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

from sparkd.model.cluster import MaintenanceSpec
from sparkd.model.plan import ActionOutcome
from sparkd.runtime.controller import Controller
from sparkd.runtime.daemon import Daemon
from sparkd.shell.ssh import SshPool
from sparkd.web.serve import serve_api
from sparkd_sim.world import World
from tests.support.daemon import FAST_EXECUTOR, controller, eventually, mutations, world_settings
from tests.support.http import parse, value

REASON = "weekly host updates"


async def test_inside_a_window_the_daemon_observes_and_acts_on_nothing(
    seed_world: World, tmp_path: Path
) -> None:
    always = MaintenanceSpec(cron="* * * * *", duration="1h", reason=REASON)
    daemon = Daemon(
        world_settings(seed_world, tmp_path / "state", maintenance=(always,)),
        seed_world.config_path,
        executor_timing=FAST_EXECUTOR,
        api=serve_api,
    )
    await daemon.start()
    try:
        async with aiohttp.ClientSession() as session:

            async def cycles(n: int) -> bool:
                async with session.get(f"{daemon.url}/status") as r:
                    return int((await r.json())["clusters"][0]["cycles"]) >= n

            await eventually(lambda: cycles(3), within=20)
            async with session.get(f"{daemon.url}/status") as r:
                cluster = (await r.json())["clusters"][0]
            async with session.get(f"{daemon.url}/metrics") as r:
                samples = parse(await r.text())
        # The scheduler will wake the controller at the next opening.
        opening = daemon.maintenance.next_opening("sparks")
        assert opening is not None and opening.timestamp() - time.time() <= 60
    finally:
        await daemon.stop()
    assert mutations(seed_world) == []
    assert cluster["phase"] == "paused"
    assert cluster["reason"].startswith("paused by maintenance window until ")
    assert cluster["reason"].endswith(f": {REASON}")
    assert cluster["paused"] is None  # the window decides; nothing is remembered
    window = cluster["maintenance"]
    assert window["reason"] == REASON and window["end"] - window["start"] == 3600
    assert len(cluster["plan"]["withheld"]) == 8
    assert cluster["snapshot"]["hosts"][0]["units"], "the hosts are still observed"
    assert value(samples, "sparkd_cluster_paused", cluster="sparks") == 1
    assert value(samples, "sparkd_cluster_maintenance", cluster="sparks") == 1
    assert value(samples, "sparkd_cluster_phase", cluster="sparks", phase="paused") == 1


async def test_a_window_opening_mid_plan_lets_the_running_action_finish(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    # A window that opens at the next minute; the controller's clock jumps into it as soon as
    # the first action of the plan finishes.
    opens = (datetime.now(UTC) + timedelta(seconds=65)).replace(second=0, microsecond=0)
    spec = MaintenanceSpec(
        cron=f"{opens.minute} {opens.hour} * * *", duration="2m", reason=REASON, timezone="UTC"
    )
    offset = [0.0]
    finished: list[ActionOutcome] = []

    def jump(_: Controller, outcome: ActionOutcome) -> None:
        finished.append(outcome)
        if len(finished) == 1:
            offset[0] = opens.timestamp() + 1 - time.time()

    ctl = controller(
        seed_world,
        pool,
        tmp_path / "s",
        cluster={"maintenance": (spec,)},
        wall_clock=lambda: time.time() + offset[0],
        on_action=jump,
    )
    plan = await ctl.cycle()
    assert plan.phase == "cleaning" and len(plan.actions) == 8
    assert [(o.action.kind, o.result) for o in finished] == [("stop_unit", "ok")]
    changed = mutations(seed_world)
    first = finished[0].action.target
    assert changed and all(
        r.command.startswith("systemctl ") and first in r.command for r in changed
    ), [r.command for r in changed]
    before = len(changed)

    inside = await ctl.cycle()
    assert inside.phase == "paused" and inside.actions == ()
    assert inside.reason.startswith("paused by maintenance window until ")
    assert inside.reason.endswith(REASON)
    assert len(inside.withheld) == 7
    assert len(mutations(seed_world)) == before

    offset[0] = opens.timestamp() + 121 - time.time()  # the window has closed
    after = await ctl.cycle()
    assert after.phase == "cleaning" and len(after.actions) == 7
    assert len(mutations(seed_world)) > before

"""The power cycle of a wedged host against the simulated world: `[clusters.power] command` is
the world's own PDU CLI (`sparkd sim power cycle HOST`), run by the executor on this box; the
world's power log says how often it was obeyed."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from sparkd.shell.ssh import SshPool
from sparkd_sim.timing import FAST_FACTOR
from sparkd_sim.world import World
from tests.support.daemon import controller, converge, cycle_until, cycles, mutations


def power(world: World, **changes: Any) -> dict[str, Any]:
    command = (
        sys.executable, "-m", "sparkd_sim.power", "cycle", "{host}", "--dir", str(world.directory)
    )  # fmt: skip
    # The default timeout (60 s) in the tests' scaled time.
    return {"power": {"command": command, "timeout": 60.0 * FAST_FACTOR, **changes}}


async def test_a_wedged_host_is_power_cycled_once_and_the_cluster_recovers(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(healthy_world, pool, tmp_path / "state", cluster=power(healthy_world))
    await converge(ctl, cycles=100)
    boot = healthy_world.host("spark-b").state.boot_id
    since = time.time()
    await healthy_world.fault("nv-no-memory-wedge", "spark-b", "1.5")
    plans = await cycle_until(ctl, "spark-b wedged: needs a power cycle")
    started = time.monotonic()
    assert "power-cycling it once it has been unreachable for power.unreachable_for" in (
        plans[-1].reason
    )
    assert healthy_world.power_log == []
    plans = await cycle_until(ctl, "power-cycling spark-b: last kernel log seen:", limit=600)
    # Not before the host had been silent for power.unreachable_for (scaled).
    assert time.monotonic() - started >= ctl.cluster.power.unreachable_for * 0.9
    final = await converge(ctl, cycles=400)
    assert final[-1].phase == "healthy"
    await cycles(ctl, 5)
    assert [(r.host, r.action) for r in healthy_world.power_log] == [("spark-b", "cycle")]
    assert healthy_world.host("spark-b").state.boot_id != boot
    # Nothing was run on the wedged host while it was wedged; it was brought back by the
    # power cycle, then rejoined Ray and the model was relaunched.
    cycled = healthy_world.power_log[0].at
    assert not [r for r in mutations(healthy_world, "spark-b", since) if r.at < cycled]
    [event] = [
        e
        for e in ctl.state.read_events_counted(200, "sparks")[0]
        if e.get("action") == "power_cycle"
    ]
    assert event["result"] == "ok" and event["host"] == "spark-b"
    assert (
        "NVRM NV_ERR_NO_MEMORY" in event["reason"]
        and "past power.unreachable_for" in (event["reason"])
    )
    assert "spark-b: outlet power cycled (off, on)" in event["detail"]


async def test_a_failed_power_command_is_not_run_again_and_blocks_with_its_output(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    refuse = "import sys; print('outlet of {host}: no such outlet'); sys.exit(3)"
    changes = power(healthy_world, command=(sys.executable, "-c", refuse))
    ctl = controller(healthy_world, pool, tmp_path / "state", cluster=changes)
    await converge(ctl, cycles=100)
    await healthy_world.fault("nv-no-memory-wedge", "spark-b", "0.5")
    await cycle_until(ctl, "power-cycling spark-b: last kernel log seen:", limit=600)
    plans = await cycle_until(ctl, "did not succeed", limit=50)
    plans += await cycles(ctl, 5)
    assert plans[-1].phase == "blocked" and plans[-1].triage == ("host_wedged",)
    assert "not tried again in this incident, it needs a human" in plans[-1].reason
    assert not [a for p in plans for a in p.actions if a.kind == "power_cycle"]
    [event] = [
        e
        for e in ctl.state.read_events_counted(200, "sparks")[0]
        if e.get("action") == "power_cycle"
    ]
    assert event["result"] == "failed"
    assert "exited 3: outlet of spark-b: no such outlet" in event["detail"]
    assert healthy_world.power_log == []


async def test_every_host_silent_at_once_is_not_power_cycled_but_blocked(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """The ops box's own path to the hosts goes (played by blackholing every host at once, no
    kernel log holding a wedge omen): no host is power-cycled; after power.unreachable_for the
    cluster is `blocked` naming the ops box's network, and it recovers by itself when the path
    is back."""
    ctl = controller(healthy_world, pool, tmp_path / "state", cluster=power(healthy_world))
    await converge(ctl, cycles=100)
    for name in ("spark-a", "spark-b"):
        await healthy_world.fault("blackhole", name)
    started = time.monotonic()
    plans = await cycle_until(ctl, "check the ops box's own network path", limit=600)
    assert time.monotonic() - started >= ctl.cluster.power.unreachable_for * 0.9
    assert plans[-1].phase == "blocked" and not plans[-1].actions
    plans += await cycles(ctl, 3)
    assert not [a for p in plans for a in p.actions if a.kind == "power_cycle"]
    assert healthy_world.power_log == []
    for name in ("spark-a", "spark-b"):
        await healthy_world.fault("heal", name)
    final = await converge(ctl, cycles=400)
    assert final[-1].phase == "healthy"
    assert healthy_world.power_log == []


async def test_only_the_heads_path_lost_is_not_power_cycled_but_blocked(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """Only the ops box's path to the head goes (`path-lost`: its SSH silent to sparkd, so no
    probe and no Ray reading either, while the head, its Ray and the model run on): the worker
    still pings the head's data IP, so after power.unreachable_for the cluster is `blocked`
    naming the ops box's path, never a power cycle; healed, it is healthy again."""
    ctl = controller(healthy_world, pool, tmp_path / "state", cluster=power(healthy_world))
    await converge(ctl, cycles=100)
    await healthy_world.fault("path-lost", "spark-a")
    plans = await cycle_until(ctl, "still reaches its data IP", limit=600)
    assert plans[-1].phase == "blocked" and not plans[-1].actions
    assert "check the ops box's path to spark-a" in plans[-1].reason
    plans += await cycles(ctl, 3)
    assert not [a for p in plans for a in p.actions if a.kind == "power_cycle"]
    assert healthy_world.power_log == []
    await healthy_world.fault("heal", "spark-a")
    final = await converge(ctl, cycles=400)
    assert final[-1].phase == "healthy"
    assert healthy_world.power_log == []

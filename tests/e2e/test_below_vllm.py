"""Below vLLM against the simulated world over SSH: the kernel's lines and memory, as the real
tools print them, reach the plan (the hold, its reason) and the metrics."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import pytest

from sparkd.cli.api import render_status
from sparkd.runtime.daemon import Daemon
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.blocked import healthy_after, relaunch_held
from tests.support.daemon import (
    controller,
    converge,
    converged,
    cycle_until,
    cycles,
    daemon_on,
    eventually,
    mutations,
)
from tests.support.http import Samples, fetch, parse, scraped, value

GIB = 1 << 30


# A GPU off the bus, as the kernel logs it (XID 79, nvidia-smi failing too) or as nvidia-smi
# alone shows it (no kernel line read): the same class, the same hold, the evidence named.
LOST_GPU = [
    ("xid-79", "needs a reboot of spark-b (XID 79 (GPU has fallen off the bus)", "XID 79"),
    ("lost-gpu", "the GPU of spark-b is lost: needs a reboot of", "Unable to determine"),
    # A GB10 GSP crash: nvidia-smi still answers, the driver's own lines say it.
    (
        "gsp-crash",
        "needs a reboot of spark-b (XID 119 (GSP RPC timeout",
        "0x1 (GPU Reset Required): the GPU needs a reset",
    ),
]


@pytest.mark.parametrize(("fault", "held", "evidence"), LOST_GPU)
async def test_a_lost_gpu_blocks_with_a_reboot_restarts_nothing_and_a_reboot_recovers(
    healthy_world: World, pool: SshPool, tmp_path: Path, fault: str, held: str, evidence: str
) -> None:
    ctl, since = await converged(healthy_world, pool, tmp_path / "state", cycles=100)
    await healthy_world.fault(fault, "spark-b")
    plans = await relaunch_held(healthy_world, ctl, since, held, 20)
    assert evidence in plans[-1].reason
    assert plans[-1].triage == ("gpu_lost",)
    assert plans[-1].latch is None
    final = await healthy_after(healthy_world, ctl, "reboot", "spark-b", limit=400)
    assert final[-1].triage == ()


async def test_application_xids_and_teardowns_change_nothing(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl, since = await converged(healthy_world, pool, tmp_path / "state", cycles=100)
    await healthy_world.fault("xid-13", "spark-a")
    await healthy_world.fault("xid-45", "spark-b")
    plans = await cycles(ctl, 5)
    assert all(p.phase == "healthy" and p.triage == () for p in plans), plans[-1].reason
    assert mutations(healthy_world, since=since) == []
    seen = ctl.view.snapshot
    assert seen is not None
    events = {h.name: [(e.xid, e.count) for e in h.kernel.events] for h in seen.hosts if h.kernel}
    assert events == {"spark-a": [(13, 3)], "spark-b": [(45, 2)]}


@pytest.mark.parametrize(
    ("fault", "evidence"),
    [("nv-no-memory-wedge", "NVRM NV_ERR_NO_MEMORY x3"), ("aer-fatal", "PCIe fatal AER")],
)
async def test_a_host_gone_after_its_omens_is_wedged(
    healthy_world: World, pool: SshPool, tmp_path: Path, fault: str, evidence: str
) -> None:
    ctl, since = await converged(healthy_world, pool, tmp_path / "state", cycles=100)
    await healthy_world.fault(fault, "spark-b", "1.5")
    plans = await cycle_until(ctl, "spark-b wedged: needs a power cycle")
    assert evidence in plans[-1].reason
    assert plans[-1].phase == "blocked" and plans[-1].triage == ("host_wedged",)
    plans += await cycles(ctl, 5)
    assert not [a for p in plans for a in p.actions if a.host == "spark-b"]
    assert [r for r in mutations(healthy_world, "spark-b", since)] == []


async def test_memory_pressure_holds_the_launch_until_it_eases(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl, since = await converged(healthy_world, pool, tmp_path / "state", cycles=100)
    await healthy_world.fault("memory-pressure", "spark-a", str(GIB))
    await healthy_world.fault("crash-model", "spark-a")
    plans = await cycle_until(ctl, "memory pressure on spark-a: MemAvailable 1.0 GiB below 4.0 GiB")
    plans += await cycles(ctl, 10)
    assert not [r for r in mutations(healthy_world, "spark-a", since) if "vllm serve" in r.command]
    assert plans[-1].triage == ("memory_pressure",)
    await healthy_after(healthy_world, ctl, "heal", "spark-a", limit=300)
    launches = [r for r in mutations(healthy_world, "spark-a", since) if "vllm serve" in r.command]
    assert len(launches) == 1


@pytest.fixture
async def daemon(healthy_world: World, tmp_path: Path) -> AsyncIterator[Daemon]:
    async with daemon_on(healthy_world, tmp_path / "state") as d:
        yield d


def of(samples: Samples, name: str, **labels: str) -> float | None:
    """The cluster's series `name` in one scrape (None where it is not exported)."""
    return value(samples, name, cluster="sparks", **labels)


async def scrape_when(daemon: Daemon, done: Callable[[Samples], bool]) -> Samples:
    """The first scrape of the daemon's /metrics on which `done` holds: what a test checks
    next is read from that same scrape, not from a later look that may read less."""
    found: list[Samples] = []

    async def check() -> bool:
        _, text = await fetch(f"{daemon.url}/metrics")
        samples = parse(text)
        if done(samples):
            found.append(samples)
        return bool(found)

    await eventually(check, within=30)
    return found[0]


async def test_the_metrics_count_each_kernel_line_once_and_show_memory_and_triage(
    healthy_world: World, daemon: Daemon
) -> None:
    sample = partial(scraped, f"{daemon.url}/metrics", cluster="sparks")

    def triaged(seen: Samples) -> bool:
        # Each host is read on its own within a look: spark-b's pressure may be in a plan whose
        # read of spark-a came before its XID lines, so wait for those lines too.
        pressure = of(seen, "sparkd_cluster_triage", **{"class": "memory_pressure"}) == 1
        return pressure and bool(of(seen, "sparkd_gpu_xid_total", host="spark-a", xid="13"))

    await healthy_world.fault("xid-13", "spark-a")
    await healthy_world.fault("memory-pressure", "spark-b", str(GIB))
    seen = await scrape_when(daemon, triaged)
    assert of(seen, "sparkd_gpu_xid_total", host="spark-a", xid="13") == 3
    assert of(seen, "sparkd_host_kernel_events_total", host="spark-a", **{"class": "xid"}) == 3
    assert of(seen, "sparkd_host_memory_available_bytes", host="spark-b") == GIB
    assert of(seen, "sparkd_cluster_triage", **{"class": "gpu_lost"}) == 0
    _, body = await fetch(f"{daemon.url}/status")
    status = json.loads(body)
    [cluster] = status["clusters"]
    assert cluster["triage"] == ["memory_pressure"]
    assert "memory pressure on spark-b" in cluster["reason"]
    _, row = render_status(status).splitlines()
    assert "[memory_pressure]" in row
    # Later looks read the same lines again: still counted once.
    cycles_before = daemon.controllers["sparks"].view.cycles
    await eventually(
        lambda: daemon.controllers["sparks"].view.cycles >= cycles_before + 3, within=30
    )
    assert await sample("sparkd_gpu_xid_total", host="spark-a", xid="13") == 3


async def test_an_mtu_mismatch_holds_the_relaunch_until_the_mtu_is_set(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(healthy_world, pool, tmp_path / "state")
    await converge(ctl, cycles=100)
    seen = ctl.view.snapshot
    assert seen is not None
    fabrics = {h.name: h.fabric for h in seen.hosts}
    assert all(
        f is not None and f.port_state == "ACTIVE" and f.gid_index == 3 for f in fabrics.values()
    )
    since = time.time()
    await healthy_world.fault("mtu-mismatch", "spark-b")
    mismatch = "fabric: MTU mismatch on the data link (spark-a 9000, spark-b 1500)"
    plans = await relaunch_held(healthy_world, ctl, since, mismatch, 5)
    assert "set the MTU of enp1s0f0np0 on spark-b to 9000" in plans[-1].reason
    assert plans[-1].triage == ("fabric",)
    await healthy_after(healthy_world, ctl, "heal", "spark-b", limit=300)


async def test_a_flap_is_reported_for_its_window_and_counted(
    healthy_world: World, daemon: Daemon
) -> None:
    # One scrape for each set of checks: a look that got no fabric reading of a host (seen on a
    # loaded box) exports none of that host's fabric gauges until a later look reads it again.
    seen = await scrape_when(
        daemon, lambda s: of(s, "sparkd_fabric_gid_index", host="spark-b") == 3
    )
    assert of(seen, "sparkd_fabric_link_up", host="spark-b") == 1
    assert of(seen, "sparkd_fabric_mtu_bytes", host="spark-b") == 9000
    assert of(seen, "sparkd_fabric_link_rate_bytes_per_second", host="spark-b") == 25e9
    await healthy_world.fault("link-flap", "spark-b")
    await healthy_world.fault("rate-degraded", "spark-a")

    def flapped(seen: Samples) -> bool:
        # Either host's fault alone makes the fabric triage, and each host is read on its own
        # within a look: wait until both are seen.
        fabric = of(seen, "sparkd_cluster_triage", **{"class": "fabric"}) == 1
        rate = of(seen, "sparkd_fabric_link_rate_bytes_per_second", host="spark-a")
        flaps = of(seen, "sparkd_fabric_flaps_total", host="spark-b")
        return fabric and bool(flaps) and rate not in (None, 25e9)

    seen = await scrape_when(daemon, flapped)
    assert of(seen, "sparkd_fabric_flaps_total", host="spark-b") == 1
    assert of(seen, "sparkd_fabric_flaps_total", host="spark-a") == 0
    assert of(seen, "sparkd_fabric_link_rate_bytes_per_second", host="spark-a") == 25e9 / 8
    _, body = await fetch(f"{daemon.url}/status")
    [cluster] = json.loads(body)["clusters"]
    assert "fabric: spark-b enp1s0f0np0 flapped" in cluster["reason"]


async def test_a_host_silent_past_unreachable_for_is_wedged(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(healthy_world, pool, tmp_path / "state")
    await converge(ctl, cycles=100)
    await healthy_world.fault("blackhole", "spark-b")
    started = time.monotonic()
    plans = await cycle_until(
        ctl, "spark-b wedged: needs a power cycle (unreachable for", limit=600
    )
    # Not before power.unreachable_for (its fast-time value) has passed.
    assert time.monotonic() - started >= ctl.cluster.power.unreachable_for
    assert any(p.phase == "unreachable" for p in plans)
    assert plans[-1].phase == "blocked" and plans[-1].triage == ("host_wedged",)

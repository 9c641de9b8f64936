"""`ha`: takeover time between two instances on a real etcd (single member, loopback): after
the owner dies (it stops renewing at a random point of its renew interval, and its
connections close, as a SIGKILL does) and after a graceful stop (its lease revoked), at the
test timings (TTL 3 s) and the production defaults (TTL 15 s); and, with three instances
sharing six clusters, the time until a dead one's clusters are all owned again."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.common import free_port, median, own_cpu, rss_mb, table, write_result
from sparkd.ha.config import HaSpec
from sparkd.ha.ownership import Ownership

ADDRESS = "127.78.0.2"  # the simulated world's benchmarks use 127.77.x
TIMINGS = {
    "test (ttl 3)": {"lease_ttl": 3, "renew_interval": 1.0, "request_timeout": 0.5, "margin": 1.0},
    "production (ttl 15)": {},
}


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as answer:
            return b'"true"' in answer.read()
    except OSError:
        return False


def _spawn(binary: str, scratch: str, url: str, peer: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
            [
                binary, "--name", "b1", "--data-dir", str(Path(scratch) / "data"),
                "--listen-client-urls", url, "--advertise-client-urls", url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"b1={peer}", "--logger", "zap", "--log-level", "error",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip


@contextlib.asynccontextmanager
async def etcd() -> AsyncIterator[str]:
    async with etcd_process() as (url, _):
        yield url


@contextlib.asynccontextmanager
async def etcd_process() -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """A single-member etcd on loopback: its client URL and its process (for its CPU)."""
    binary = shutil.which("etcd")
    if binary is None:
        raise RuntimeError("no etcd on this machine (apt-get install etcd-server)")
    with tempfile.TemporaryDirectory() as scratch:
        url = f"http://{ADDRESS}:{free_port(ADDRESS)}"
        peer = f"http://{ADDRESS}:{free_port(ADDRESS)}"
        proc = _spawn(binary, scratch, url, peer)
        try:
            for _ in range(400):
                if await asyncio.to_thread(_healthy, url):
                    break
                await asyncio.sleep(0.05)
            yield url, proc
        finally:
            proc.kill()
            proc.wait()


async def _owned(ha: Ownership) -> None:
    # Polled at 5 ms: the resolution of the figures, and no hook in the code under test.
    while not ha.may_act("c"):  # noqa: ASYNC110
        await asyncio.sleep(0.005)


async def takeover(url: str, changes: dict[str, Any], graceful: bool, run: int) -> float:
    prefix = f"bench/{run}-{graceful}-{changes.get('lease_ttl', 15)}/"
    spec = {"etcd_endpoints": (url,), "prefix": prefix, **changes}
    owner = Ownership(HaSpec.model_validate({**spec, "instance": "a"}), ["c"])
    standby = Ownership(HaSpec.model_validate({**spec, "instance": "b"}), ["c"])
    owner.start()
    await _owned(owner)
    standby.start()
    await asyncio.sleep(0.5)  # the standby has listed the key and watches it
    # Anywhere in the renew interval, as a crash would be.
    await asyncio.sleep(random.uniform(0, owner.spec.renew_interval))
    if graceful:
        started = time.monotonic()
        await owner.stop()
    else:
        for task in owner._tasks:
            task.cancel()
        await owner.client.close()
        started = time.monotonic()
    await _owned(standby)
    took = time.monotonic() - started
    await standby.stop()
    if not graceful:
        await owner.stop()
    return took


async def cost(url: str, rounds: int) -> dict[str, float]:
    """CPU and RSS of the renewals: an owner of 4 clusters runs `rounds` rounds back to back
    (a keepalive, a read of the members and one of the owner keys, and one of the control
    records each, as every renew interval)."""
    spec = HaSpec.model_validate({"etcd_endpoints": (url,), "prefix": "bench/cost/"})
    owner = Ownership(spec, ["c1", "c2", "c3", "c4"])
    await owner.round()
    rss_before = rss_mb()
    cpu_before = own_cpu()
    for _ in range(rounds):
        await owner.round()
    cpu = own_cpu() - cpu_before
    rss_after = rss_mb()
    await owner.stop()
    return {
        "rounds": rounds,
        "cpu_ms_per_round": 1000 * cpu / rounds,
        "rss_mb_before": rss_before,
        "rss_mb_after": rss_after,
    }


async def main(quick: bool = False) -> None:
    runs = 2 if quick else 5
    rows: list[list[Any]] = []
    data: dict[str, Any] = {}
    async with etcd() as url:
        spent = await cost(url, 100 if quick else 1000)
        data["cost"] = spent
        for label, changes in TIMINGS.items():
            for graceful in (False, True):
                samples = [await takeover(url, changes, graceful, n) for n in range(runs)]
                how = "graceful stop" if graceful else "owner dies"
                data[f"{label}, {how}"] = samples
                rows.append([label, how, runs, min(samples), median(samples), max(samples)])
    text = table(
        "takeover, seconds (etcd single member on loopback)",
        ["timings", "event", "runs", "min", "median", "max"],
        rows,
    ) + (
        f"\nrenewal round (owner of 4 clusters): {spent['cpu_ms_per_round']:.2f} ms CPU; RSS "
        f"{spent['rss_mb_before']:.1f} -> {spent['rss_mb_after']:.1f} MB over "
        f"{spent['rounds']} rounds"
    )
    write_result("ha", {"samples": data}, text)

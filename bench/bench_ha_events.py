"""`ha_events`: what the event journal in etcd costs an HA owner (single-member etcd on
loopback): the time `journal` takes in the controller's persist (all an action waits for: the
write is behind it), the time until one event is in etcd, and until a burst is."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_ha import etcd
from bench.common import median, p95, table, write_result
from sparkd.ha.config import HaSpec
from sparkd.ha.ownership import Ownership
from sparkd.model.memory import Memory
from sparkd.runtime.ha_store import EtcdStore
from sparkd.runtime.state import StateDir


def event(n: int) -> dict[str, Any]:
    return {"at": time.time(), "cluster": "c", "kind": "phase", "phase": "healthy", "n": n}


async def main(quick: bool = False) -> None:
    runs = 50 if quick else 300
    burst = 250
    async with etcd() as url:
        spec = HaSpec.model_validate(
            {"etcd_endpoints": (url,), "prefix": "bench/events/", "instance": "a"}
        )
        owner = Ownership(spec, ["c"])
        with tempfile.TemporaryDirectory() as scratch:
            store = EtcdStore(owner, StateDir(Path(scratch)))
            await owner.round()
            assert await store.adopt("c", Memory(), time.time()) is not None
            calls, landed = [], []
            for n in range(runs):
                started = time.perf_counter()
                store.journal("c", [event(n)])
                calls.append(time.perf_counter() - started)
                await store.close()
                landed.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.journal("c", [event(n) for n in range(burst)])
            await store.close()
            burst_s = time.perf_counter() - started
            found, _ = await store.read_events(["c"], 1000)
            assert len(found) == runs + burst
        await owner.stop()
    rows = [
        ["journal() in the persist, us", runs, 1e6 * median(calls), 1e6 * p95(calls)],
        ["one event until in etcd, ms", runs, 1e3 * median(landed), 1e3 * p95(landed)],
    ]
    text = table("event journal in etcd", ["what", "runs", "median", "p95"], rows) + (
        f"\na burst of {burst} events (3 transactions) in etcd after {1e3 * burst_s:.1f} ms"
    )
    write_result(
        "ha_events",
        {"journal_call_s": calls, "landed_s": landed, "burst": burst, "burst_s": burst_s},
        text,
    )

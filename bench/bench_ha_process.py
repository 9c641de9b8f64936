"""`ha_process`: HA with real `sparkd run` processes. Two instances (state dirs of their own,
the same config but for `[ha] instance`) against one healthy simulated cluster (`sparkd sim`,
its own process) and a real single-member etcd on loopback:

* takeover after SIGKILL of the owner process, sent at a random point of its renew interval,
  and after SIGTERM (a graceful stop: the owner revokes its lease on the way out), alternated,
  at the test timings (TTL 3 s) and the production defaults (TTL 15 s). A takeover is timed
  from the signal to the `acquired` event in the standby's JSON log (its own wall-clock
  timestamp, the same clock as the signal's), and to the first answer of its /status that says
  `owner` (polled every 50 ms, so up to that much later). The killed or stopped instance is then
  started again as the new standby, and the next run signals the other one;
* what `[ha]` adds to a whole instance: `sparkd run` with `[ha]` (production defaults, alone on
  its own prefix: it owns the cluster) and the same config without it, both running at once on
  the same world over the same window, started and read in alternating order from one round to
  the next: VmRSS after a warm-up (/proc/PID/status), utime + stime over the window
  (/proc/PID/stat), etcd's own CPU over that window (it serves the HA instance alone) beside
  one window with no client, and the requests the instance sent etcd (etcd's gRPC counters).

The clusters' own timings are the world's config as `sparkd sim` writes it (interval 30 s,
recheck 5 s, probe every 60 s), the same on every instance."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.bench_ha import etcd_process
from bench.common import (
    CLK_TCK,
    SimWorld,
    free_port,
    median,
    sim_world,
    table,
    wait_healthy,
    write_result,
)
from sparkd.ha.config import HaSpec
from sparkd.settings import load_settings
from tests.support.ha import stamp
from tests.support.process import SparkdRun

# A world of its own beside the other benchmarks' (127.77.0.x) and the tests' (127.0.0.x).
FIRST_ADDRESS = "127.77.16.2"
TEST = {"lease_ttl": 3, "renew_interval": 1.0, "request_timeout": 0.5, "margin": 1.0}
TIMINGS: dict[str, dict[str, Any]] = {"test (ttl 3)": TEST, "production (ttl 15)": {}}
POLL = 0.05


def spec_of(changes: dict[str, Any]) -> HaSpec:
    """The [ha] timings `changes` give (the defaults for the rest)."""
    return HaSpec.model_validate({"etcd_endpoints": ("http://127.0.0.1:2379",), **changes})


def toml_value(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(value)


def write_config(world: SimWorld, directory: Path, port: int, ha: dict[str, Any] | None) -> Path:
    """The world's config with this instance's listen port and state dir, and `[ha]` if given."""
    text = world.config_path.read_text()
    text = re.sub(r"^listen = .*$", f'listen = "127.0.0.1:{port}"', text, flags=re.M)
    state = directory / "state"
    text = re.sub(r"^state_dir = .*$", f"state_dir = {json.dumps(str(state))}", text, flags=re.M)
    if ha is not None:
        text += "\n[ha]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in ha.items())
    path = directory / "sparkd.toml"
    path.write_text(text)
    load_settings(path)  # fail here, not in the daemon
    return path


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process itself (its threads included, no children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def vm_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no VmRSS for {pid}")


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def etcd_requests(url: str) -> dict[str, float]:
    """etcd's count of gRPC messages received so far, by method (its HTTP gateway's calls and
    their stream messages among them)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found: dict[str, float] = {}
    pattern = r'^grpc_server_msg_received_total\{grpc_method="(\w+)"[^}]*\} (\S+)$'
    for match in re.finditer(pattern, text, re.M):
        found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(2))
    return found


class Instance(SparkdRun):
    """One `sparkd run` process, its JSON log in its own directory."""

    def __init__(self, name: str, directory: Path, config: Path, port: int) -> None:
        super().__init__(config, directory / "run.log", port)
        self.name = name
        self.directory = directory

    @classmethod
    def make(cls, world: SimWorld, root: Path, name: str, ha: dict[str, Any] | None) -> Instance:
        directory = root / name
        directory.mkdir(parents=True)
        port = free_port("127.0.0.1")
        ha = None if ha is None else {**ha, "instance": name}
        return cls(name, directory, write_config(world, directory, port, ha), port)

    async def cycles(self) -> int:
        clusters = (await self.status()).get("clusters") or []
        return min((int(c.get("cycles", 0)) for c in clusters), default=0)

    def named(self, name: str, since: float) -> list[dict[str, Any]]:
        """This instance's log events called `name` stamped at or after `since`."""
        return [e for e in self.events() if e.get("event") == name and stamp(e) >= since]


async def until(check: Any, within: float, what: str) -> None:
    """Until the coroutine function `check` returns true."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {within:.0f} s: {what}")
        await asyncio.sleep(POLL)


async def standing_by(standby: Instance, owner: Instance, cluster: str, spec: HaSpec) -> None:
    """`owner` owns the cluster, `standby` has started, read the owner key and cycled once;
    then a renew interval more, so that its watch runs and its start-up no longer loads the
    machine."""

    async def ready() -> bool:
        return (
            await standby.role(cluster) == "standby"
            and await standby.cycles() >= 1
            and await owner.role(cluster) == "owner"
        )

    await until(ready, 120, f"{standby.name} standing by for {owner.name}")
    await asyncio.sleep(spec.renew_interval + 1.0)


async def takeover(
    owner: Instance, standby: Instance, cluster: str, sig: signal.Signals, spec: HaSpec
) -> dict[str, Any]:
    # Anywhere in the owner's renew interval, as a crash would be.
    await asyncio.sleep(random.uniform(0, spec.renew_interval))
    ha = (await owner.status()).get("ha") or {}
    remaining = float(ha.get("lease_remaining_seconds", "nan"))
    sent = owner.signal(sig)
    status_owner: float | None = None
    deadline = sent + 3 * spec.lease_ttl + 30
    while time.time() < deadline:
        if await standby.role(cluster) == "owner":
            status_owner = time.time() - sent
            break
        await asyncio.sleep(POLL)
    await owner.exited(60)
    acquired = standby.named("acquired", sent)
    released = owner.named("released", sent)
    return {
        "signal": sig.name,
        "owner": owner.name,
        "lease_remaining_before_s": remaining,
        "acquired_s": stamp(acquired[0]) - sent if acquired else None,
        "status_owner_s": status_owner,
        "released_s": stamp(released[0]) - sent if released else None,
        "token": acquired[0].get("token") if acquired else None,
        "load_average": os.getloadavg()[0],
    }


async def takeovers(
    world: SimWorld, url: str, root: Path, label: str, changes: dict[str, Any], runs: int
) -> list[dict[str, Any]]:
    """`runs` takeovers of each kind, SIGKILL and SIGTERM alternated."""
    spec = spec_of(changes)
    slug = re.sub(r"\W+", "-", label).strip("-")
    ha = {"etcd_endpoints": (url,), "prefix": f"bench/process/{slug}/", **changes}
    pair = [Instance.make(world, root / slug, f"ops-{n}", ha) for n in "ab"]
    cluster = world.settings.clusters[0].name
    samples: list[dict[str, Any]] = []
    try:
        owner, standby = pair
        await owner.start()

        async def owns() -> bool:
            return await owner.role(cluster) == "owner"

        await until(owns, 120 + spec.lease_ttl, f"{owner.name} owning {cluster}")
        await standby.start()
        await standing_by(standby, owner, cluster, spec)
        for n in range(2 * runs):
            sig = signal.SIGKILL if n % 2 == 0 else signal.SIGTERM
            sample = await takeover(owner, standby, cluster, sig, spec)
            samples.append(sample)
            print(f"   {label}, {sig.name}: {json.dumps(sample)}", flush=True)
            owner, standby = standby, owner
            if n < 2 * runs - 1:
                await standby.start()
                await standing_by(standby, owner, cluster, spec)
    finally:
        for one in pair:
            await one.stop(within=30.0)
    return samples


def reading(pid: int) -> dict[str, float]:
    return {"t": time.monotonic(), "cpu_s": cpu_seconds(pid), "rss_mb": vm_rss_mb(pid)}


async def footprint_round(
    world: SimWorld, url: str, etcd_pid: int, root: Path, n: int, warm: float, window: float
) -> dict[str, Any]:
    """One window of `sparkd run` with and without [ha] side by side; the [ha] one is started
    and read first on even rounds, second on odd ones."""
    ha = {"etcd_endpoints": (url,), "prefix": f"bench/process/footprint-{n}/"}
    with_ha = Instance.make(world, root / f"footprint-{n}", "with-ha", ha)
    without = Instance.make(world, root / f"footprint-{n}", "without-ha", None)
    order = [with_ha, without] if n % 2 == 0 else [without, with_ha]
    cluster = world.settings.clusters[0].name
    try:
        for one in order:
            await one.start()

        async def warmed() -> bool:
            return (
                await with_ha.role(cluster) == "owner"
                and await with_ha.cycles() >= 1
                and await without.cycles() >= 1
            )

        await until(warmed, 180, "both instances cycling, the [ha] one owning")
        await asyncio.sleep(warm)
        cycles = {one.name: -await one.cycles() for one in order}
        before = {one.name: reading(one.pid) for one in order}
        etcd_before = cpu_seconds(etcd_pid)
        requests_before = await asyncio.to_thread(etcd_requests, url)
        await asyncio.sleep(window)
        after = {one.name: reading(one.pid) for one in order}
        etcd_after = cpu_seconds(etcd_pid)
        requests_after = await asyncio.to_thread(etcd_requests, url)
        counts = {one.name: threads(one.pid) for one in order}
        for one in order:
            cycles[one.name] += await one.cycles()
    finally:
        for one in order:
            await one.stop(within=30.0)
    sides = {}
    for name in before:
        seconds = after[name]["t"] - before[name]["t"]
        cpu = after[name]["cpu_s"] - before[name]["cpu_s"]
        sides[name] = {
            "window_s": seconds,
            "cpu_s": cpu,
            "cpu_share": cpu / seconds,
            "rss_mb_start": before[name]["rss_mb"],
            "rss_mb_end": after[name]["rss_mb"],
            "threads": counts[name],
            "cycles_in_window": cycles[name],
        }
    added = {
        "first": order[0].name,
        "cpu_share": sides["with-ha"]["cpu_share"] - sides["without-ha"]["cpu_share"],
        "rss_mb": sides["with-ha"]["rss_mb_end"] - sides["without-ha"]["rss_mb_end"],
        "etcd_cpu_share": (etcd_after - etcd_before) / sides["with-ha"]["window_s"],
        # Requests per second the [ha] instance sent etcd in the window, by gRPC method.
        "etcd_requests_per_s": {
            method: (count - requests_before.get(method, 0.0)) / sides["with-ha"]["window_s"]
            for method, count in requests_after.items()
            if count > requests_before.get(method, 0.0)
        },
        "load_average": os.getloadavg()[0],
    }
    return {"sides": sides, "added": added}


def spread(values: list[float]) -> list[Any]:
    return [min(values), median(values), max(values)] if values else [float("nan")] * 3


async def main(quick: bool = False) -> None:
    runs = {"test (ttl 3)": 3 if quick else 6, "production (ttl 15)": 2 if quick else 4}
    rounds, warm, window = (2, 30.0, 120.0) if quick else (4, 60.0, 180.0)
    rows: list[list[Any]] = []
    data: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sparkd-bench-ha-") as tmp:
        root = Path(tmp)
        async with (
            etcd_process() as (url, etcd_proc),
            sim_world("healthy", first_address=FIRST_ADDRESS) as world,
        ):
            await wait_healthy(world)
            for label, changes in TIMINGS.items():
                samples = await takeovers(world, url, root, label, changes, runs[label])
                data[label] = samples
                ttl = spec_of(changes).lease_ttl
                for sig in ("SIGKILL", "SIGTERM"):
                    mine = [s for s in samples if s["signal"] == sig]
                    acquired = [s["acquired_s"] for s in mine if s["acquired_s"] is not None]
                    status = [s["status_owner_s"] for s in mine if s["status_owner_s"] is not None]
                    within = sum(a <= ttl + 1 for a in acquired)
                    rows.append(
                        [label, sig, len(mine), *spread(acquired), *spread(status)[1:2],
                         f"{within}/{len(mine)}"]
                    )  # fmt: skip
            # etcd's own CPU with no client (after the takeovers' leases have all gone): what
            # it spends whether or not an instance uses it.
            idle_before = cpu_seconds(etcd_proc.pid)
            await asyncio.sleep(window)
            etcd_idle = (cpu_seconds(etcd_proc.pid) - idle_before) / window
            footprint = [
                await footprint_round(world, url, etcd_proc.pid, root, n, warm, window)
                for n in range(rounds)
            ]
    data["footprint"] = footprint
    data["etcd_idle_cpu_share"] = etcd_idle
    added = [r["added"] for r in footprint]
    sides = [r["sides"] for r in footprint]
    summary: dict[str, Any] = {
        "added_cpu_share": spread([a["cpu_share"] for a in added]),
        "added_rss_mb": spread([a["rss_mb"] for a in added]),
        "etcd_cpu_share": spread([a["etcd_cpu_share"] for a in added]),
        "with_ha_cpu_share": spread([s["with-ha"]["cpu_share"] for s in sides]),
        "without_ha_cpu_share": spread([s["without-ha"]["cpu_share"] for s in sides]),
        "with_ha_rss_mb": spread([s["with-ha"]["rss_mb_end"] for s in sides]),
        "without_ha_rss_mb": spread([s["without-ha"]["rss_mb_end"] for s in sides]),
        "threads": [(s["with-ha"]["threads"], s["without-ha"]["threads"]) for s in sides],
        "cycles_in_window": [
            (s["with-ha"]["cycles_in_window"], s["without-ha"]["cycles_in_window"]) for s in sides
        ],
        "etcd_idle_cpu_share": etcd_idle,
        "etcd_requests_per_s": {
            method: median([a["etcd_requests_per_s"].get(method, 0.0) for a in added])
            for method in sorted({m for a in added for m in a["etcd_requests_per_s"]})
        },
    }
    data["summary"] = summary

    def pct(values: list[float]) -> str:
        low, mid, high = values
        return f"{100 * mid:.3f} ({100 * low:.3f} to {100 * high:.3f})"

    def mb(values: list[float]) -> str:
        low, mid, high = values
        return f"{mid:.2f} ({low:.2f} to {high:.2f})"

    takeover_table = table(
        "takeover with `sparkd run` processes, seconds from the signal (etcd single member on "
        "loopback): to the standby's `acquired` log event, and to its /status saying owner",
        ["timings", "signal", "runs", "min", "median", "max", "status median", "within ttl+1"],
        rows,
    )
    cost_table = table(
        f"a whole `sparkd run` with [ha] (production timings) vs without, side by side: "
        f"{rounds} rounds of {window:.0f} s after {warm:.0f} s of warm-up; median (range)",
        ["measure", "with [ha]", "without", "added"],
        [
            ["CPU (% of a core)", pct(summary["with_ha_cpu_share"]),
             pct(summary["without_ha_cpu_share"]), pct(summary["added_cpu_share"])],
            ["VmRSS (MB)", mb(summary["with_ha_rss_mb"]), mb(summary["without_ha_rss_mb"]),
             mb(summary["added_rss_mb"])],
            ["threads", ", ".join(str(w) for w, _ in summary["threads"]),
             ", ".join(str(o) for _, o in summary["threads"]), ""],
            ["cycles in the window", ", ".join(str(w) for w, _ in summary["cycles_in_window"]),
             ", ".join(str(o) for _, o in summary["cycles_in_window"]), ""],
            ["etcd's CPU (% of a core)", pct(summary["etcd_cpu_share"]),
             f"{100 * etcd_idle:.3f} (no client)", ""],
            ["etcd requests/s (median)", ", ".join(
                f"{m} {v:.2f}" for m, v in summary["etcd_requests_per_s"].items()), "", ""],
        ],
    )  # fmt: skip
    write_result("ha_process", {"samples": data}, takeover_table + "\n\n" + cost_table)

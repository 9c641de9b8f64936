"""The HA tiers' invariant checker (HA.md section 6): per cluster, every command the hosts ran
names one owner (token and instance), the tokens never go backwards, the spans in which
different tokens' commands ran never overlap, and neither do the spans of different
instances' actions in their own logs.

And what the etcd tier's tests share: a `sparkd run` process (`Instance`) and what they ask
of one (its role, /status, /metrics and /events, the `sparkd` CLI against its config), and
for in-process ownership, `spec` (an [ha] spec on the test timings), `Clock` and `wait_for`."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp

from sparkd.ha.claim import boottime
from sparkd.ha.config import HaSpec
from sparkd.ha.etcd import EtcdClient, EtcdUnavailable
from sparkd.settings import load_settings
from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.daemon import eventually, free_port, mutations, write_fast_config

TTL = 3
SPARKD = [sys.executable, "-m", "sparkd.cli"]
# Slack between a command's record on the host and its action's log lines (same clock).
SLACK = 0.05
TEST_TIMINGS = f"lease_ttl = {TTL}\nrenew_interval = 1.0\nrequest_timeout = 0.5\nmargin = 1.0\n"
PRODUCTION_TIMINGS = "lease_ttl = 15\nrenew_interval = 5.0\nrequest_timeout = 2.0\nmargin = 2.0\n"


class Logged(Protocol):
    """A `sparkd run` process as the checker reads it: its name, its JSON log, its death."""

    name: str
    killed_at: float | None

    def events(self) -> list[dict[str, Any]]: ...


def stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def action_spans(instance: Logged, until: float) -> dict[str, list[tuple[float, float]]]:
    """Per cluster, [start, end] of each action in the instance's log."""
    spans: dict[str, list[tuple[float, float]]] = {}
    open_at: dict[str, float] = {}
    for event in instance.events():
        cluster = event.get("cluster")
        if not isinstance(cluster, str):
            continue
        at = stamp(event)
        if event.get("event") == "action_start":
            open_at[cluster] = at
        elif event.get("event") == "action" and cluster in open_at:
            spans.setdefault(cluster, []).append((open_at.pop(cluster), at))
    for cluster, at in open_at.items():
        spans.setdefault(cluster, []).append((at, instance.killed_at or until))
    return spans


def check_one_actor_per_cluster(world: World, instances: list[Logged]) -> int:
    """The checker; returns how many owned commands the hosts ran, so a test sees it looked."""
    by_token: dict[tuple[str, int], list[float]] = {}
    instance_of: dict[tuple[str, int], str] = {}
    newest: dict[str, int] = {}
    ran = 0
    for command in sorted(world.owned_commands(), key=lambda c: c.at):
        if command.refused:
            continue
        ran += 1
        owner = command.owner
        key = (owner.cluster, owner.token)
        assert instance_of.setdefault(key, owner.instance) == owner.instance, key
        assert owner.token >= newest.get(owner.cluster, 0), (
            f"{owner.instance} token {owner.token} ran on {command.host} at {command.at:.3f} "
            f"after token {newest[owner.cluster]}"
        )
        newest[owner.cluster] = owner.token
        by_token.setdefault(key, []).append(command.at)
    spans = sorted((c, min(ats), max(ats), t) for (c, t), ats in by_token.items())
    for (c1, _, end, t1), (c2, start, _, t2) in itertools.pairwise(spans):
        if c1 == c2:
            assert end <= start, f"{c1}: token {t1} ran until {end}, token {t2} from {start}"
    now = time.time() + 1
    logged = [(i.name, action_spans(i, now)) for i in instances]
    for index, (name1, spans1) in enumerate(logged):
        for name2, spans2 in logged[index + 1 :]:
            for cluster, found in spans1.items():
                for s1, e1 in found:
                    for s2, e2 in spans2.get(cluster, []):
                        assert e1 < s2 or e2 < s1, f"{cluster}: {name1} and {name2} both acted"
    return ran


class Etcd(Protocol):
    """What an instance needs of the test's etcd server: where it answers."""

    @property
    def url(self) -> str: ...


class Instance:
    """One `sparkd run` process with [ha] on, its JSON log in the test's tmp dir."""

    def __init__(
        self,
        name: str,
        world: World,
        etcd: Etcd,
        tmp_path: Path,
        endpoint: str = "",
        timings: str = TEST_TIMINGS,
        token_file: Path | None = None,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.log = tmp_path / f"{name}.log"
        config = write_fast_config(
            world, tmp_path / f"{name}.toml", tmp_path / f"state-{name}", self.port, token_file
        )
        config.write_text(
            config.read_text()
            + f'\n[ha]\netcd_endpoints = ["{endpoint or etcd.url}"]\ninstance = "{name}"\n'
            + timings
        )
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.killed_at: float | None = None

    async def start(self) -> None:
        handle = self.log.open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            *SPARKD, "run", "--config", str(self.config), stdout=handle, stderr=handle,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "SPARKD_DAEMON__LOG_FORMAT": "json"},
        )  # fmt: skip

    def signal(self, sig: signal.Signals) -> float:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return time.time()

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    async def kill(self) -> None:
        self.killed_at = self.signal(signal.SIGKILL)
        assert self.proc is not None
        await self.proc.wait()

    async def status(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}/status"
        try:
            timeout = aiohttp.ClientTimeout(total=1)
            async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as r:
                return await r.json()  # type: ignore[no-any-return]
        except (aiohttp.ClientError, TimeoutError):
            return {}

    async def role(self, cluster: str) -> str | None:
        ha = (await self.status()).get("ha") or {}
        claim = (ha.get("clusters") or {}).get(cluster) or {}
        return claim.get("role")

    async def metrics(self) -> dict[str, float]:
        found = {}
        for line in (await get(self, "/metrics")).splitlines():
            if line.startswith("sparkd_ha_"):
                name, _, value = line.rpartition(" ")
                found[name] = float(value)
        return found

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            start = line.find("{")
            if start < 0:
                continue
            try:
                found.append(json.loads(line[start:]))
            except ValueError:
                continue
        return found

    def intervals(self, until: float) -> list[tuple[float, float]]:
        """[start, end] of each action in its log; one still running ends at `until`."""
        spans: list[tuple[float, float]] = []
        open_at: float | None = None
        for event in self.events():
            at = stamp(event)
            if event.get("event") == "action_start":
                open_at = at
            elif event.get("event") == "action" and open_at is not None:
                spans.append((open_at, at))
                open_at = None
        if open_at is not None:
            spans.append((open_at, until))
        return spans


async def get(instance: Instance, path: str) -> str:
    """The body of one of the instance's HTTP paths (/metrics, /events?...), as text."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{instance.port}{path}") as r:
        return await r.text()


def healthy_world(tmp_path: Path, first_address: str, hosts: int = 2, clusters: int = 1) -> World:
    """A healthy simulated world on addresses of its own, its containers labelled with their
    spec as sparkd labels them (so it adopts them as they are); enter it with `async with`."""
    return World(
        tmp_path / "world",
        hosts=hosts,
        clusters=clusters,
        scenario="healthy",
        timing=Timing.fast(),
        spec_labels=sparkd_spec_labels,
        first_address=first_address,
    )


def cluster_name(world: World) -> str:
    return load_settings(world.config_path).clusters[0].name


def operator_token(tmp_path: Path) -> Path:
    """The operator token file the control endpoints of operated instances share."""
    token = tmp_path / "control-token"
    token.write_text("s3cret-operator-token\n")
    token.chmod(0o600)
    return token


def check_never_two_actors(world: World, a: Instance, b: Instance) -> None:
    now = time.time() + 1
    spans = {a.name: a.intervals(a.killed_at or now), b.name: b.intervals(b.killed_at or now)}
    for s1, e1 in spans[a.name]:
        for s2, e2 in spans[b.name]:
            assert e1 < s2 or e2 < s1, f"{a.name} acted {s1}..{e1} while {b.name} {s2}..{e2}"
    for record in mutations(world):
        owners = [
            name
            for name, found in spans.items()
            if any(s - SLACK <= record.at <= e + SLACK for s, e in found)
        ]
        assert len(owners) == 1, f"{record.command!r} at {record.at} in no single action: {owners}"


def swept_since(world: World, instance: str, since: float) -> bool:
    """Whether `instance`'s fence sweep ran on every host of the world since `since`."""
    hosts = {
        c.host
        for c in world.owned_commands()
        if c.owner.instance == instance and not c.refused and c.at >= since
    }
    return hosts == {h.address for h in world.hosts.values()}


async def kill_worker(world: World) -> bool:
    try:
        await world.fault("kill-container", "spark-b", "sparkd-sparks-ray-worker")
    except ValueError:  # not running (yet)
        return False
    return True


async def start_owner_and_standby(a: Instance, b: Instance, cluster: str) -> None:
    await a.start()

    async def a_owns() -> bool:
        return await a.role(cluster) == "owner"

    await eventually(a_owns, within=30)
    await b.start()

    async def b_waits() -> bool:
        return await b.role(cluster) == "standby"

    await eventually(b_waits, within=30)


async def owner_and_standby(
    world: World, pair: tuple[Instance, Instance]
) -> tuple[Instance, Instance, str]:
    """The pair started, the first owning the world's cluster and the second standing by."""
    a, b = pair
    cluster = cluster_name(world)
    await start_owner_and_standby(a, b, cluster)
    return a, b, cluster


async def start_on_a_slow_load(world: World, a: Instance, b: Instance) -> str:
    """`a` owning the world's cluster with a model that loads slowly (`slow-load` on
    spark-a), `b` its standby: the start of a recovery the owner dies in; the cluster's name."""
    cluster = cluster_name(world)
    await world.fault("slow-load", "spark-a")
    await start_owner_and_standby(a, b, cluster)
    return cluster


async def is_healthy(instance: Instance) -> bool:
    """Whether the instance's /status shows its (first) cluster healthy."""
    clusters = (await instance.status()).get("clusters") or []
    return bool(clusters) and clusters[0]["phase"] == "healthy"


async def wait_healthy(instance: Instance, within: float) -> None:
    """Until the cluster is healthy per this instance's own /status."""
    await eventually(lambda: is_healthy(instance), within=within)


async def budgets(instance: Instance, cluster: str) -> dict[str, float]:
    """The instance's remediation budget left for the cluster, per action, from /metrics."""
    wanted = 'sparkd_remediation_budget_remaining{action="'
    found = {}
    for line in (await get(instance, "/metrics")).splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith(wanted) and f'cluster="{cluster}"' in name:
            found[name.split('"')[1]] = float(value)
    return found


async def budget_left(instance: Instance, cluster: str, action: str) -> float:
    left = await budgets(instance, cluster)
    assert action in left, f"no budget for {action} on {cluster} exported"
    return left[action]


async def cli(instance: Instance, *args: str) -> tuple[int, str]:
    """`sparkd VERB --config <the instance's config> ARGS...`: its exit code and output."""
    proc = await asyncio.create_subprocess_exec(
        *SPARKD, args[0], "--config", str(instance.config), *args[1:],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def paused_by(instance: Instance) -> str | None:
    clusters = (await instance.status()).get("clusters") or []
    pause = clusters[0].get("paused") if clusters else None
    return str(pause.get("reason")) if pause else None


def spec(etcd: Etcd, instance: str, **changes: object) -> HaSpec:
    """An [ha] spec on the test timings (TTL 3 s) under a test prefix, with `changes`."""
    base: dict[str, object] = {
        "etcd_endpoints": (etcd.url,),
        "instance": instance,
        "lease_ttl": 3,
        "renew_interval": 1.0,
        "request_timeout": 0.5,
        "margin": 1.0,
        "prefix": "test/v1/",
    }
    return HaSpec.model_validate({**base, **changes})


class Clock:
    """CLOCK_BOOTTIME, plus whatever a test adds (a suspend the process slept through)."""

    def __init__(self) -> None:
        self.skip = 0.0

    def __call__(self) -> float:
        return boottime() + self.skip


async def wait_for(check: Callable[[], bool], within: float) -> float:
    """Until `check()` holds; how long that took."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > within:
            raise AssertionError(f"not within {within}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


E = TypeVar("E", bound=Etcd)


async def leader(members: Sequence[E]) -> E:
    """The member that says it leads (maintenance/status: its `leader` is its own member id)."""
    for member in members:
        client = EtcdClient([member.url], timeout=1)
        try:
            status = await client.call("maintenance/status", {})
        except EtcdUnavailable:
            continue
        finally:
            await client.close()
        if status.get("leader") == status["header"]["member_id"]:
            return member
    raise AssertionError("no leader")


def on_members(instance: Instance, urls: list[str]) -> Instance:
    """The instance's config pointed at every member, in this order (it rotates on failures)."""
    listed = ", ".join(f'"{url}"' for url in urls)
    text = re.sub(
        r"^etcd_endpoints = .*$", f"etcd_endpoints = [{listed}]", instance.config.read_text(),
        flags=re.M,
    )  # fmt: skip
    instance.config.write_text(text)
    return instance

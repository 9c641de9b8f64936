"""The HA tiers' invariant checker, `check_invariants`: per cluster, every
command the hosts ran names one owner (token and instance), the tokens never go backwards,
the spans in which different tokens' commands ran never overlap, and neither do the spans of
different instances' actions in their own logs; a command a host's fence refused changed
nothing there (no tool call came from its session, the host's fence record kept the newer
token); and no budgeted attempt, pause or latch was lost or counted twice, across takeovers
too (etcd's record of the memory write by write, and its newest against the actions the
instances logged and the commands the hosts ran).

And what the etcd tier's tests share: a `sparkd run` process (`Instance`) and what they ask
of one (its role, /status, /metrics and /events, the `sparkd` CLI against its config), and
for in-process ownership, `spec` (an [ha] spec on the test timings), `Clock` and `wait_for`."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp

from sparkd.core.remembering.remember import MAX_ATTEMPTS
from sparkd.ha.claim import boottime
from sparkd.ha.config import HaSpec
from sparkd.ha.etcd import EtcdClient, EtcdUnavailable, b64
from sparkd.ha.memory import intent_key, memory_key
from sparkd.settings import load_settings
from sparkd.shell.catalogue.fence import FENCE_DIR
from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim.owned import OwnedCommand, Owner
from sparkd_sim.timing import Timing
from sparkd_sim.world import CommandRecord, World
from tests.support.daemon import eventually, free_port, mutations, write_fast_config
from tests.support.process import SPARKD, SparkdRun

TTL = 3
# Slack between a command's record on the host and its action's log lines (same clock).
SLACK = 0.05
TEST_TIMINGS = f"lease_ttl = {TTL}\nrenew_interval = 1.0\nrequest_timeout = 0.5\nmargin = 1.0\n"
PRODUCTION_TIMINGS = "lease_ttl = 15\nrenew_interval = 5.0\nrequest_timeout = 2.0\nmargin = 2.0\n"


class Logged(Protocol):
    """A `sparkd run` process as the checker reads it: its name, its JSON log, its death."""

    name: str
    deaths: list[float]

    def events(self) -> list[dict[str, Any]]: ...


def stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def action_spans(
    instance: Logged, until: float, changed_only: bool = False
) -> dict[str, list[tuple[float, float]]]:
    """Per cluster, [start, end] of each action in the instance's log, across its restarts:
    one its process died in ends at that death (the first of `deaths` after it began; without
    one, at the next start), one still running at `until`. `changed_only` leaves out the
    actions that ended `skipped`, which ran nothing anywhere (the intent was not written or
    was refused, or a host's fence turned the command away before it ran): a former owner's
    intent write, held up by a partition past a takeover and refused after it, is no second
    actor."""
    spans: dict[str, list[tuple[float, float]]] = {}
    open_at: dict[str, float] = {}

    def close(fallback: float) -> None:
        for cluster, begun in open_at.items():
            died = min((d for d in instance.deaths if d >= begun), default=fallback)
            spans.setdefault(cluster, []).append((begun, died))
        open_at.clear()

    for event in instance.events():
        at = stamp(event)
        if event.get("event") == "started":  # a new process: the last one's actions ended
            close(at)
            continue
        cluster = event.get("cluster")
        if not isinstance(cluster, str):
            continue
        if event.get("event") == "action_start":
            open_at[cluster] = at
        elif event.get("event") == "action" and cluster in open_at:
            begun = open_at.pop(cluster)
            if not (changed_only and event.get("result") == "skipped"):
                spans.setdefault(cluster, []).append((begun, at))
    close(until)
    return spans


def check_one_actor_per_cluster(
    world: World, instances: Sequence[Logged], own_spans: bool = True
) -> int:
    """(1) and (2): returns how many owned commands the hosts ran, so a test sees it looked.
    `own_spans=False` leaves out the instances' action spans in their own logs, for a
    scenario that freezes an owner inside an action on purpose (its span then runs on while
    another owns the cluster; what the hosts ran under each token is still checked)."""
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
    logged = [(i.name, action_spans(i, now, changed_only=True)) for i in instances if own_spans]
    for index, (name1, spans1) in enumerate(logged):
        for name2, spans2 in logged[index + 1 :]:
            for cluster, found in spans1.items():
                for s1, e1 in found:
                    for s2, e2 in spans2.get(cluster, []):
                        assert e1 < s2 or e2 < s1, (
                            f"{cluster}: {name1} acted {s1:.3f}..{e1:.3f} and {name2} "
                            f"{s2:.3f}..{e2:.3f}"
                        )
    return ran


def check_refused_changed_nothing(world: World) -> int:
    """(3) A command a host's fence refused changed nothing there: the world took no tool
    call from its session (every change to a simulated host is one: a container run or
    removed, a unit, a process, a model launched), and the host's fence record never names
    a refused command's token over the newest one the fence let through. Returns how many
    refused commands there were, so a test sees it looked."""
    calls: dict[tuple[str, int], list[CommandRecord]] = {}
    for record in world.command_log:
        if record.source == "tool" and record.session is not None:
            calls.setdefault((record.host, record.session), []).append(record)
    names = {h.address: h.name for h in world.hosts.values()}
    refused = 0
    for command in world.owned_commands():
        if not command.refused:
            continue
        refused += 1
        name = names[command.host]
        made = [
            r.command
            for r in calls.get((name, command.session), [])
            if command.at <= r.at <= command.ended
        ]
        assert not made, (
            f"{command.owner.instance} token {command.owner.token} was refused on {name} "
            f"(exit {command.status}) at {command.at:.3f}, yet its session ran {made}"
        )
    for host in world.hosts.values():
        _check_fence_record(host.name, Path(host.state.home), host.ssh.owned, host.ssh.running)
    return refused


def _check_fence_record(
    host: str, home: Path, owned: list[OwnedCommand], running: list[Owner]
) -> None:
    """The host's fence record for each cluster holds the highest token its fence let through
    from that etcd (a pass records its token, or finds it there), or one of a command whose
    outcome is unknown (killed, still running): never a refused command's alone."""
    for cluster in sorted({c.owner.cluster for c in owned if c.owner.fenced}):
        path = home / FENCE_DIR / cluster
        try:
            token_text, etcd_text, instance = path.read_text().split()[:3]
            recorded = (int(token_text), int(etcd_text), instance)
        except (OSError, ValueError):
            continue  # none (yet), or not the fence's: a test wrote it
        mine = [c for c in owned if c.owner.fenced and c.owner.cluster == cluster]
        passed = [c.owner for c in mine if not c.refused and c.status < 128]
        unknown = [c.owner for c in mine if not c.refused and c.status >= 128]
        unknown += [o for o in running if o.fenced and o.cluster == cluster]
        same_etcd = [o.token for o in passed if o.etcd == recorded[1]]
        if same_etcd:
            allowed = {max(same_etcd)} | {
                o.token for o in unknown if o.etcd == recorded[1] and o.token > max(same_etcd)
            }
            assert recorded[0] in allowed, (
                f"{host}: the fence record of {cluster} names token {recorded[0]} "
                f"({recorded[2]}); the newest its fence let through is {max(same_etcd)}"
            )
            continue
        ran = {(o.token, o.etcd, o.instance) for o in passed + unknown}
        refused = {(c.owner.token, c.owner.etcd, c.owner.instance) for c in mine if c.refused}
        assert recorded in ran or recorded not in refused, (
            f"{host}: the fence record of {cluster} names a refused command's token {recorded}"
        )


class Etcd(Protocol):
    """What an instance needs of the test's etcd server: where it answers."""

    @property
    def url(self) -> str: ...


class EtcdMembers(Protocol):
    """A test's etcd of several members: where each answers."""

    @property
    def urls(self) -> list[str]: ...


# Why `ready` turns an action away when this instance never adopted the memory under its
# token: no write of its reaches etcd, so the action is never charged there.
UNCHARGED = "not owner: memory not adopted"


@dataclass(eq=False)
class Acted:
    """One action of an instance's, from its log: `end` and `result` None while it has none
    (still running, or the process died in it)."""

    instance: str
    cluster: str
    kind: str
    host: str
    token: int | None
    start: float
    end: float | None = None
    result: str | None = None
    detail: str = ""


def actions_of(instance: Logged) -> list[Acted]:
    """Every action in the instance's log (across its restarts), with the token it held."""
    found: list[Acted] = []
    tokens: dict[str, int] = {}
    open_now: dict[str, Acted] = {}
    for event in instance.events():
        cluster, kind = event.get("cluster"), event.get("event")
        if not isinstance(cluster, str):
            continue
        if kind in ("acquired", "readopted"):
            tokens[cluster] = int(event["token"])
        elif kind == "action_start":
            acted = Acted(
                instance.name, cluster, str(event.get("action")), str(event.get("host")),
                tokens.get(cluster), stamp(event),
            )  # fmt: skip
            open_now[cluster] = acted  # one still open: its process died in it
            found.append(acted)
        elif kind == "action" and cluster in open_now:
            acted = open_now.pop(cluster)
            acted.end, acted.result = stamp(event), str(event.get("result"))
            acted.detail = str(event.get("detail") or "")
    return found


def _budgeted(kind: str, host: str) -> str:
    """What the checker counts attempts per: an action kind on a host (an attempt's key is
    `kind:host:subject`; the subject is not in the log)."""
    return f"{kind} on {host}"


def is_sweep(command: OwnedCommand) -> bool:
    return command.command.endswith("true\n} 9>&-")


def _sent_by(command: OwnedCommand, actions: list[Acted]) -> Acted | None:
    """The action that sent an owned command: of its instance and token, the one running
    when it reached the host, else the last begun before (a delivery held back). Actions run
    back to back (the next begins within SLACK of the last one's end): the slack is only for
    a command no action's own span holds, never a reason to credit it to the next one."""
    owner = command.owner
    ours = [
        a
        for a in actions
        if (a.instance, a.cluster, a.token) == (owner.instance, owner.cluster, owner.token)
    ]
    for slack in (0.0, SLACK):
        mine = [a for a in ours if a.start - slack <= command.at]
        running = [a for a in mine if a.end is None or command.at <= a.end + slack]
        if running:
            return running[-1]
    return mine[-1] if mine else None


async def memory_history(
    etcd: Etcd | EtcdMembers,
    cluster: str,
    prefix: str = "sparkd/v1/",
    login: tuple[str, Path] | None = None,
) -> list[dict[str, Any]]:
    """Every record etcd kept of the cluster's memory, oldest first, each with its revision
    (`mod_revision`): walked back from the newest, one revision before each."""
    urls = list(etcd.urls) if hasattr(etcd, "urls") else [etcd.url]
    user, password = login or (None, None)
    client = EtcdClient(urls, timeout=5, user=user, password_file=password)
    key = memory_key(prefix, cluster)
    records: list[dict[str, Any]] = []
    try:
        at: dict[str, str] = {}
        while True:
            answer = await client.call("kv/range", {"key": b64(key), **at})
            kvs = answer.get("kvs") or []
            if not kvs:
                break
            mod = int(kvs[0].get("mod_revision", 0))
            records.append({**json.loads(base64.b64decode(kvs[0]["value"])), "revision": mod})
            if mod <= int(kvs[0].get("create_revision", 0)):
                break
            at = {"revision": str(mod - 1)}
    finally:
        await client.close()
    return records[::-1]


async def intent_at(
    etcd: Etcd, cluster: str, revision: int, prefix: str = "sparkd/v1/"
) -> dict[str, Any] | None:
    """The cluster's intent record as etcd held it at `revision`: None when there was none."""
    client = EtcdClient([etcd.url], timeout=5)
    try:
        answer = await client.call(
            "kv/range", {"key": b64(intent_key(prefix, cluster)), "revision": str(revision)}
        )
    finally:
        await client.close()
    kvs = answer.get("kvs") or []
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None


def _attempts(record: dict[str, Any]) -> list[tuple[str, str]]:
    """A record's attempts as what they were charged for (their stamps are ages)."""
    return [(a["key"], a.get("reason", "")) for a in record["memory"].get("attempts") or []]


def _check_history(cluster: str, history: list[dict[str, Any]]) -> tuple[float, float]:
    """(4) in etcd's record of the memory, write by write: no attempt charged is dropped (only
    the latest one, a charge its outcome replaces, may go), none at a takeover; a pause stays
    until it ends and a latch stays; only an operator's control record (a resume) clears
    them. Returns the times around the last clearing: attempts in the newest record are for
    actions begun after the first, and every action begun after the second is in it."""
    cleared = (0.0, 0.0)
    for before, after in itertools.pairwise(history):
        was, now = _attempts(before), _attempts(after)
        if MAX_ATTEMPTS in (len(was), len(now)):
            continue  # bounded: the oldest go
        where = (
            f"{cluster}: etcd's memory from {before['instance']} token {before['token']} "
            f"(revision {before['revision']}) to {after['instance']} token {after['token']} "
            f"(revision {after['revision']})"
        )
        assert after["token"] >= before["token"], f"{where}: the token went back"
        if after.get("control", 0) != before.get("control", 0):
            if now[: len(was)] != was:
                cleared = (float(before["written"]), float(after["written"]))
            continue
        # A takeover keeps every charge, the latest too: its outcome is unknown to the new owner.
        kept = was if after["token"] != before["token"] else was[:-1]
        assert now[: len(kept)] == kept, f"{where}: attempts {kept} became {now}"
        old, new = before["memory"], after["memory"]
        if old.get("blocked"):
            assert new.get("blocked"), f"{where}: the latch {old['blocked']} was lost"
            assert new["blocked"]["reason"] == old["blocked"]["reason"], where
        pause = old.get("paused")
        # A pause ends at its `until` on the owner's clock (a second for the two clocks).
        if pause and (pause.get("until") is None or pause["until"] > after["written"] + 1):
            assert new.get("paused") == pause, f"{where}: the pause {pause} became {new['paused']}"
    return cleared


async def check_memory(
    world: World,
    instances: Sequence[Logged],
    etcd: Etcd | EtcdMembers,
    prefix: str = "sparkd/v1/",
    login: tuple[str, Path] | None = None,
) -> int:
    """(4) Per cluster, no budgeted attempt was lost or counted twice, across takeovers too,
    and no pause or latch was lost: etcd's record of the memory write by write
    (`_check_history`), and its newest against the actions in the instances' logs and what
    the hosts ran. Per action kind and host, the attempts it holds are at least the actions
    sure to be charged (one that ran a command on a host, or ended not skipped: each was
    charged in etcd before its first command went) and at most the actions begun that could
    be (all but those turned away before any write). Returns how many attempts it checked."""
    checked = 0
    for name in [c.name for c in load_settings(world.config_path).clusters]:
        read_at = time.time()
        history = await memory_history(etcd, name, prefix, login)
        if not history:
            continue
        # Read after etcd: every action a charge there is for has begun in a log by now.
        actions = [a for i in instances for a in actions_of(i) if a.cluster == name]
        # Charges made before the last clearing are gone; only actions begun after it count.
        could_from, sure_from = _check_history(name, history)
        # Past `ready` (its outcome not skipped): charged in etcd before it sent anything.
        sure = {
            index
            for index, acted in enumerate(actions)
            if acted.result in ("ok", "failed", "timeout")
            and acted.start > sure_from
            and acted.end is not None
            and acted.end < read_at
        }
        for command in world.owned_commands():
            if command.owner.cluster != name or command.refused or is_sweep(command):
                continue
            if command.at >= read_at:
                continue  # its action may have begun after the logs were read
            sender = _sent_by(command, actions)
            assert sender is not None, (
                f"{name}: {command.owner.instance} token {command.owner.token} ran a command "
                f"on {command.host} at {command.at:.3f} in no action of its log"
            )
            if sender.start > sure_from:
                sure.add(actions.index(sender))
        least = Counter(_budgeted(actions[i].kind, actions[i].host) for i in sure)
        most = Counter(
            _budgeted(a.kind, a.host)
            for a in actions
            if a.start > could_from
            and not (a.result == "skipped" and a.detail.startswith(UNCHARGED))
        )
        record = history[-1]
        charged = Counter(_budgeted(*key.split(":")[:2]) for key, _ in _attempts(record))
        for what in sorted(set(least) | set(most) | set(charged)):
            assert least[what] <= charged[what] <= most[what], (
                f"{name}: etcd's memory (revision {record['revision']}, {record['instance']} "
                f"token {record['token']}) holds {charged[what]} attempts at {what}; "
                f"{least[what]} such actions were surely charged, {most[what]} could be"
            )
        checked += sum(charged.values())
    return checked


class Instance(SparkdRun):
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
        port = free_port()
        config = write_fast_config(
            world, tmp_path / f"{name}.toml", tmp_path / f"state-{name}", port, token_file
        )
        config.write_text(
            config.read_text()
            + f'\n[ha]\netcd_endpoints = ["{endpoint or etcd.url}"]\ninstance = "{name}"\n'
            + timings
        )
        super().__init__(config, tmp_path / f"{name}.log", port)
        # When the test SIGKILLed it, each time: an action it died in ends there.
        self.deaths: list[float] = []

    @property
    def killed_at(self) -> float | None:
        """When it was last SIGKILLed, if ever."""
        return self.deaths[-1] if self.deaths else None

    async def kill(self) -> None:
        self.deaths.append(self.signal(signal.SIGKILL))
        assert self.proc is not None
        await self.proc.wait()

    async def metrics(self) -> dict[str, float]:
        found = {}
        for line in (await get(self, "/metrics")).splitlines():
            if line.startswith("sparkd_ha_"):
                name, _, value = line.rpartition(" ")
                found[name] = float(value)
        return found

    def intervals(self, until: float) -> list[tuple[float, float]]:
        """[start, end] of each action in its log, of any cluster (`action_spans`)."""
        return sorted(span for spans in action_spans(self, until).values() for span in spans)


@dataclass(frozen=True)
class Checked:
    """What the checker looked at: owned commands the hosts ran, refused commands, and
    attempts in etcd's memory records; a test asserts it saw what its scenario made."""

    ran: int
    refused: int
    attempts: int


async def check_invariants(
    world: World,
    instances: Sequence[Logged],
    etcd: Etcd | EtcdMembers,
    own_spans: bool = True,
    login: tuple[str, Path] | None = None,
) -> Checked:
    """The whole checker, per cluster: one actor and tokens never backwards
    (`check_one_actor_per_cluster`, `own_spans` as there), a refused command changed nothing
    (`check_refused_changed_nothing`), no budgeted attempt, pause or latch lost or counted
    twice (`check_memory`)."""
    ran = check_one_actor_per_cluster(world, instances, own_spans)
    refused = check_refused_changed_nothing(world)
    attempts = await check_memory(world, instances, etcd, login=login)
    return Checked(ran, refused, attempts)


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
    spans = {a.name: a.intervals(now), b.name: b.intervals(now)}
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


# A `sparkd run` from exec to its first round: 14-19 s at load average 12 on two cores (its
# imports alone), against ~1 s idle. Setup, never what a test checks.
STARTED_WITHIN = 90


async def start_owner_and_standby(a: Instance, b: Instance, cluster: str) -> None:
    await a.start()

    async def a_owns() -> bool:
        return await a.role(cluster) == "owner"

    await eventually(a_owns, within=STARTED_WITHIN)
    await b.start()

    async def b_waits() -> bool:
        return await b.role(cluster) == "standby"

    await eventually(b_waits, within=STARTED_WITHIN)


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


async def looks(instance: Instance) -> int:
    """How many looks the instance has made at its (first) cluster, per its /status."""
    clusters = (await instance.status()).get("clusters") or [{}]
    return int(clusters[0].get("cycles") or 0)


async def two_more_looks(instance: Instance, within: float) -> None:
    """Until the instance has looked twice more: once that began before now may be under
    way, so the second is one that began after."""
    since = await looks(instance)

    async def looked() -> bool:
        return await looks(instance) >= since + 2

    await eventually(looked, within=within)


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

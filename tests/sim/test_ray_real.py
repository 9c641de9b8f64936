"""The simulated Ray against real Ray 2.60 (tests/fixtures/ray-real): the same outputs state by
state (shape, stream, exit status) and the same order of events, in the measured proportions."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from sparkd_sim.state import RayNode
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.sim.steps import (
    HEAD,
    WORKER,
    clean_up,
    ray_head_command,
    ray_status,
    ray_worker_command,
    start_ray,
)
from tests.support.sim import Result, eventually, run

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "ray-real"
NODES = f"timeout -k 2 10 docker exec {HEAD} ray list nodes --format=json"


def real(scenario: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (REAL / f"{scenario}.jsonl").read_text().splitlines()]


def real_sample(scenario: str, cmd: str, test: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    return next(s for s in real(scenario) if s["cmd"] == cmd and test(s))


def shape(text: str) -> list[str]:
    """An output with its variable parts (ids, numbers, units, time) blanked."""
    text = re.sub(r"node_[0-9a-f]{56}", "node_ID", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    text = re.sub(r"[KMG]iB", "UNIT", text)
    return text.splitlines()


def rows(result: Result) -> list[dict[str, Any]]:
    if not result.stdout.startswith("["):
        return []
    parsed: list[dict[str, Any]] = json.loads(result.stdout)
    return parsed


def active_ids(status: str) -> list[str]:
    return re.findall(r"^ 1 node_([0-9a-f]{56})$", status, re.M)


def gpu_total(status: str) -> float | None:
    match = re.search(r"^ [\d.]+/([\d.]+) GPU$", status, re.M)
    return float(match.group(1)) if match else None


@dataclass
class Timeline:
    """When each named condition on (status, nodes) first held, in seconds after `start`."""

    start: float = field(default_factory=time.monotonic)
    seen: dict[str, float] = field(default_factory=dict)
    # Which conditions held at each look: an order holds when no look saw a later state without
    # the earlier one, whatever the looks' spacing (under load two states may share a look).
    looks: list[frozenset[str]] = field(default_factory=list)
    # When each look began: a state first seen at a look was reached after the look before it
    # began, so a duration is bracketed however long the looks' SSH round trips take under load.
    began: list[float] = field(default_factory=list)

    async def watch(
        self,
        head: asyncssh.SSHClientConnection,
        checks: dict[str, Callable[[str, list[dict[str, Any]]], bool]],
        within: float,
    ) -> dict[str, float]:
        deadline = time.monotonic() + within
        while set(checks) - set(self.seen):
            assert time.monotonic() < deadline, f"never saw {set(checks) - set(self.seen)}"
            # `ray status` first, then the node list: a state the list shows was reached before
            # the list was read, so a later state seen in the status without it is out of order.
            self.began.append(time.monotonic() - self.start)
            status = await ray_status(head)
            nodes = await run(head, NODES)
            now = time.monotonic() - self.start
            held = frozenset(n for n, check in checks.items() if check(status.stdout, rows(nodes)))
            self.looks.append(held)
            for name in held - set(self.seen):
                self.seen[name] = now
        return self.seen

    def missed_at(self, name: str) -> float:
        """When the last look that did not see `name` began (0 if the first look saw it): the
        state was reached after this."""
        first = next(i for i, held in enumerate(self.looks) if name in held)
        return self.began[first - 1] if first else 0.0

    def in_order(self, *names: str) -> bool:
        """Each of `names` was seen, and no look saw one without all that come before it."""
        if not set(names) <= set(self.seen):
            return False
        return all(
            set(names[:i]) <= held for held in self.looks for i, n in enumerate(names) if n in held
        )


def state_of(nodes: list[dict[str, Any]], node_id: str) -> str | None:
    return next((n["state"] for n in nodes if n["node_id"] == node_id), None)


async def worker_id(head: asyncssh.SSHClientConnection) -> str:
    nodes = rows(await run(head, NODES))
    return next(n["node_id"] for n in nodes if not n["is_head_node"] and n["state"] == "ALIVE")


async def fresh_ray(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> str:
    """Ray started afresh on both hosts; the worker's node id."""
    await clean_up(world, head, worker)
    await start_ray(world, head, worker)
    return await worker_id(head)


async def test_head_start_up_matches_real_ray_state_by_state(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    await clean_up(world, head, worker)
    assert (await run(head, ray_head_command(world))).exit_status == 0
    # 1. Nothing answers yet: rc 1, nothing on stdout, a ~30-line traceback on stderr.
    for cmd, command in (("status", f"docker exec {HEAD} ray status"), ("nodes", NODES)):
        ours = await run(head, command)
        theirs = real_sample("A_head", cmd, lambda s: s["rc"] == 1)
        assert (ours.exit_status, ours.stdout) == (1, "")
        assert ours.stderr.splitlines()[0] == theirs["stderr"].splitlines()[0]
        assert ours.stderr.splitlines()[-1] == theirs["stderr"].splitlines()[-1]
        assert len(ours.stderr.splitlines()) == len(theirs["stderr"].splitlines())

    # 2. Ray answers but knows no node yet: the transitional texts, rc 0, stdout only.
    async def transitional() -> bool:
        return (await ray_status(head)).exit_status == 0

    await eventually(transitional)
    status, nodes = await ray_status(head), await run(head, NODES)
    for ours, cmd in ((status, "status"), (nodes, "nodes")):
        theirs = real_sample("A_head", cmd, lambda s: s["rc"] == 0)
        assert (ours.exit_status, ours.stdout, ours.stderr) == (0, theirs["stdout"], "")

    # 3. The head is listed: one line of JSON, the sample's keys in the sample's order.
    async def listed() -> bool:
        return (await run(head, NODES)).stdout.startswith("[")

    await eventually(listed)
    nodes = await run(head, NODES)
    theirs = real_sample("A_head", "nodes", lambda s: s["stdout"].startswith("["))
    assert nodes.stdout.count("\n") == 1 and nodes.stderr == ""
    [ours_row], [real_row] = json.loads(nodes.stdout), json.loads(theirs["stdout"])
    assert list(ours_row) == list(real_row)
    assert _resource_keys(ours_row) == _resource_keys(real_row)
    assert re.fullmatch(r"\d+\.\d{3} [MG]iB", ours_row["resources_total"]["memory"])
    assert (ours_row["start_time_ms"], ours_row["end_time_ms"]) == (None, None)

    # 4. `ray status` shows the head and its GPU, in the 2.60 layout.
    async def counted() -> bool:
        return " GPU" in (await ray_status(head)).stdout

    await eventually(counted)
    theirs = real_sample("A_head", "status", lambda s: "Active:" in s["stdout"])
    assert shape((await ray_status(head)).stdout) == shape(theirs["stdout"])


def _resource_keys(row: dict[str, Any]) -> set[str]:
    return {re.sub(r"node:[\d.]+$", "node:IP", k) for k in row["resources_total"]}


async def test_start_up_in_the_measured_order(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    t = world.timing
    await clean_up(world, head, worker)
    timeline = Timeline()
    assert (await run(head, ray_head_command(world))).exit_status == 0
    seen = await timeline.watch(
        head,
        {
            "answers": lambda status, _: status != "",
            "head listed": lambda _, nodes: len(nodes) == 1,
            "head counted": lambda status, _: gpu_total(status) == 1.0,
        },
        within=10 * t.head_counted + 5,
    )
    assert t.head_answer * 0.9 <= seen["answers"]
    assert timeline.in_order("answers", "head listed", "head counted")
    assert seen["head listed"] >= t.head_listed * 0.9
    timeline = Timeline()
    assert (await run(worker, ray_worker_command(world))).exit_status == 0
    seen = await timeline.watch(
        head,
        {
            "worker listed": lambda _, nodes: len(nodes) == 2,
            "worker counted": lambda status, _: gpu_total(status) == 2.0,
        },
        within=10 * t.worker_counted + 5,
    )
    assert t.worker_listed * 0.9 <= seen["worker listed"]
    assert timeline.in_order("worker listed", "worker counted")
    assert seen["worker counted"] >= t.worker_counted * 0.9


# A state that lasts a fraction of a second in the fast preset (the 4-6 s in which a dead node is
# gone from `Active:` while its GPU still counts, a restarted worker's overlap with its dead self)
# is shorter than one look's two SSH round trips on a loaded machine, so a look can step over it.
# Tests about such a state run in a world five times slower: every ratio holds, and the state
# outlasts a look.
BRIEF_STATES = pytest.mark.parametrize("timing", [Timing.fast().scaled(5)], ids=["x5"])


@BRIEF_STATES
async def test_killed_worker_is_dead_in_list_before_status_drops_it(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    """E_kill_raylet: DEAD in list 14-16 s, gone from `Active:` 17-20 s, GPU total 23-25 s."""
    t = world.timing
    old = await fresh_ray(world, head, worker)
    timeline = Timeline()
    assert (await run(worker, f"docker rm -f {WORKER}")).exit_status == 0
    seen = await timeline.watch(
        head,
        {
            "dead": lambda _, nodes: state_of(nodes, old) == "DEAD",
            "inactive": lambda status, _: old not in active_ids(status),
            "window": lambda status, _: old not in active_ids(status) and gpu_total(status) == 2,
            "uncounted": lambda status, _: gpu_total(status) == 1.0,
        },
        within=10 * t.dead_uncounted + 5,
    )
    assert timeline.in_order("dead", "inactive", "uncounted")
    assert seen["dead"] >= t.dead_listed * 0.9
    assert seen["inactive"] >= t.dead_inactive * 0.9
    assert seen["uncounted"] >= t.dead_uncounted * 0.9
    # The real window where the node is gone from Active but its GPU still counts (4-6 s).
    assert seen["window"] < seen["uncounted"]
    nodes = rows(await run(head, NODES))
    dead = next(n for n in nodes if n["node_id"] == old)
    theirs = real_sample("E_kill_raylet", "nodes", lambda s: "Unexpected" in s["stdout"])
    real_dead = next(
        n
        for n in json.loads(theirs["stdout"])
        if n["state"] == "DEAD" and n["state_message"].startswith("Unexpected")
    )
    assert dead["state_message"] == real_dead["state_message"]
    assert list(dead) == list(real_dead)


async def test_hung_worker_takes_about_four_times_as_long(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    """G_sigstop: a worker whose processes are stopped is DEAD after 63-64 s (killed: 14-16 s),
    its GPU dropped after 69-70 s; the model's calls to it hang until then."""
    t = world.timing
    old = await fresh_ray(world, head, worker)
    top = await run(worker, f"docker top {WORKER} -eo pid,args")
    raylet = next(line.split()[0] for line in top.stdout.splitlines() if "raylet" in line)
    timeline = Timeline()
    assert (await run(worker, f"kill -STOP {raylet}")).exit_status == 0
    stopped_by = time.monotonic() - timeline.start
    seen = await timeline.watch(
        head,
        {
            "dead": lambda _, nodes: state_of(nodes, old) == "DEAD",
            "uncounted": lambda status, _: gpu_total(status) == 1.0,
        },
        within=10 * t.hung_uncounted + 5,
    )
    assert timeline.in_order("dead", "uncounted")
    assert seen["dead"] >= t.hung_listed * 0.9 and seen["uncounted"] >= t.hung_uncounted * 0.9
    # The head declared it dead within (last look that missed it began - kill returned, look
    # that saw it ended - kill sent): about four times a killed node's delay.
    assert seen["dead"] >= 3.5 * t.dead_listed, seen["dead"]
    earliest = timeline.missed_at("dead") - stopped_by
    assert earliest <= 5.5 * t.dead_listed, earliest
    # Woken after Ray gave up on it, its raylet is told it is dead and exits: so does the
    # container (`ray start --block` exits 1).
    assert (await run(worker, f"kill -CONT {raylet}")).exit_status == 0

    async def exited() -> bool:
        ps = await run(worker, f"docker ps -a --filter name={WORKER} --format '{{{{.Status}}}}'")
        return ps.stdout.startswith("Exited (1)")

    await eventually(exited)


# The heal must come before the hung node is listed dead: 1.4 s after the killed-node delays in
# the fast preset, in which this test makes two reads (at load 12 they took 0.25 s).
@BRIEF_STATES
async def test_blackholed_worker_hangs_ray_and_heal_in_time_recovers(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    t = world.timing
    old = await fresh_ray(world, head, worker)
    await world.fault("blackhole", "spark-b")
    await asyncio.sleep(t.dead_uncounted * 1.2)
    # Past the killed-node delays, a hung node still counts.
    assert state_of(rows(await run(head, NODES)), old) == "ALIVE"
    assert gpu_total((await ray_status(head)).stdout) == 2.0
    await world.fault("heal", "spark-b")
    await asyncio.sleep(t.hung_listed - t.dead_uncounted * 1.2 + t.dead_listed)
    assert state_of(rows(await run(head, NODES)), old) == "ALIVE"


async def test_ray_stop_keeps_the_container_running(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    """C_ray_stop: DEAD with `Expected termination` in 2-5 s, GPU total drops in 11-13 s, and
    `ray start --block` keeps running with no Ray in it."""
    t = world.timing
    old = await fresh_ray(world, head, worker)
    timeline = Timeline()
    stopped = await run(worker, f"docker exec {WORKER} ray stop")
    assert stopped.exit_status == 0 and stopped.stdout.startswith("Stopped all ")
    seen = await timeline.watch(
        head,
        {
            "dead": lambda _, nodes: state_of(nodes, old) == "DEAD",
            "uncounted": lambda status, _: gpu_total(status) == 1.0,
        },
        within=10 * t.stop_uncounted + 5,
    )
    assert t.stop_listed * 0.9 <= seen["dead"]
    assert timeline.in_order("dead", "uncounted")
    assert seen["uncounted"] >= t.stop_uncounted * 0.9
    theirs = real_sample("C_ray_stop", "nodes", lambda s: '"DEAD"' in s["stdout"])
    real_dead = next(n for n in json.loads(theirs["stdout"]) if n["state"] == "DEAD")
    dead = next(n for n in rows(await run(head, NODES)) if n["node_id"] == old)
    assert dead["state_message"] == real_dead["state_message"]
    ps = await run(worker, f"docker ps --filter name={WORKER} --format '{{{{.State}}}}'")
    assert ps.stdout == "running\n"
    again = await run(worker, f"docker exec {WORKER} ray status")
    assert again.exit_status == 1 and "Could not find any running Ray instance" in again.stderr


@BRIEF_STATES
async def test_worker_restarted_at_once_overlaps_its_dead_self(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    """F_restart_overlap: the dead node stays ALIVE for ~14 s, the new one is ALIVE from ~8 s on
    the same IP (3 ALIVE nodes), and the status counts 3 GPUs for a while."""
    t = world.timing
    old = await fresh_ray(world, head, worker)
    worker_ip = world.hosts["spark-b"].state.data_ip
    timeline = Timeline()
    assert (await run(worker, f"docker rm -f {WORKER}")).exit_status == 0
    assert (await run(worker, ray_worker_command(world))).exit_status == 0

    def two_alive_on_worker(_: str, nodes: list[dict[str, Any]]) -> bool:
        alive = [n for n in nodes if n["node_ip"] == worker_ip and n["state"] == "ALIVE"]
        return len(alive) == 2

    seen = await timeline.watch(
        head,
        {
            "overlap": two_alive_on_worker,
            "three gpus": lambda status, _: gpu_total(status) == 3.0,
            "old dead": lambda _, nodes: state_of(nodes, old) == "DEAD",
            "two gpus again": lambda status, _: (
                "three gpus" in timeline.seen and gpu_total(status) == 2.0
            ),
        },
        within=10 * t.dead_uncounted + 5,
    )
    assert seen["overlap"] < seen["old dead"] < seen["two gpus again"]
    assert seen["three gpus"] < seen["two gpus again"]


async def test_old_worker_of_a_restarted_head_dies_after_the_new_head_is_up(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    """I_head_restart: the old worker never rejoins; its raylet dies ~33 s after the new head is
    up, then its `ray start --block` exits 1."""
    t = world.timing
    await clean_up(world, head, worker)
    await start_ray(world, head, worker)
    assert (await run(head, f"docker rm -f {HEAD}")).exit_status == 0
    assert (await run(head, ray_head_command(world))).exit_status == 0
    relaunched = time.monotonic()

    async def worker_exited() -> bool:
        ps = await run(worker, f"docker ps -a --filter name={WORKER} --format '{{{{.Status}}}}'")
        return ps.stdout.startswith("Exited (1)")

    await eventually(worker_exited, within=10 * (t.head_answer + t.head_mismatch) + 5)
    assert time.monotonic() - relaunched >= (t.head_answer + t.head_mismatch) * 0.9
    nodes = rows(await run(head, NODES))
    assert [n["node_ip"] for n in nodes] == [world.hosts["spark-a"].state.data_ip]


async def test_list_filter_and_default_limit(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    await clean_up(world, head, worker)
    await start_ray(world, head, worker)

    async def both_listed() -> bool:
        return len(rows(await run(head, NODES))) == 2

    await eventually(both_listed)
    [cluster] = [c for c in world.ray.clusters if c.alive]
    # 120 restarts' worth of DEAD records whose ids sort before the live nodes' ids.
    for i in range(120):
        dead = RayNode(
            node_id=f"{i:04x}" + "0" * 52,
            ip=world.hosts["spark-b"].state.data_ip,
            host="spark-b",
            container_id="gone",
            is_head=False,
            launched=time.monotonic() - 100,
        )
        dead.deaths.append((time.monotonic() - 50, "killed"))
        cluster.nodes.append(dead)
    listed = rows(await run(head, NODES))
    assert len(listed) == 100 and all(n["state"] == "DEAD" for n in listed)
    ids = [n["node_id"] for n in listed]
    assert ids == sorted(ids)
    for flag in ("--filter state=ALIVE", '--filter "state=ALIVE"', "--filter=state=ALIVE"):
        alive = rows(await run(head, f"{NODES} {flag}"))
        assert len(alive) == 2 and {n["state"] for n in alive} == {"ALIVE"}, flag
    assert len(rows(await run(head, f"{NODES} --filter state=ALIVE --limit 1"))) == 1
    assert len(rows(await run(head, f"{NODES} --limit 150"))) == 122
    # A caller reading stdout only gets the JSON; one merging stderr gets both streams.
    merged = await run(head, f"{NODES} --filter state=ALIVE 2>&1")
    assert json.loads(merged.stdout)
    none = await run(head, f"{NODES} --filter node_ip=10.9.9.9")
    assert (none.exit_status, none.stdout) == (0, "No resource in the cluster\n")

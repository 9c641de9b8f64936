"""Rollouts end to end: a config change reaches the simulated world as one cutover; a new spec
that fails there is rolled back to the last-good one, which serves again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sparkd.core.spec import identity
from sparkd.model.cluster import RolloutCheck
from sparkd.model.plan import Plan
from sparkd.runtime.controller import Controller
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.daemon import eventually, mutations
from tests.support.http import fetch, get, post
from tests.support.rollout import serves, serving_with_last_good

BAD_FLAG = "--enable-resoning"


async def until(ctl: Controller, done: Any, cycles: int = 300) -> list[Plan]:
    plans: list[Plan] = []
    for _ in range(cycles):
        plans.append(await ctl.cycle())
        if done(plans[-1], ctl):
            return plans
        await asyncio.sleep(0.1)
    raise AssertionError(f"not done after {cycles} cycles: {plans[-1].reason}")


def rolled_back_and_serving(plan: Plan | None, ctl: Controller) -> bool:
    record = ctl.memory.rollout
    held = record is not None and record.restored_at is not None
    return plan is not None and plan.phase == "degraded" and held


def assert_rolled_back(ctl: Controller, plans: list[Plan], bad: str, good: str, why: str) -> None:
    started = next(p for p in plans if p.rollback is not None)
    assert why in (started.rollback or "")
    held = plans[-1]
    assert held.reason.startswith(f"rolled back from {bad} to {good}: "), held.reason
    record = ctl.memory.rollout
    assert record is not None and record.result == "rolled_back"
    events = ctl.state.read_events_counted(1000, ctl.cluster.name)[0]
    back = [e for e in events if e["kind"] == "rolled_back"]
    assert len(back) == 1 and why in back[0]["reason"] and back[0]["last_good"] == good


async def test_a_good_change_rolls_out_with_one_cutover_and_is_accepted(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    old = await serving_with_last_good(healthy_world, pool, tmp_path / "s")
    good = old.good
    ctl, since = old.reload(extra_args=old.args("--max-num-seqs", "8"))
    plans = await until(
        ctl, lambda p, c: c.memory.rollout is not None and c.memory.rollout.result == "accepted"
    )
    launched = serves(healthy_world, since)
    assert len(launched) == 1 and "--max-num-seqs 8" in launched[0]
    assert not any(p.rollback for p in plans)
    record = ctl.memory.rollout
    assert record is not None and record.from_hash == good.hash
    assert record.downtime is not None and record.downtime > 0
    new_good = ctl.memory.last_good
    assert new_good is not None and new_good.hash == identity(ctl.cluster)


async def test_a_bad_argument_rolls_back_and_serves_again(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    old = await serving_with_last_good(healthy_world, pool, tmp_path / "s")
    good = old.good
    ctl, since = old.reload(extra_args=old.args(BAD_FLAG))
    plans = await until(ctl, rolled_back_and_serving)
    bad = identity(ctl.cluster)
    assert_rolled_back(ctl, plans, bad, good.hash, f"unrecognized arguments: {BAD_FLAG}")
    launched = serves(healthy_world, since)
    assert [BAD_FLAG in c for c in launched] == [True, False]
    # Held: the bad spec is not tried again.
    for _ in range(5):
        assert not (await ctl.cycle()).actions
        await asyncio.sleep(0.1)
    assert len(serves(healthy_world, since)) == 2


async def test_a_missing_weight_file_rolls_back_and_serves_again(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    old = await serving_with_last_good(healthy_world, pool, tmp_path / "s")
    good = old.good
    other = "/models/Qwen3.5-122B-A10B-FP8-v2"
    # Whole when the cutover is prepared; a shard goes once the new serve has started.
    healthy_world.add_checkpoint(other)
    await healthy_world.fault("vanish-weights", "spark-a", other)
    ctl, since = old.reload(id=other)
    plans = await until(ctl, rolled_back_and_serving)
    why = f"FileNotFoundError: Weight files referenced in index but missing: {{'{other}/"
    assert_rolled_back(ctl, plans, identity(ctl.cluster), good.hash, why)
    launched = serves(healthy_world, since)
    assert [other in c for c in launched] == [True, False]
    assert ctl.view.snapshot is not None and ctl.view.snapshot.endpoint is not None
    assert ctl.view.snapshot.endpoint.serves(old.ctl.cluster.model.served_name)


async def test_a_stalled_load_rolls_back_and_serves_again(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    old = await serving_with_last_good(healthy_world, pool, tmp_path / "s")
    good = old.good
    await healthy_world.fault("stall-load", "spark-a")  # the next load stops at 40 %
    ctl, since = old.reload(extra_args=old.args("--max-num-seqs", "8"))
    plans = await until(ctl, rolled_back_and_serving)
    assert_rolled_back(ctl, plans, identity(ctl.cluster), good.hash, "load stalled")
    launched = serves(healthy_world, since)
    assert ["--max-num-seqs 8" in c for c in launched] == [True, False]


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


async def test_rollout_retry_and_back_through_the_api_with_metrics_and_status(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    old = await serving_with_last_good(healthy_world, pool, tmp_path / "s")
    good = old.good
    daemon, since = await old.daemon(tmp_path / "token", extra_args=old.args(BAD_FLAG))
    try:
        ctl = daemon.controllers["sparks"]
        base = f"{daemon.url}/clusters/sparks/rollout"
        await eventually(lambda: rolled_back_and_serving(ctl.view.plan, ctl), within=60)
        _, text = await fetch(f"{daemon.url}/metrics")
        assert sample(text, "sparkd_rollout_rolled_back", cluster="sparks") == 1
        assert sample(text, "sparkd_rollout_in_progress", cluster="sparks") == 0
        assert sample(text, "sparkd_rollouts_total", result="rolled_back") == 1
        _, body = await get(f"{daemon.url}/status")
        shown = body["clusters"][0]["rollout"]
        assert shown["desired"] == identity(ctl.cluster)
        assert shown["running"] == good.hash and shown["last_good"]["spec"] == good.hash
        assert shown["rolled_back"] is True and shown["latest"]["result"] == "rolled_back"
        assert any(BAD_FLAG in d for d in shown["differs"])
        assert (await post(f"{base}/retry", {"by": "bob"}, token="wrong"))[0] == 401
        # Held already: nothing to go back to.
        assert (await post(f"{base}/back", {"by": "bob"}))[0] == 409
        assert (await post(f"{base}/retry", {"by": "bob"}))[0] == 200
        # The bad spec once more, then the rollback once more: a new rollout.
        await eventually(
            lambda: (
                ctl.memory.rollout is not None
                and ctl.memory.rollout.id == 2
                and rolled_back_and_serving(ctl.view.plan, ctl)
            ),
            within=60,
        )
        launched = serves(healthy_world, since)
        assert [BAD_FLAG in c for c in launched] == [True, False, True, False]
        _, text = await fetch(f"{daemon.url}/metrics")
        assert sample(text, "sparkd_rollouts_total", result="rolled_back") == 2
    finally:
        await daemon.stop()


async def test_rollout_back_through_the_api_goes_to_last_good_during_a_load(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    old = await serving_with_last_good(healthy_world, pool, tmp_path / "s")
    good = old.good
    await healthy_world.fault("slow-load", "spark-a")  # progresses: never rolled back by itself
    args = old.args("--max-num-seqs", "8")
    daemon, since = await old.daemon(tmp_path / "token", extra_args=args)
    try:
        ctl = daemon.controllers["sparks"]
        base = f"{daemon.url}/clusters/sparks/rollout"
        # The cutover may take a detour first (engine processes that outlive their serve on a
        # loaded box: a Ray restart), well past the default 15 s before the new load begins.
        await eventually(
            lambda: ctl.view.plan is not None and ctl.view.plan.phase == "loading", within=60
        )
        assert (await post(f"{base}/back", {"by": "bob"}, token=None))[0] == 401
        assert (await post(f"{base}/retry", {"by": "bob"}))[0] == 409  # nothing rolled back
        assert (await post(f"{base}/back", {"by": "bob"}))[0] == 200
        await healthy_world.fault("heal", "spark-a")
        await eventually(lambda: rolled_back_and_serving(ctl.view.plan, ctl), within=60)
        plan = ctl.view.plan
        assert plan is not None
        assert plan.reason.startswith(
            f"rolled back from {identity(ctl.cluster)} to {good.hash}: asked by bob"
        )
        assert ["--max-num-seqs 8" in c for c in serves(healthy_world, since)] == [True, False]
        _, text = await fetch(f"{daemon.url}/metrics")
        assert sample(text, "sparkd_rollout_rolled_back", cluster="sparks") == 1
    finally:
        await daemon.stop()


async def test_a_failed_acceptance_check_rolls_back_and_serves_again(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    old = await serving_with_last_good(healthy_world, pool, tmp_path / "s")
    good = old.good
    ctl, since = old.reload(extra_args=old.args("--max-num-seqs", "8"))
    # Reasoning-only answers of 50 tokens (max_tokens 50) can never give 51.
    check = RolloutCheck(prompt="Name three rivers.", max_tokens=50, min_completion_tokens=51)
    ctl.cluster = ctl.cluster.model_copy(
        update={"rollout": ctl.cluster.rollout.model_copy(update={"checks": (check,)})}
    )
    plans = await until(ctl, rolled_back_and_serving)
    why = "acceptance check 1 failed: 50 completion tokens, fewer than 51"
    assert_rolled_back(ctl, plans, identity(ctl.cluster), good.hash, why)
    launched = serves(healthy_world, since)
    assert ["--max-num-seqs 8" in c for c in launched] == [True, False]


async def test_a_change_held_before_cutover_never_stops_the_serving_deployment(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """The log_dir without room (below model.min_disk_free) holds the cutover: the old serve
    keeps serving, nothing on the head is stopped, no rollout counts as failed."""
    old = await serving_with_last_good(healthy_world, pool, tmp_path / "s")
    good = old.good
    await healthy_world.fault("full-disk", "spark-a")
    ctl, since = old.reload(extra_args=old.args("--max-num-seqs", "8"))
    plans = [await ctl.cycle() for _ in range(8)]
    assert all(not p.actions for p in plans)
    assert plans[-1].phase == "blocked" and "disk full on spark-a" in plans[-1].reason
    assert mutations(healthy_world, "spark-a", since) == []
    snapshot = ctl.view.snapshot
    assert snapshot is not None and snapshot.serve is not None and snapshot.serve.running
    assert snapshot.serve.spec_hash == good.hash
    record = ctl.memory.rollout
    assert record is not None and record.result == "in_progress" and record.stopped_at is None
    # Room again: the change is cut over once.
    await healthy_world.fault("heal", "spark-a")
    await until(ctl, lambda p, c: c.memory.rollout is not None and c.memory.rollout.accepted_at)
    assert ["--max-num-seqs 8" in c for c in serves(healthy_world, since)] == [True]

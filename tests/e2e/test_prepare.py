"""Prepare before cutover, end to end: a change whose model files are not whole on the head
stops nothing, says why in /status, and is cut over once when the files are there."""

from __future__ import annotations

from pathlib import Path

from sparkd.core.spec import identity
from sparkd.shell.ssh import SshPool
from sparkd_sim.checkpoint import shard_name
from sparkd_sim.world import World
from tests.support.daemon import eventually, mutations
from tests.support.http import get
from tests.support.rollout import serves, serving_with_last_good

OTHER = "/models/Qwen3.5-122B-A10B-FP8-v2"


async def test_a_reload_to_a_model_missing_a_weight_file_stops_nothing_until_it_appears(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    old = await serving_with_last_good(healthy_world, pool, tmp_path / "s")
    good = old.good
    await healthy_world.fault("missing-weights", "spark-a", OTHER)
    assert not (healthy_world.model_dir(OTHER) / shard_name(2)).exists()
    daemon, since = await old.daemon(tmp_path / "token", id=OTHER)
    try:
        ctl = daemon.controllers["sparks"]
        want = identity(ctl.cluster)

        plans: set[int] = set()

        async def held() -> bool:
            _, body = await get(f"{daemon.url}/status")
            shown = body["clusters"][0]
            if shown["phase"] == "blocked" and shown["reason"].startswith(
                f"rollout of {want} waits: weight file "
            ):
                plans.add(id(ctl.view.plan))
            # Held over several cycles, not one.
            return len(plans) >= 4

        await eventually(held, within=30)
        _, body = await get(f"{daemon.url}/status")
        reason = body["clusters"][0]["reason"]
        assert f"{shard_name(2)} named by its index missing in" in reason, reason
        # Nothing stopped, removed, killed or launched on the head: the old serve serves.
        assert mutations(healthy_world, "spark-a", since) == []
        snapshot = ctl.view.snapshot
        assert snapshot is not None and snapshot.serve is not None and snapshot.serve.running
        assert snapshot.serve.spec_hash == good.hash
        assert ctl.memory.blocked is None
        # The download completes: one cutover, accepted.
        await healthy_world.fault("heal", "spark-a")

        def accepted() -> bool:
            record = ctl.memory.rollout
            return record is not None and record.result == "accepted"

        await eventually(accepted, within=60)
        launched = serves(healthy_world, since)
        assert [OTHER in c for c in launched] == [True]
        new_good = ctl.memory.last_good
        assert new_good is not None and new_good.hash == want
    finally:
        await daemon.stop()

"""First contact with a deployment made by hand (the simulator's `handmade` scenario: Ray
containers of the operator's own naming, `vllm serve` started with `docker exec -d`), over real
SSH: sparkd adopts it with no mutating command, reaches `healthy` and says `adopted`."""

from __future__ import annotations

from pathlib import Path

from sparkd.runtime.state import StateDir
from sparkd.shell.ssh import SshPool
from sparkd_sim import handmade
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.daemon import (
    after_its_own_launch,
    controller,
    cycle_until,
    cycles,
    mutations,
)
from tests.support.process import sparkd


async def test_a_hand_made_deployment_is_adopted_without_a_restart(
    tmp_path: Path, pool: SshPool
) -> None:
    async with World(tmp_path / "world", scenario="handmade", timing=Timing.fast()) as world:
        await world.brought_up()
        # Only sparkd's commands count: not the operator's own `docker exec -d ... vllm serve`.
        since = await after_its_own_launch(world)
        state = tmp_path / "state"
        ctl = controller(world, pool, state)
        plans = await cycle_until(ctl, "healthy", limit=300)
        # Nothing was ever proposed on the way: no restart, no removal, no launch beside it.
        assert not [a for p in plans for a in p.actions], [p.reason for p in plans]
        assert "adopted the deployment made by hand" in plans[-1].reason, plans[-1].reason
        later = await cycles(ctl, 5, pause=0.05)
        assert all(p.phase == "healthy" and not p.actions for p in later), later[-1].reason
        assert mutations(world, since=since) == []
        events = StateDir(state).read_events_counted(100)[0]
        adopted = [e for e in events if e["kind"] == "adopted"]
        assert len(adopted) == 1
        assert adopted[0]["containers"] == {
            "spark-a": handmade.ADOPTABLE.head,
            "spark-b": handmade.ADOPTABLE.worker,
        }
        assert adopted[0]["serve_pid"] is not None


async def test_a_deployment_that_differs_is_shown_until_the_operator_decides(
    tmp_path: Path, pool: SshPool
) -> None:
    async with World(tmp_path / "world", scenario="handmade", timing=Timing.fast()) as world:
        await world.brought_up()
        since = await after_its_own_launch(world)
        state = tmp_path / "state"
        base = controller(world, pool, state).cluster
        # The config wants one more variable in the Ray containers than the script set.
        env = {**base.ray.env, "NCCL_DEBUG": "WARN"}
        ctl = controller(world, pool, state, cluster={"ray": {"env": env}})
        plans = await cycles(ctl, 8, pause=0.05)
        last = plans[-1]
        assert all(p.phase == "blocked" and not p.actions for p in plans), last.reason
        assert "would replace the deployment made by hand" in last.reason
        assert "env NCCL_DEBUG is unset, config 'WARN'" in last.reason
        shown = {(a.kind, a.host, a.target) for a in last.withheld}
        assert ("remove_container", "spark-a", handmade.ADOPTABLE.head) in shown
        assert mutations(world, since=since) == []

        # The operator decides: the hand-made containers go, sparkd's own launch serves.
        decided = controller(world, pool, state, cluster={"ray": {"env": env}, "adopt": "replace"})
        plans = await cycle_until(decided, "healthy", limit=400)
        removed = [a.target for p in plans for a in p.actions if a.kind == "remove_container"]
        assert sorted(removed) == sorted([handmade.ADOPTABLE.head, handmade.ADOPTABLE.worker])
        started = [a.kind for p in plans for a in p.actions]
        assert "start_ray_head" in started and "start_model" in started


async def test_sparkd_plan_on_first_contact_says_adopting_or_would_replace(
    tmp_path: Path,
) -> None:
    async with World(tmp_path / "world", scenario="handmade", timing=Timing.fast()) as world:
        await world.brought_up()
        since = await after_its_own_launch(world)
        code, out, err = await sparkd("plan", "--config", str(world.config_path))
        assert code == 0, err
        assert "adopting the deployment made by hand" in out, out
        # A config that differs (one more Ray variable) is shown with the rollout it would do.
        differing = tmp_path / "differing.toml"
        text = world.config_path.read_text()
        differing.write_text(
            text.replace("  [clusters.ray.env]\n", '  [clusters.ray.env]\n  NCCL_DEBUG = "WARN"\n')
        )
        code, out, err = await sparkd("plan", "--config", str(differing))
        assert code == 0, err
        assert "would replace the deployment made by hand" in out, out
        assert f"remove_container {handmade.ADOPTABLE.head} on spark-a (withheld)" in out, out
        assert mutations(world, since=since) == []

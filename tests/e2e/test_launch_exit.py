"""A launch that ran and ended before a look caught its process: the start action fails as soon
as the log shows it, with vLLM's own last line, not after `serve_appear`. argparse rejects an
unknown flag within a second of `vllm serve` starting (the simulator's vLLM, as vLLM 0.32.0's
FlexibleArgumentParser: "vllm: error: unrecognized arguments: ..."); the executor had waited the
whole `serve_appear` (30 s in production) for a process that was long gone."""

from __future__ import annotations

from pathlib import Path

from sparkd.model.plan import Action
from sparkd.shell.execute import Executor, ExecutorTiming
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.daemon import converged

BAD_ARG = "--enable-reasoning-parser"
# Long beside how fast the bad launch ends. The failure's own words tell a fast failure from a
# timeout ("exited right after launch" with vLLM's line, or "not running 20s after launch"), so
# the test needs no clock of its own.
SERVE_APPEAR = 20.0


async def test_a_launch_that_exits_at_once_fails_with_its_last_line_without_waiting(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl, _ = await converged(seed_world, pool, tmp_path / "state", cycles=200)
    model = ctl.cluster.model.model_copy(update={"extra_args": (BAD_ARG,)})
    cluster = ctl.cluster.model_copy(update={"model": model})
    timing = ExecutorTiming(poll=0.05, serve_appear=SERVE_APPEAR, stop_grace=2.0)
    executor = Executor(cluster, pool, timing=timing)
    action = Action(kind="restart_model", host=cluster.head.name, target=model.id, reason="test")
    outcome = await executor.run_one(action)
    assert outcome.result == "failed", outcome
    assert outcome.detail.startswith("vllm serve exited right after launch: "), outcome.detail
    assert f"unrecognized arguments: {BAD_ARG}" in outcome.detail


async def test_a_launch_that_starts_is_not_mistaken_for_one_that_ended(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """The good spec's relaunch writes lines while it runs: it is the process `top` shows."""
    ctl, _ = await converged(seed_world, pool, tmp_path / "state", cycles=200)
    timing = ExecutorTiming(poll=0.05, serve_appear=SERVE_APPEAR, stop_grace=2.0)
    executor = Executor(ctl.cluster, pool, timing=timing)
    action = Action(
        kind="restart_model", host=ctl.cluster.head.name, target=ctl.cluster.model.id, reason=""
    )
    outcome = await executor.run_one(action)
    assert outcome.result == "ok", outcome
    assert outcome.detail.startswith("vllm serve launched (pid "), outcome.detail

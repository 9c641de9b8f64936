"""A hung engine under load, against the simulated world: requests stay running and the token
counter stands still in vLLM's /metrics; the model is restarted within the hang window, before
three probe timeouts would have done it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.daemon import controller, converge, eventually, mutations, running
from tests.support.ratios import SCALE, shipped_ratios

# The defaults' ratios on the tests' probe_interval of 1.2 s, prefill_rate among them: the
# longest engine step (vLLM's default step at that rate) is measured against hang_window.
REAL_RATIOS = shipped_ratios()


async def test_a_hang_under_load_restarts_the_model_within_the_window(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(healthy_world, pool, tmp_path / "state", cluster=REAL_RATIOS)
    await converge(ctl)

    def restarted() -> bool:
        return any(o.action.kind == "restart_model" for o in ctl.view.recent)

    def relaunched() -> bool:
        changed = mutations(healthy_world, "spark-a", since)
        return any(r.command.startswith("vllm serve") for r in changed)

    async with running(ctl):
        await asyncio.sleep(3 * 70.0 * SCALE)  # past the just-ready engine's grace
        assert not restarted()
        since = time.time()
        await healthy_world.fault("hang-under-load", "spark-a")
        await eventually(restarted, within=20)
        # Then a new serve (once the hung one's orphaned engine went with Ray's containers,
        # as with any hung vLLM).
        await eventually(relaunched, within=60)
    restart = next(o for o in ctl.view.recent if o.action.kind == "restart_model")
    assert restart.action.reason.startswith("hung under load: "), restart.action.reason
    assert "vllm:generation_tokens_total still at" in restart.action.reason
    # Before three probe timeouts would have restarted it (timings: `bench detect`).
    assert "consecutive failed probes" not in restart.action.reason
    # The world's log: the hung serve signalled in its container.
    signalled = [
        r.command
        for r in healthy_world.commands("spark-a")
        if r.source == "tool" and r.at >= since and "serve.pid" in r.command
    ]
    assert any("kill -TERM" in c for c in signalled), signalled

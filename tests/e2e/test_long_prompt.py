"""A client's long prompt against the simulated world (issue 43): while it is prefilled one
request runs and no token counter moves for longer than `policy.hang_window`, but vLLM's
KV-cache usage rises, so the model is not restarted (the user's request would die with it), and
the probes that wait behind the prefill are not counted as failures. A real hang (nothing
moving) is still restarted: tests/e2e/test_hang_under_load.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.daemon import controller, converge, eventually, mutations, running
from tests.support.ratios import PREFILL_RATE, SCALE, shipped_ratios

REAL_RATIOS = shipped_ratios()
PROMPT_TOKENS = 250_000


async def test_a_long_prompt_is_not_restarted(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(healthy_world, pool, tmp_path / "state", cluster=REAL_RATIOS)
    await converge(ctl)
    head = healthy_world.hosts["spark-a"]
    reasons: list[str] = []

    def restarted() -> bool:
        return any(o.action.kind == "restart_model" for o in ctl.view.recent)

    async def watch() -> None:
        while True:
            plan = ctl.view.plan
            if plan is not None and (not reasons or reasons[-1] != plan.reason):
                reasons.append(plan.reason)
            await asyncio.sleep(0.02)

    async with running(ctl):
        await asyncio.sleep(3 * 70.0 * SCALE)  # past the just-ready engine's grace
        assert not restarted()
        watcher = asyncio.create_task(watch())
        since = time.time()
        head.behaviour.prefill_rate = PREFILL_RATE
        started = time.monotonic()
        await healthy_world.fault("long-prompt", "spark-a", str(PROMPT_TOKENS))
        served = healthy_world._serve_on("spark-a")

        def answered() -> bool:
            server = getattr(served.server, "server", None)
            return server is not None and server.prompt_tokens_total >= PROMPT_TOKENS

        await eventually(answered, within=60)
        prefill = time.monotonic() - started
        # Then a few more looks, with the prefill over.
        await asyncio.sleep(4 * 30.0 * SCALE)
        watcher.cancel()
    assert prefill > 2 * 60.0 * SCALE, prefill  # it did outlast the hang window
    assert not restarted(), [o.action.reason for o in ctl.view.recent]
    changed = mutations(healthy_world, "spark-a", since)
    assert not any(r.command.startswith("vllm serve") for r in changed)
    assert not any("hung under load" in r for r in reasons), reasons
    withheld = [r for r in reasons if "not restarting:" in r]
    assert withheld, reasons
    assert "the KV cache grew since the last look" in withheld[0]
    assert "a long prefill" in withheld[0]
    # The probes that waited behind it were busy, not failures.
    plan = ctl.view.plan
    assert plan is not None and plan.phase == "healthy", plan.reason

"""Load is not failure, output faults are not engine faults: against the simulated world, whose
vLLM server keeps other clients' requests decoding (`answer-style busy`) or ends its turns with
everything in `reasoning` (`answer-style no_answer`). sparkd reports each as `degraded` with its
cause, exports `sparkd_model_degraded{cause}`, and restarts nothing, for more probes than would
once have restarted the model twice over."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from sparkd.model.plan import Plan
from sparkd.runtime.controller import Controller
from sparkd.runtime.metrics import Metrics
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.daemon import controller, converge

# Long enough for an answer here (tens of milliseconds), far shorter than a busy one.
PROBE_TIMEOUT = 0.5


def degraded(ctl: Controller, cause: str) -> float | None:
    metrics = Metrics(lambda: [ctl])
    labels = {"cluster": ctl.cluster.name, "cause": cause}
    return metrics.registry.get_sample_value("sparkd_model_degraded", labels)


async def cycles_until(ctl: Controller, done: Callable[[list[Plan]], bool]) -> list[Plan]:
    plans: list[Plan] = []
    for _ in range(200):
        plans.append(await ctl.cycle())
        if done(plans):
            return plans
        await asyncio.sleep(0.1)
    raise AssertionError(f"never done: {plans[-1].reason}")


def restarted(ctl: Controller) -> list[str]:
    return [o.action.reason for o in ctl.view.recent if o.action.kind == "restart_model"]


async def test_peak_load_is_overloaded_never_restarted(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(
        healthy_world, pool, tmp_path / "state", cluster={"probe": {"timeout": PROBE_TIMEOUT}}
    )
    await converge(ctl)
    await healthy_world.fault("answer-style", "spark-a", "busy")
    twice = 2 * ctl.cluster.policy.failure_threshold + 1
    plans = await cycles_until(
        ctl, lambda _: ctl.memory.busy_streak >= twice or bool(restarted(ctl))
    )
    assert restarted(ctl) == []
    assert "degraded: overloaded" in plans[-1].reason, plans[-1].reason
    assert plans[-1].phase == "degraded"
    assert ctl.memory.consecutive_failures == 0
    assert degraded(ctl, "overloaded") == 1 and degraded(ctl, "output_fault") == 0
    # The peak passes: healthy again, nothing was ever restarted.
    await healthy_world.fault("heal", "spark-a")
    await cycles_until(ctl, lambda p: p[-1].phase == "healthy")
    assert restarted(ctl) == [] and degraded(ctl, "overloaded") == 0


async def test_reasoning_only_stop_is_an_output_fault_never_restarted(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(healthy_world, pool, tmp_path / "state")
    await converge(ctl)
    assert ctl.cluster.probe.temperature == 0
    await healthy_world.fault("answer-style", "spark-a", "no_answer")
    twice = 2 * ctl.cluster.policy.failure_threshold + 1

    seen: set[float] = set()

    def done(_: list[Plan]) -> bool:
        last = ctl.memory.last_probe
        if last is not None and last.outcome == "no_answer":
            seen.add(last.at)
        return len(seen) >= twice or bool(restarted(ctl))

    plans = await cycles_until(ctl, done)
    assert restarted(ctl) == [], restarted(ctl)
    assert "at temperature 0 a restart returns the same turn" in plans[-1].reason
    assert ctl.memory.consecutive_failures == 0
    last = ctl.memory.last_probe
    assert last is not None and last.outcome == "no_answer"
    assert degraded(ctl, "output_fault") == 1


async def test_streamed_answer_after_a_stray_think_close_stays_healthy(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """Streamed, vLLM 0.32's qwen3 parser leaves a turn whose `</think>` came in pieces all in
    `reasoning`; the answer after the closer is an answer."""
    ctl = controller(healthy_world, pool, tmp_path / "state", cluster={"probe": {"stream": True}})
    await converge(ctl)
    await healthy_world.fault("answer-style", "spark-a", "stray_think")
    seen: set[float] = set()

    def done(_: list[Plan]) -> bool:
        last = ctl.memory.last_probe
        if last is not None and last.outcome == "answer":
            seen.add(last.at)
        return len(seen) >= ctl.cluster.policy.failure_threshold + 1

    plans = await cycles_until(ctl, done)
    assert plans[-1].phase == "healthy", plans[-1].reason
    assert restarted(ctl) == [] and ctl.memory.consecutive_failures == 0

"""The soak with confounders (docs/decisions.md): situations whose evidence looks like a fault
and is not one, each ending by itself with the model serving its clients all along, mixed with
real faults, at the shipped settings' ratios (scaled time), with a client that sends long prompts
and bursts. Each seed runs twice on identical worlds: once with sparkd's controller in its own
loop, once with no controller at all. A test client (on the model's own network, not through
the ops box) asks the model every quarter second.

* Harmful actions: every action sparkd takes from a confounder's start until the world is
  healthy again after it. A confounder's world serves without anyone's help (the no-controller
  run shows it), so any action there is one taken while the world would have served anyway.
* Serving time: the share of the client's requests answered, with sparkd and without. sparkd
  must not serve less than no controller at all (a harmful restart shows there too), and the
  real faults (a crashed serve process, a killed worker) are where it serves more.

Both counts are printed; the harmful count must be 0. Marked `soak`: SPARKD_SOAK_COUNT seeds
(CI runs a small count)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sparkd.model.plan import ActionOutcome
from sparkd.runtime.controller import Controller
from sparkd.shell.ssh import SshPool
from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim.timing import FAST_FACTOR, Timing
from sparkd_sim.world import World
from tests.support import ratios
from tests.support.daemon import controller, converge, eventually, running
from tests.support.ratios import PREFILL_RATE, SCALE

pytestmark = pytest.mark.soak

COUNT = int(os.environ.get("SPARKD_SOAK_COUNT", "2"))
INCIDENTS = int(os.environ.get("SPARKD_SOAK_FAULTS", "4"))
LONG_PROMPT = 250_000


def with_power(world: World) -> dict[str, Any]:
    # The world's own PDU, so that a power cycle is possible and would show.
    pdu = [sys.executable, "-m", "sparkd_sim.power", "cycle", "{host}", "--dir"]
    return {
        **ratios.shipped_ratios(),
        "power": {
            "command": [*pdu, str(world.directory)],
            "timeout": 60.0 * FAST_FACTOR,
            "unreachable_for": 600.0 * SCALE,
        },
    }


@dataclass(frozen=True)
class Incident:
    """One thing that happens to the world: `start` it, wait `lasts` seconds, `end` it."""

    name: str
    confounder: bool
    start: Callable[[World], Awaitable[None]]
    lasts: float
    end: Callable[[World], Awaitable[None]] = field(default=lambda world: _nothing())


async def _nothing() -> None:
    return None


async def _style(world: World, style: str) -> None:
    await world.fault("answer-style", "spark-a", style)


async def _heal(world: World) -> None:
    for host in world.hosts:
        await world.fault("heal", host)


async def _long_prompt(world: World) -> None:
    world.hosts["spark-a"].behaviour.prefill_rate = PREFILL_RATE
    await world.fault("long-prompt", "spark-a", str(LONG_PROMPT))


async def _path_lost(world: World) -> None:
    for host in world.hosts:
        await world.fault("path-lost", host)


async def _crash(world: World) -> None:
    await world.fault("crash-model", "spark-a")


async def _kill_worker(world: World) -> None:
    await world.fault("kill-container", "spark-b", "sparkd-sparks-ray-worker")


# How long each lasts: past the hold its evidence would trip (failure_threshold probes, the
# hang window, power.unreachable_for), in the scaled time.
CONFOUNDERS = (
    # A long prompt's prefill: one request running, no token counted, the KV cache rising.
    Incident("long prompt", True, _long_prompt, 3 * 60.0 * SCALE),
    # Peak load: tokens flowing, requests queued, the probe slow or timing out.
    Incident("peak load", True, lambda w: _style(w, "busy"), 8 * 1.2, _heal),
    # A template fault: a deterministic reasoning-only answer, which a restart reproduces.
    Incident("reasoning-only stop", True, lambda w: _style(w, "no_answer"), 8 * 1.2, _heal),
    # vLLM's qwen3 parser leaving the answer in `reasoning` after a stray `</think>`.
    Incident("stray </think>", True, lambda w: _style(w, "stray_think"), 6 * 1.2, _heal),
    # The ops box's own path to every host is down: every host silent at once, no omen.
    Incident("ops box cut off", True, _path_lost, 1.5 * 600.0 * SCALE, _heal),
)
FAULTS = (
    Incident("serve process crashed", False, _crash, 0.0),
    Incident("worker container killed", False, _kill_worker, 0.0),
)


@dataclass
class Client:
    """Asks the model every quarter second, from the model's own network."""

    world: World
    asked: int = 0
    answered: int = 0

    def target(self) -> tuple[str, str, dict[str, str]] | None:
        """The model's URL, its served name and the headers its API key needs (as a client
        configured for it has them); None while no model serves."""
        try:
            serve = self.world._serve_on("spark-a")
        except ValueError:
            return None
        server = getattr(serve.server, "server", None)
        if server is None or not server.port:
            return None
        key = server._api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return f"http://{server._host}:{server.port}", server._model_id, headers

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                self.asked += 1
                target = self.target()
                if target is not None:
                    url, model, headers = target
                    body = {
                        "model": model,
                        "messages": [{"role": "user", "content": "Say hello."}],
                        "max_tokens": 50,
                    }
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        async with session.post(
                            f"{url}/v1/chat/completions", json=body, headers=headers
                        ) as r:
                            if r.status == 200 and (await r.json()).get("choices"):
                                self.answered += 1
                await asyncio.sleep(0.25)

    @property
    def share(self) -> float:
        return self.answered / self.asked if self.asked else 0.0


@contextlib.asynccontextmanager
async def world_for(tmp_path: Path, name: str) -> AsyncIterator[World]:
    async with World(
        tmp_path / name, scenario="healthy", timing=Timing.fast(), spec_labels=sparkd_spec_labels
    ) as world:
        yield world


@contextlib.asynccontextmanager
async def asking(world: World) -> AsyncIterator[Client]:
    client = Client(world)
    task = asyncio.create_task(client.run())
    try:
        yield client
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def healthy_again(ctl: Controller | None, world: World, within: float) -> None:
    """Until the world serves again: sparkd's plan says healthy, from a look that began after
    the incident ended (a plan made before its evidence showed is no news), or with no
    controller the model answers the client."""
    if ctl is not None:
        ended = ctl.clock.now()

        def healthy() -> bool:
            plan, seen = ctl.view.plan, ctl.view.snapshot
            return (
                plan is not None
                and seen is not None
                and seen.observed_at >= ended
                and plan.phase == "healthy"
            )

        await eventually(healthy, within=within)
        return
    await asyncio.sleep(1.0)


async def play(
    world: World, schedule: list[Incident], ctl: Controller | None
) -> tuple[list[str], float]:
    """The schedule on the world; the actions taken in confounders, and the serving share."""
    harmful: list[str] = []
    taken: list[ActionOutcome] = []
    if ctl is not None:
        ctl.on_action = lambda _, outcome: taken.append(outcome)
    async with asking(world) as client:
        for incident in schedule:
            before = len(taken)
            await incident.start(world)
            await asyncio.sleep(incident.lasts)
            await incident.end(world)
            await healthy_again(ctl, world, within=120)
            if incident.confounder:
                harmful.extend(
                    f"{incident.name}: {o.action.kind} on {o.action.host}: {o.action.reason}"
                    for o in taken[before:]
                )
            await asyncio.sleep(2.0)
        return harmful, client.share


@pytest.mark.parametrize("seed", range(COUNT))
async def test_no_action_while_the_world_would_have_served(
    seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(seed)
    schedule = rng.sample(CONFOUNDERS, min(INCIDENTS, len(CONFOUNDERS)))
    schedule.insert(rng.randrange(len(schedule) + 1), rng.choice(FAULTS))
    pool = SshPool(reconnect_initial=0.05, reconnect_max=0.2)
    try:
        async with world_for(tmp_path, "with") as world:
            ctl = controller(world, pool, tmp_path / "state", cluster=with_power(world))
            await converge(ctl)
            async with running(ctl):
                # Past the just-ready engine's grace, as a cluster that has served a while.
                await asyncio.sleep(3 * 70.0 * SCALE)
                started = time.monotonic()
                harmful, with_sparkd = await play(world, schedule, ctl)
                took = time.monotonic() - started
            power_cycles = len(world.power_log)
    finally:
        await pool.close()
    async with world_for(tmp_path, "without") as world:
        await asyncio.sleep(3 * 70.0 * SCALE)
        _, without = await play(world, schedule, None)
    with capsys.disabled():
        print(
            f"\nconfounder soak seed {seed} ({', '.join(i.name for i in schedule)}; {took:.0f} s):"
            f" {len(harmful)} harmful actions, {power_cycles} power cycles; served "
            f"{with_sparkd:.1%} with sparkd, {without:.1%} with no controller"
        )
        for line in harmful:
            print(f"  {line}")
    assert harmful == [] and power_cycles == 0, harmful
    # Sampled every quarter second on two runs: a few samples' difference is noise.
    assert with_sparkd >= without - 0.05, (with_sparkd, without)

"""A cluster serving with a last-good spec, and the change a config reload brings it: where every
end-to-end rollout starts."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkd.model.memory import GoodSpec
from sparkd.runtime.controller import Controller
from sparkd.runtime.daemon import Daemon
from sparkd.runtime.state import StateDir
from sparkd.shell.ssh import SshPool
from sparkd.web.serve import serve_api
from sparkd_sim.world import World
from tests.support.daemon import FAST_EXECUTOR, controller, converge, mutations, world_settings
from tests.support.http import token_file


def serves(world: World, since: float) -> list[str]:
    """The `vllm serve` command lines run on the head since `since`."""
    return [r.command for r in mutations(world, "spark-a", since) if "vllm serve" in r.command]


async def last_good(ctl: Controller) -> None:
    """Cycle until the serving spec is last-good (its acceptance probes answered)."""
    for _ in range(100):
        await ctl.cycle()
        if ctl.memory.last_good is not None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("no last-good spec recorded")


@dataclass(frozen=True)
class Serving:
    """A controller converged on the world's spec, that spec recorded as last-good."""

    world: World
    ctl: Controller
    good: GoodSpec
    state: Path

    def args(self, *more: str) -> tuple[str, ...]:
        """The serving spec's `extra_args` with `more` after them."""
        return (*self.ctl.cluster.model.extra_args, *more)

    def reload(self, **model: Any) -> tuple[Controller, float]:
        """The controller a config reload makes (the model section changed by `model`, the memory
        on disk) and the wall clock it was made at."""
        since = time.time()
        cluster = self.ctl.cluster
        spec = cluster.model_copy(update={"model": cluster.model.model_copy(update=model)})
        return Controller(
            spec, self.ctl.pool, StateDir(self.state), executor_timing=FAST_EXECUTOR
        ), since

    async def daemon(self, token: Path, **model: Any) -> tuple[Daemon, float]:
        """A daemon started on the changed spec (its control token written to `token`) and the
        wall clock it was started at."""
        token_file(token)
        since = time.time()
        settings = world_settings(self.world, self.state)
        cluster = settings.clusters[0]
        cluster = cluster.model_copy(update={"model": cluster.model.model_copy(update=model)})
        daemon = settings.daemon.model_copy(update={"control_token_file": token})
        settings = settings.model_copy(update={"daemon": daemon, "clusters": (cluster,)})
        started = Daemon(
            settings, self.world.config_path, executor_timing=FAST_EXECUTOR, api=serve_api
        )
        await started.start()
        return started, since


async def serving_with_last_good(world: World, pool: SshPool, state: Path) -> Serving:
    ctl = controller(world, pool, state)
    await converge(ctl)
    await last_good(ctl)
    assert ctl.memory.last_good is not None
    return Serving(world, ctl, ctl.memory.last_good, state)

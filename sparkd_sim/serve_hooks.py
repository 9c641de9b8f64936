"""What a `vllm serve` process gets from the world: the fault switches it obeys, the model
server it starts once loaded, and the GPUs a real Ray cluster holds for it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sparkd_sim.engine import HostEngine
from sparkd_sim.state import Container


class ModelServer(Protocol):
    async def start(self) -> int: ...
    async def stop(self) -> None: ...
    def send_prompt(self, prompt_tokens: int) -> None:
        """A client's request with a prompt this long (the `long-prompt` fault)."""
        ...


ServerFactory = Callable[[str, str, int, str | None, int], ModelServer]
"""(model id, listen address, port, api key, max model len) -> server."""


@dataclass
class Held:
    """GPUs a placement group holds: the Ray containers its bundles landed in, and what ends
    the hold (a node holding a bundle died: vLLM's engine dies with it)."""

    nodes: list[tuple[HostEngine, Container]]
    lost: asyncio.Future[str]


class Placement(Protocol):
    """The GPUs of a real Ray cluster (`World(ray="real")`) instead of `RayCluster`'s count."""

    async def acquire(self, gpus: int, say: Callable[[str], None]) -> Held | list[str]:
        """The hold, or the lines vLLM prints before it exits for want of it; `say` takes the
        lines it logs while it waits."""
        ...

    def release(self) -> None: ...


@dataclass
class ServeFaults:
    """Per-host switches the world's fault API flips."""

    slow_load: bool = False
    oom_capture: bool = False
    # One-shot: the next load stops making progress at 40% and never finishes (a wedged read).
    stall_load: bool = False
    # One-shot: the next load sticks at 41% while its log keeps getting warnings/heartbeats.
    chatty_stall: bool = False
    # Loads print the harmless lines real vLLM and Ray print (ulimit warning, the autoscaler's
    # `Error: No available node types...` notice, a Python warning naming a RuntimeError).
    noisy_log: bool = False
    # One-shot: the next CUDA-graph capture stops half-way while its ranks spin in an NCCL
    # wait: no new line, every engine process busy at 100 % CPU, for ever.
    hang_capture: bool = False
    # A test's pace for the loader: each shard after the first also waits for a permit, so a
    # test reads the weights at several points however slowly its own looks run (a loaded
    # machine) instead of racing the load's wall-clock duration. Real loads have no such gate;
    # only their pace relative to the looks changes, which is what this holds fixed.
    load_gate: asyncio.Semaphore | None = None
    # Model path -> the shard its index names that is not on disk: every load of that model
    # fails before its first shard, as long as the file is missing.
    missing_weights: dict[str, str] = field(default_factory=dict)
    # Model path -> a shard that goes from disk once the next serve of that model has started
    # (a clean-up racing a cutover that was prepared): that load fails for it.
    vanish_weights: dict[str, str] = field(default_factory=dict)

"""Durations that drive the simulated world.

Tests use `Timing.fast()` (everything in tens of milliseconds), demos `Timing.realistic()` (what
real Ray 2.60 and vLLM on two Sparks measure). `scaled()` stretches or shrinks every duration at
once, so a scenario keeps its proportions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    head_start: float
    """`ray start --head` until the head node is registered (measured ~5 s)."""
    worker_join: float
    """`ray start --address=...` until the worker node is registered (measured ~6 s)."""
    join_timeout: float
    """A worker with no head to join gives up (container exits) after this."""
    heartbeat_timeout: float
    """A dead node keeps counting in `ray status` for this long (measured ~19-20 s)."""
    gcs_reconnect_timeout: float
    """Workers of a head that went away exit after this (Ray's GCS reconnect timeout)."""
    model_init: float
    """`vllm serve` start until weight loading begins (Ray placement, NCCL init)."""
    model_load: float
    """Loading the checkpoint shards."""
    graph_capture: float
    """CUDA graph capture after the weights are in."""
    reboot_downtime: float
    """SSH refuses connections this long after a reboot."""
    slow_load_factor: float
    """Multiplier applied to loading under the `slow-load` fault."""

    @classmethod
    def fast(cls) -> Timing:
        return cls(
            head_start=0.05,
            worker_join=0.06,
            join_timeout=0.3,
            heartbeat_timeout=0.2,
            gcs_reconnect_timeout=0.6,
            model_init=0.03,
            model_load=0.15,
            graph_capture=0.05,
            reboot_downtime=0.2,
            slow_load_factor=5.0,
        )

    @classmethod
    def realistic(cls) -> Timing:
        return cls(
            head_start=5.0,
            worker_join=6.0,
            join_timeout=60.0,
            heartbeat_timeout=20.0,
            gcs_reconnect_timeout=60.0,
            model_init=30.0,
            model_load=600.0,
            graph_capture=120.0,
            reboot_downtime=90.0,
            slow_load_factor=3.0,
        )

    def scaled(self, factor: float) -> Timing:
        """Every duration multiplied by `factor` (factors stay as they are)."""
        if factor <= 0:
            raise ValueError(f"scale factor must be positive, got {factor}")
        changes = {
            f.name: getattr(self, f.name) * factor
            for f in dataclasses.fields(self)
            if f.name != "slow_load_factor"
        }
        return dataclasses.replace(self, **changes)

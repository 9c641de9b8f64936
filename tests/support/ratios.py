"""The shipped defaults' ratios in the tests' scaled time: interval 30 s, probe_interval 60 s,
probe.timeout 30 s, hang_window 60 s, hang_ready_grace 70 s, prefill_rate 1000 tokens/s, on the
tests' probe_interval of 1.2 s. A test that judges load, hangs or prefill at the defaults takes
its cluster changes from here, so that they keep the real ratios to one another."""

from __future__ import annotations

from typing import Any

SCALE = 1.2 / 60.0
# Two Sparks prefill about 2000 tokens/s (vllm#41834): a 250k-token prompt takes two minutes
# there, two hang windows.
PREFILL_RATE = 2000.0 / SCALE


def shipped_ratios() -> dict[str, Any]:
    """`controller(..., cluster=shipped_ratios())`: the defaults above, scaled."""
    return {
        "interval": 30.0 * SCALE,
        "probe": {"timeout": 30.0 * SCALE},
        "policy": {
            "hang_window": 60.0 * SCALE,
            "hang_ready_grace": 70.0 * SCALE,
            "prefill_rate": 1000.0 / SCALE,
        },
    }

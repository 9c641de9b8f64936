"""vLLM's CPU platform with a Ray device key, for the real-executor tier only.

vLLM 0.32.0's `CpuPlatform` leaves `ray_device_key` empty (`vllm/platforms/interface.py`), so
`initialize_ray_cluster` (`vllm/v1/executor/ray_utils.py`) refuses the Ray executor on CPU:
`ValueError: current platform cpu does not support ray.` This plugin (entry point group
`vllm.platform_plugins`, read by `vllm/platforms/__init__.py`
`resolve_current_platform_cls_qualname`, where an out-of-tree plugin wins over the built-in CPU
one) gives it the Ray resource named by `SPARKD_VLLM_RAY_DEVICE_KEY`, and does nothing when that
variable is unset: the one-process tier in the same virtualenv sees vLLM unchanged.
"""

from __future__ import annotations

import os

KEY_ENV = "SPARKD_VLLM_RAY_DEVICE_KEY"


def register() -> str | None:
    if not os.environ.get(KEY_ENV):
        return None
    return "sparkd_vllm_ray_cpu.platform.RayCpuPlatform"

"""The CPU platform, with the Ray resource its workers are placed on (see the package)."""

from __future__ import annotations

import os

from vllm.platforms.cpu import CpuPlatform

from sparkd_vllm_ray_cpu import KEY_ENV


class RayCpuPlatform(CpuPlatform):
    # The only change: the resource each `RayWorkerProc` actor and placement-group bundle asks
    # for (`ray start --resources` or `--num-gpus` gives each node one).
    ray_device_key: str = os.environ.get(KEY_ENV, "")

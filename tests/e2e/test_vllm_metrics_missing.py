"""`--disable-log-stats` against the simulated world: the model serves, and sparkd says once, in
/status and a gauge, that vLLM's own metrics are gone and why hang detection reads unknown."""

from __future__ import annotations

from pathlib import Path

from sparkd.runtime.daemon import Daemon
from sparkd.web.serve import serve_api
from sparkd_sim.world import World
from tests.e2e.test_metrics import consistent
from tests.support.daemon import FAST_EXECUTOR, eventually, world_settings
from tests.support.http import value


async def test_disabled_log_stats_is_said_in_status_and_a_gauge(
    seed_world: World, tmp_path: Path
) -> None:
    settings = world_settings(
        seed_world, tmp_path / "state", model={"extra_args": ("--disable-log-stats",)}
    )
    daemon = Daemon(settings, seed_world.config_path, executor_timing=FAST_EXECUTOR, api=serve_api)
    await daemon.start()
    try:

        async def healthy() -> bool:
            status, _ = await consistent(daemon.url)
            return status["phase"] == "healthy" and status["probes"]["window"] >= 1

        await eventually(healthy, within=40)
        status, samples = await consistent(daemon.url)
        assert "--disable-log-stats" in status["vllm_metrics_missing"]
        assert "unknown" in status["vllm_metrics_missing"]
        endpoint = status["snapshot"]["endpoint"]
        assert endpoint["vllm_metrics"] is False and endpoint["requests_running"] is None
        assert value(samples, "sparkd_model_vllm_metrics_missing", cluster="sparks") == 1
        # Said once, not in every cycle's reason.
        assert "disable-log-stats" not in status["reason"]
    finally:
        await daemon.stop()


async def test_with_log_stats_nothing_is_missing(seed_world: World, tmp_path: Path) -> None:
    settings = world_settings(seed_world, tmp_path / "state")
    daemon = Daemon(settings, seed_world.config_path, executor_timing=FAST_EXECUTOR, api=serve_api)
    await daemon.start()
    try:

        async def healthy() -> bool:
            status, _ = await consistent(daemon.url)
            return status["phase"] == "healthy" and status["probes"]["window"] >= 1

        await eventually(healthy, within=40)
        status, samples = await consistent(daemon.url)
        assert status["vllm_metrics_missing"] is None
        assert status["snapshot"]["endpoint"]["vllm_metrics"] is True
        assert value(samples, "sparkd_model_vllm_metrics_missing", cluster="sparks") == 0
    finally:
        await daemon.stop()

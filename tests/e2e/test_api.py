"""The HTTP API of a running daemon against the simulated world."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sparkd.runtime.daemon import Daemon
from sparkd.web.serve import serve_api
from sparkd_sim.world import World
from tests.support.daemon import FAST_EXECUTOR, eventually, mutations, world_settings
from tests.support.http import TOKEN, get, post


async def started(world: World, state: Path, token_file: Path | None) -> Daemon:
    settings = world_settings(world, state)
    daemon_settings = settings.daemon.model_copy(update={"control_token_file": token_file})
    settings = settings.model_copy(update={"daemon": daemon_settings})
    daemon = Daemon(settings, world.config_path, executor_timing=FAST_EXECUTOR, api=serve_api)
    await daemon.start()
    return daemon


@pytest.fixture
async def daemon(seed_world: World, tmp_path: Path) -> AsyncIterator[Daemon]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    d = await started(seed_world, tmp_path / "state", token)
    yield d
    await d.stop()


async def test_status_healthz_events_through_recovery(daemon: Daemon) -> None:
    async def healthy() -> bool:
        _, body = await get(f"{daemon.url}/status")
        return body["clusters"][0]["phase"] == "healthy"

    await eventually(healthy, within=30)
    _, body = await get(f"{daemon.url}/status")
    cluster = body["clusters"][0]
    assert cluster["converged"] is True
    assert cluster["snapshot"]["snapshot_version"] == 1
    assert cluster["snapshot"]["probe"]["verdict"]["outcome"] == "reasoning_only"
    assert [a["kind"] for a in reversed(cluster["recent_actions"])][:8] == (
        ["stop_unit"] * 4 + ["remove_container"] * 2 + ["start_ray_head", "start_ray_worker"]
    )
    assert all(a["result"] == "ok" for a in cluster["recent_actions"])
    code, health = await get(f"{daemon.url}/healthz")
    assert (code, health["status"]) == (200, "ok")
    code, events = await get(f"{daemon.url}/events?cluster=sparks")
    kinds = [e["kind"] for e in events["events"]]
    assert "remediation" in kinds and "phase" in kinds
    assert events["events"][0]["at"] >= events["events"][-1]["at"]
    _, none = await get(f"{daemon.url}/events?cluster=other")
    assert none["events"] == []


async def test_control_auth(daemon: Daemon) -> None:
    base = f"{daemon.url}/clusters"
    assert (await post(f"{base}/sparks/pause", {"reason": "x"}, token=None))[0] == 401
    assert (await post(f"{base}/sparks/pause", {"reason": "x"}, token="wrong"))[0] == 401
    assert (await post(f"{base}/nope/pause", {"reason": "x"}))[0] == 404
    assert (await post(f"{base}/sparks/pause", {}))[0] == 400
    code, text = await post(
        f"{base}/sparks/pause", {"reason": "maint", "by": "bob", "for_seconds": 600}
    )
    assert code == 200, text
    paused = json.loads(text)["paused"]
    assert paused["reason"] == "maint" and paused["by"] == "bob" and paused["until"] is not None
    assert (await post(f"{base}/sparks/reconcile"))[0] == 200
    assert (await post(f"{base}/sparks/resume"))[0] == 200


async def test_pause_stops_all_changes(seed_world: World, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    daemon = await started(seed_world, tmp_path / "state", token)
    try:
        code, _ = await post(f"{daemon.url}/clusters/sparks/pause", {"reason": "hands off"})
        assert code == 200
        controller = daemon.controllers["sparks"]
        # Three looks, however slow (a loaded box took over 3 s a look); what is checked is
        # that none of them changed anything.
        await eventually(lambda: controller.view.cycles >= 3, within=30)
        assert controller.view.plan is not None and controller.view.plan.phase == "paused"
        # An action may have started before the pause landed; nothing after it.
        assert len(mutations(seed_world)) <= 2
    finally:
        await daemon.stop()


async def test_control_disabled_without_token(seed_world: World, tmp_path: Path) -> None:
    daemon = await started(seed_world, tmp_path / "state", None)
    try:
        code, text = await post(f"{daemon.url}/clusters/sparks/pause", {"reason": "x"})
        assert code == 403
        assert "control_token_file" in text
    finally:
        await daemon.stop()

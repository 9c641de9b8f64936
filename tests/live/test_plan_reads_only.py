"""`sparkd plan` as a process against the simulated world changes nothing, the model's load
included: it sends a completion only when asked to (`--probe`), and never a mutating command."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import pytest
from aiohttp import web

from sparkd.shell.ssh import SshPool
from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim import routing
from sparkd_sim.vllm_server import SimVllmServer
from sparkd_sim.world import World
from tests.support.daemon import mutations
from tests.support.live import cluster_of, live_world, observe_until, serving
from tests.support.process import SPARKD


class CountingServer(SimVllmServer):
    """The simulated vLLM, noting every chat completion it is sent."""

    completions: ClassVar[list[bytes]] = []

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        CountingServer.completions.append(await request.read())
        return await super()._chat(request)


@pytest.fixture
async def counted_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: SshPool
) -> AsyncIterator[World]:
    monkeypatch.setattr(CountingServer, "completions", [])
    monkeypatch.setattr(routing, "SimVllmServer", CountingServer)
    async with live_world(tmp_path / "world", "healthy", spec_labels=sparkd_spec_labels) as world:
        cluster = cluster_of(world)
        await observe_until(cluster, pool, serving(cluster), probe_due=lambda _: False)
        yield world


async def sparkd(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *SPARKD, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_plan_sends_no_completion_and_changes_nothing(counted_world: World) -> None:
    before = len(counted_world.commands())
    since = time.time()
    code, out, err = await sparkd("plan", "--config", str(counted_world.config_path), "--json")
    assert code == 0, err
    [plan] = json.loads(out)
    assert plan["cluster"] == "sparks"
    assert CountingServer.completions == []
    assert mutations(counted_world, since=since) == []
    # It did observe: the fact scripts reached the hosts.
    assert len(counted_world.commands()) > before


async def test_plan_with_probe_sends_exactly_one_completion(counted_world: World) -> None:
    since = time.time()
    code, out, err = await sparkd(
        "plan", "--config", str(counted_world.config_path), "--json", "--probe"
    )
    assert code == 0, err
    [plan] = json.loads(out)
    assert len(CountingServer.completions) == 1
    sent = json.loads(CountingServer.completions[0])
    assert sent["messages"][0]["content"] == cluster_of(counted_world).probe.prompt
    assert mutations(counted_world, since=since) == []
    # The probe's verdict is what the plan judged: a healthy model, converged.
    assert (plan["phase"], plan["converged"]) == ("healthy", True)


async def test_plan_probe_cannot_replay_a_snapshot(counted_world: World, tmp_path: Path) -> None:
    saved = tmp_path / "snap.json"
    config = str(counted_world.config_path)
    code, _, err = await sparkd("plan", "--config", config, "--save-snapshot", str(saved))
    assert code == 0, err
    replay = ("--from-snapshot", str(saved), "--probe")
    code, _, err = await sparkd("plan", "--config", config, *replay)
    assert code == 64
    assert "--probe" in err
    assert CountingServer.completions == []

"""With `[ha]`, `rollout retry|back` are made only on the instance owning the cluster: they edit
that instance's memory alone, which another instance's owner would never hear."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from sparkd.core.spec import good_of
from sparkd.runtime.controller import Controller
from sparkd.runtime.daemon import Daemon
from sparkd.runtime.state import StateDir
from sparkd.shell.ssh import SshPool
from sparkd.web.app import make_app
from tests.toy import Toy

TOKEN = "t0ken-for-the-rollout-api"


@dataclass
class FakeOwnership:
    """Who owns the cluster, as sparkd.ha.ownership.Ownership answers it."""

    owner: bool
    other: str | None

    def may_act(self, cluster: str) -> bool:
        return self.owner

    def holder(self, cluster: str) -> str | None:
        return "ops-1" if self.owner else self.other


def changed_controller(tmp_path: Path) -> Controller:
    """A controller whose desired spec differs from the last-good one it remembers."""
    toy = Toy.healthy()
    good = good_of(toy.cluster, None, 1000.0)
    model = toy.cluster.model.model_copy(
        update={"extra_args": (*toy.cluster.model.extra_args, "--max-num-seqs", "8")}
    )
    desired = toy.cluster.model_copy(update={"model": model})
    controller = Controller(
        desired, cast(SshPool, None), StateDir(tmp_path / "state"), watch_events=False
    )
    controller.memory = controller.memory.evolve(last_good=good)
    return controller


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], Controller, Any]]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    controller = changed_controller(tmp_path)
    ha = FakeOwnership(owner=False, other="ops-2")
    daemon = SimpleNamespace(
        settings=SimpleNamespace(
            daemon=SimpleNamespace(control_token_file=token, listen_host="127.0.0.1")
        ),
        controllers={controller.cluster.name: controller},
        ha=ha,
        # Its memory from etcd is in (tests/unit/test_web_takeover.py has the moment before).
        memory_current=lambda cluster: True,
        metrics=SimpleNamespace(registry=CollectorRegistry()),
    )
    client: TestClient[Any, Any] = TestClient(
        TestServer(make_app(cast(Daemon, daemon)), host="127.0.0.1")
    )
    await client.start_server()
    try:
        yield client, controller, ha
    finally:
        await client.close()


async def post(client: TestClient[Any, Any], path: str) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with client.post(path, json={"by": "bob"}, headers=headers) as response:
        return response.status, await response.text()


async def test_a_standby_refuses_rollout_back_and_retry_naming_the_owner(
    api: tuple[TestClient[Any, Any], Controller, Any],
) -> None:
    client, controller, _ = api
    name = controller.cluster.name
    before = controller.memory
    for verb in ("back", "retry"):
        status, text = await post(client, f"/clusters/{name}/rollout/{verb}")
        assert status == 409
        assert f"not the owner of {name} (owner: ops-2)" in text
    assert controller.memory == before  # nothing held here to relaunch at a later takeover


async def test_the_owner_takes_rollout_back(
    api: tuple[TestClient[Any, Any], Controller, Any],
) -> None:
    client, controller, ha = api
    ha.owner = True
    status, _ = await post(client, f"/clusters/{controller.cluster.name}/rollout/back")
    assert status == 200
    held = controller.memory.rollout
    assert held is not None and held.rolled_back == "asked by bob"

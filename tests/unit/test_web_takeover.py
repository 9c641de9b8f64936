"""A rollout retry or back asked of an instance that has just taken a cluster over waits for the
memory from etcd: made on the local memory, the adoption at the next look would drop it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from sparkd.web.control import _owned
from sparkd.web.protocol import DAEMON


def request(*, owner: bool, current: bool) -> web.Request:
    ha = SimpleNamespace(may_act=lambda name: owner, holder=lambda name: "ops-b")
    daemon = SimpleNamespace(ha=ha, memory_current=lambda name: current)
    app = web.Application()
    app[DAEMON] = daemon  # type: ignore[misc]
    return make_mocked_request("POST", "/clusters/sparks/rollout/retry", app=app)


CONTROLLER = SimpleNamespace(cluster=SimpleNamespace(name="sparks"))


def test_the_owner_with_its_memory_in_takes_it() -> None:
    _owned(request(owner=True, current=True), CONTROLLER)  # type: ignore[arg-type]


def test_a_standby_refers_to_the_owner() -> None:
    with pytest.raises(web.HTTPConflict) as refused:
        _owned(request(owner=False, current=False), CONTROLLER)  # type: ignore[arg-type]
    assert "ops-b" in (refused.value.text or "")


def test_a_new_owner_before_its_memory_from_etcd_asks_to_come_again() -> None:
    with pytest.raises(web.HTTPServiceUnavailable) as refused:
        _owned(request(owner=True, current=False), CONTROLLER)  # type: ignore[arg-type]
    assert refused.value.headers["Retry-After"] == "1"

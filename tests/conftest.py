"""Fixtures every tier may take: the simulated world behind either SSH server (tests/support);
how the suite spreads over pytest-xdist's workers."""

import os
from typing import Any

import pytest

from tests.core import is_core
from tests.support import properties as properties
from tests.support.worlds import healthy as healthy
from tests.support.worlds import healthy_world as healthy_world
from tests.support.worlds import pool as pool
from tests.support.worlds import seed_world as seed_world
from tests.support.worlds import ssh_server as ssh_server
from tests.support.worlds import world_address as world_address

# Under pytest-xdist (`make test` runs two workers), each module runs whole on one worker, as
# `--dist loadfile` would. The tiers that use the machine as a whole share one group: real Ray and
# real Docker start machine-wide daemons and namespaces, real vLLM's loads want every core they
# can get, and the etcd tier runs several `sparkd run` processes and etcd members on TTLs of
# 3 s (beside it, the real-vLLM tier's probes missed their timeouts); so do the real-sshd
# tests, which share one login account. The scheduler sees only node ids, so the groups are
# read from them: the tier's directory, or the `openssh` parameter of `@both_servers`
# (tests/support/worlds.py).
_MACHINE_TIERS = (
    "tests/realvllm/",
    "tests/realray/",
    "tests/realexec/",
    "tests/realdocker/",
    "tests/etcd/",
)
# Longest first, so the run does not end on one worker alone with the slowest group.
_ORDER = ("machine", "tests/e2e/", "sshd")


def group_of(nodeid: str) -> str:
    """The worker group of a test: its module, or a tier that runs one test at a time."""
    path, _, rest = nodeid.partition("::")
    if path.startswith(_MACHINE_TIERS):
        return "machine"
    params = rest[rest.find("[") :] if "[" in rest else ""
    if path.startswith("tests/sshd/") or "openssh" in params:
        return "sshd"
    return path


def _rank(group: str) -> int:
    return next((i for i, head in enumerate(_ORDER) if group.startswith(head)), len(_ORDER))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    del config
    # `make check`'s selection (tests/core.py).
    for item in items:
        if is_core(item.nodeid):
            item.add_marker(pytest.mark.core)
    # Workers take groups in the order they first appear (`--no-loadscope-reorder`); one process
    # keeps the suite's own order.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: _rank(group_of(item.nodeid)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    # xdist's own `loadgroup` marks tests by rewriting `item._nodeid`, which pytest 9's node ids
    # no longer read: every test went to whichever worker was free.
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return TierScheduling(config, log)

"""Fixtures every tier may take: the simulated world behind either SSH server (tests/support);
how the suite spreads over pytest-xdist's workers."""

import pytest

from tests.support.worlds import healthy as healthy
from tests.support.worlds import healthy_world as healthy_world
from tests.support.worlds import pool as pool
from tests.support.worlds import seed_world as seed_world
from tests.support.worlds import ssh_server as ssh_server
from tests.support.worlds import world_address as world_address

# Under pytest-xdist (`make test` runs two workers, `--dist loadgroup`), each module runs whole
# on one worker, as `--dist loadfile` would. The tiers that use the machine as a whole share one
# group: real Ray and real Docker start machine-wide daemons and namespaces, and real vLLM's
# loads want every core they can get; so do the real-sshd tests, which share one login account.
_MACHINE_TIERS = ("realvllm", "realray", "realdocker")
# Longest first, so the run does not end on one worker alone with the slowest group.
_ORDER = ("machine", "tests/etcd/", "tests/e2e/", "sshd")


def _group(item: pytest.Item) -> str:
    if any(item.get_closest_marker(tier) for tier in _MACHINE_TIERS):
        return "machine"
    if item.get_closest_marker("sshd"):
        return "sshd"
    return item.nodeid.split("::", 1)[0]


def _rank(group: str) -> int:
    return next((i for i, head in enumerate(_ORDER) if group.startswith(head)), len(_ORDER))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    del config
    groups = {item.nodeid: _group(item) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    items.sort(key=lambda item: _rank(groups[item.nodeid]))

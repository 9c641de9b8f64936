"""The simulated world a test runs against, behind either SSH server: the in-process asyncssh
server, or a real OpenSSH sshd per host (the `sshd` tier).

A test that must hold behind both takes `@both_servers`; every other test gets the asyncssh world.
The fixtures are registered for all tiers by tests/conftest.py; a tier picks its worlds' address
block by overriding `world_address`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import pytest

from sparkd.shell.ssh import SshPool
from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim.timing import Timing
from sparkd_sim.world import Scenario, World
from tests.support.live import Live, cluster_of, observe_until, serving
from tests.support.sshd import openssh_world

SshServer = Literal["asyncssh", "openssh"]

# The OpenSSH parameter carries the tier's marker, so `-m sshd` / `-m "not sshd"` select as the
# tiers always have.
SSH_SERVERS = (
    pytest.param("asyncssh", id="asyncssh"),
    pytest.param("openssh", id="openssh", marks=pytest.mark.sshd),
)
both_servers = pytest.mark.parametrize("ssh_server", SSH_SERVERS, indirect=True)


def world_on(
    server: SshServer,
    directory: Path,
    scenario: Scenario,
    first_address: str | None = None,
    **options: Any,
) -> World:
    """A world behind `server`; OpenSSH worlds take the sshd tier's own address block."""
    if server == "openssh":
        return openssh_world(directory, scenario, **options)
    options.setdefault("timing", Timing.fast())
    if first_address is not None:
        options["first_address"] = first_address
    return World(directory, scenario=scenario, **options)


@pytest.fixture
def ssh_server(request: pytest.FixtureRequest) -> SshServer:
    server: SshServer = getattr(request, "param", "asyncssh")
    return server


@pytest.fixture
def world_address() -> str | None:
    """The first host's address; None is the world's own default (127.0.0.2 up)."""
    return None


@pytest.fixture
async def seed_world(
    tmp_path: Path, ssh_server: SshServer, world_address: str | None
) -> AsyncIterator[World]:
    async with world_on(ssh_server, tmp_path / "world", "seed-morning", world_address) as world:
        yield world


@pytest.fixture
async def healthy_world(
    tmp_path: Path, ssh_server: SshServer, world_address: str | None
) -> AsyncIterator[World]:
    """The `healthy` scenario, stamped with sparkd's own spec hashes (no drift)."""
    async with world_on(
        ssh_server, tmp_path / "world", "healthy", world_address, spec_labels=sparkd_spec_labels
    ) as world:
        yield world


@pytest.fixture
async def pool() -> AsyncIterator[SshPool]:
    # Reconnect quickly: tests wait out faults in fractions of a second.
    ssh_pool = SshPool(reconnect_initial=0.05, reconnect_max=0.2)
    yield ssh_pool
    await ssh_pool.close()


@pytest.fixture
async def healthy(healthy_world: World, pool: SshPool) -> Live:
    """The healthy world and its cluster, once sparkd sees the model serving."""
    cluster = cluster_of(healthy_world)
    await observe_until(cluster, pool, serving(cluster), probe_due=lambda _: False)
    return Live(healthy_world, cluster)

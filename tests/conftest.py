"""Fixtures every tier may take: the simulated world behind either SSH server (tests/support)."""

from tests.support.worlds import healthy as healthy
from tests.support.worlds import healthy_world as healthy_world
from tests.support.worlds import pool as pool
from tests.support.worlds import seed_world as seed_world
from tests.support.worlds import ssh_server as ssh_server
from tests.support.worlds import world_address as world_address

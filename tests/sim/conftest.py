"""Fixtures for the simulated world: a world per test, real SSH clients to its hosts
(tests/support/sim.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest

from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.sim import connect


@pytest.fixture
def timing() -> Timing:
    """The world's durations; a test parametrises `timing` to run in a slower world."""
    return Timing.fast()


@pytest.fixture
async def world(tmp_path: Path, timing: Timing) -> AsyncIterator[World]:
    async with World(tmp_path / "world", scenario="seed-morning", timing=timing) as w:
        yield w


@pytest.fixture
async def head(world: World) -> AsyncIterator[asyncssh.SSHClientConnection]:
    async with await connect(world, "spark-a") as conn:
        yield conn


@pytest.fixture
async def worker(world: World) -> AsyncIterator[asyncssh.SSHClientConnection]:
    async with await connect(world, "spark-b") as conn:
        yield conn

"""sparkd's own read path against the simulated world: this tier's worlds take their own
address block (tests/support/live.py)."""

from __future__ import annotations

import pytest

from tests.support.live import FIRST_ADDRESS


@pytest.fixture
def world_address() -> str | None:
    return FIRST_ADDRESS

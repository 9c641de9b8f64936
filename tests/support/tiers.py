"""The tiers that need something of the machine (real Docker, real Ray): skipped where it is
missing, except under CI, where a tier that cannot run is a failure, not a silent pass."""

from __future__ import annotations

import os

import pytest


def require_tier(tier: str, why: str | None) -> None:
    """Go on when `why` (what the machine lacks for `tier`) is None; else skip, or fail under CI."""
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the {tier} tier must run under CI: {why}")
    pytest.skip(f"{tier} tier skipped: {why}")

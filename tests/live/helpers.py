"""Shared pieces for tests that run sparkd's own code against the simulated world over SSH."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sparkd.core.spec import spec_labels
from sparkd.settings import load_settings


def sparkd_spec_labels(config: Path) -> Mapping[str, str]:
    """sparkd's own spec hashes for the world's generated config, for the `healthy` scenario."""
    return spec_labels(load_settings(config).clusters)

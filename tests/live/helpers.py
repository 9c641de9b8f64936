"""Shared pieces for tests that run sparkd's own code against the simulated world over SSH."""

from __future__ import annotations

# sparkd's own spec hashes for the world's generated config, for the `healthy` scenario: the
# same function `sparkd sim` hands the simulator.
from sparkd.commands import sparkd_spec_labels

__all__ = ["sparkd_spec_labels"]

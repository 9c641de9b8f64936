"""`sparkd sim` for the benchmarks: its `healthy` world carries sparkd's own spec hashes for the
config it prints (the simulator knows no sparkd; this, its caller, does)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from sparkd.core.spec import spec_labels
from sparkd.settings import load_settings
from sparkd.sim.cli import main


def sparkd_spec_labels(config: Path) -> Mapping[str, str]:
    return spec_labels(load_settings(config).clusters)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], spec_labels=sparkd_spec_labels))

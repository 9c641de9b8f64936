"""`sparkd sim` for the benchmarks: its `healthy` world carries sparkd's own spec hashes for the
config it prints (the simulator knows no sparkd; this, its caller, does)."""

from __future__ import annotations

import sys

from sparkd.commands import sparkd_spec_labels
from sparkd.sim.cli import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], spec_labels=sparkd_spec_labels))

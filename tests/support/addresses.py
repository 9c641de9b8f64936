"""Loopback address blocks of this test run's own.

A tier whose worlds listen on fixed ports (a real sshd's 22 and the model's 30000, real Ray's
dashboard) takes its addresses from 127.N.x.x, where N belongs to this run and, under
pytest-xdist, to this worker: two runs on one machine, or two workers of one run, never share a
block. N is drawn from 20-219, apart from 127.0.x.x, which the worlds' defaults use.
"""

from __future__ import annotations

import os

_FIRST = 20
_BLOCKS = 200


def _worker() -> tuple[int, int]:
    """(this worker's index, how many workers the run has); (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if name.startswith("gw") and name[2:].isdigit():
        return int(name[2:]) % count, count
    return 0, 1


def run_octet() -> int:
    """The second octet of this run's (and worker's) own address blocks."""
    index, count = _worker()
    # Workers are children of the run's main process: its PID names the run for all of them.
    run = os.getppid() if count > 1 else os.getpid()
    slots = max(_BLOCKS // count, 1)
    return _FIRST + (run % slots) * count + index

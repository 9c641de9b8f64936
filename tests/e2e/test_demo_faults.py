"""Every fault `sparkd demo --fault` offers ends in "recovered": a demo that stays wedged teaches a
new user that sparkd cannot recover what it names.

Each demo is its own process (the command a user types); they run a few at a time, since a
demo spends most of its wall time waiting on the simulated load and the scaled timers.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from sparkd_demo.demo import FAULTS

pytestmark = pytest.mark.slow

AT_ONCE = 6
# A demo's own bound: its scaled load (3 s), its fault's detection and the human fix it plays.
WITHIN = 300.0
# Above the demo's own default (9810), which a user's demo may hold meanwhile.
FIRST_PORT = 9811


async def _demo(directory: Path, fault: str, port: int, gate: asyncio.Semaphore) -> tuple[int, str]:
    async with gate:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sparkd.cli", "demo", "--exit-when-healthy",
            "--load-seconds", "3", "--dir", str(directory / fault), "--fault", fault,
            "--port", str(port),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), WITHIN)
        except TimeoutError:
            proc.kill()
            out, _ = await proc.communicate()
            return -9, out.decode(errors="replace")
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace")


async def test_every_demo_fault_recovers(tmp_path: Path) -> None:
    gate = asyncio.Semaphore(AT_ONCE)
    names = sorted(FAULTS)
    # A port each: demos started together would all find the default free, then race for it.
    results = await asyncio.gather(
        *(_demo(tmp_path, name, FIRST_PORT + i, gate) for i, name in enumerate(names))
    )
    failed = {
        name: out[-3000:]
        for name, (code, out) in zip(names, results, strict=True)
        if code != 0 or f"recovered from {name}" not in out
    }
    assert not failed, "\n\n".join(f"--- {name}\n{out}" for name, out in failed.items())

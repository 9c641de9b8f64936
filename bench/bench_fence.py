"""`fence`: what host fencing (HA) adds to each command that changes a host, on this machine: the
host-side time of a fenced no-op against the same command bare (the shell prefix: `flock`, the
record read, and on a new token its write, `sync` and rename; the forced-command wrapper's
Python compare-and-set), and how long a newer owner's sweep waits behind a command in flight."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import median, p95, table, write_result
from sparkd.settings import load_settings
from sparkd.shell import catalogue, forced
from sparkd.shell.catalogue.fence import FenceToken
from sparkd.shell.catalogue.remote import Remote

EXAMPLE = Path(__file__).resolve().parent.parent / "etc" / "sparkd" / "sparkd.toml"

NOOP = Remote("bench", "true", mutating=True)


def timed(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    spans = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        spans.append(time.perf_counter() - started)
    return spans


def rising(home: str, runs: int) -> list[float]:
    """Each run a newer token: the record is written, synced and renamed every time."""
    env = {"HOME": home, "PATH": os.environ["PATH"]}
    spans = []
    for n in range(runs):
        text = catalogue.fence.fenced(NOOP, FenceToken("bench", 1000 + n, 1, "ops-a"), 5).command
        started = time.perf_counter()
        subprocess.run(["sh", "-c", text], env=env, check=True, capture_output=True)
        spans.append(time.perf_counter() - started)
    return spans


def behind(home: str, hold: float, name: str) -> float:
    """Seconds a sweep with a newer token waits after a command holding the lock for `hold`
    began, minus `hold`: the fence's own share of the wait."""
    env = {"HOME": home, "PATH": os.environ["PATH"]}
    slow = Remote("bench", f"sleep {hold}", mutating=True)
    old = catalogue.fence.fenced(slow, FenceToken(name, 5, 1, "ops-a"), 10).command
    sweep = catalogue.fence.fence_sweep(FenceToken(name, 7, 1, "ops-b"), 10).command
    first = subprocess.Popen(["sh", "-c", old], env=env)
    lock = Path(home) / catalogue.fence.FENCE_DIR / f"{name}.lock"
    while not lock.exists() or subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 0:
        time.sleep(0.001)
    started = time.perf_counter()
    subprocess.run(["sh", "-c", sweep], env=env, check=True)
    waited = time.perf_counter() - started
    first.wait()
    return waited


async def main(quick: bool = False) -> None:
    runs = 20 if quick else 100
    with tempfile.TemporaryDirectory() as home:
        env = {"HOME": home, "PATH": os.environ["PATH"]}
        fence = FenceToken("bench", 9, 1, "ops-a")
        bare = timed(["sh", "-c", "true"], env, runs)
        same = timed(["sh", "-c", catalogue.fence.fenced(NOOP, fence, 5).command], env, runs)
        new = rising(home, runs)
        cluster = load_settings(EXAMPLE).clusters[0].model_copy(update={"name": "wrapped"})
        program = Path(home) / "wrapper"
        program.write_text(forced.wrapper(cluster, cluster.head, "key", fenced=True))
        sweep = catalogue.fence.fence_sweep(FenceToken("wrapped", 9, 1, "ops-a"), 5).command
        wrapped = timed(
            [sys.executable, str(program)], {**env, "SSH_ORIGINAL_COMMAND": sweep}, runs
        )
        waits = [behind(home, 1.0, f"wait{n}") - 1.0 for n in range(3 if quick else 5)]
    rows: list[list[Any]] = [
        ["`true` bare (sh -c)", median(bare) * 1000, p95(bare) * 1000],
        ["fenced, same token (read only)", median(same) * 1000, p95(same) * 1000],
        ["fenced, newer token (write, sync, rename)", median(new) * 1000, p95(new) * 1000],
        ["forced-command wrapper, fenced", median(wrapped) * 1000, p95(wrapped) * 1000],
        ["sweep behind a 1 s command: wait beyond it", median(waits) * 1000, max(waits) * 1000],
    ]
    text = table("host fencing, per command (ms)", ["case", "median", "p95/max"], rows)
    write_result(
        "fence",
        {
            "runs": runs,
            "ms": {
                "bare": median(bare) * 1000,
                "fenced_same_token": median(same) * 1000,
                "fenced_new_token": median(new) * 1000,
                "wrapper_fenced": median(wrapped) * 1000,
                "sweep_wait_beyond_holder": median(waits) * 1000,
            },
        },
        text,
    )

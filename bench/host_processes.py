"""Part of `host`: how many processes one fact script starts on a host, counted by `strace -f`
around the script on the simulated host (every fork, every exec), under `sh` (dash: what the
forced command runs) and `bash` (a bash login shell). The simulated tools are processes like
the real ones (one `bash` client each), so the counts are the real script's."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
from pathlib import Path

from sparkd.shell.ssh import HostConnection

TRACE = "trace=execve,clone,clone3,fork,vfork"
_FORK = re.compile(r"\b(?:clone3?|v?fork)\(.*\)\s*=\s*(\d+)")
_EXEC = re.compile(r"\bexecve\(.*\)\s*=\s*0\b")


def count(trace: str) -> tuple[int, int]:
    """(processes, execs) in an `strace -f` log: the traced shell plus each successful fork;
    the programs each exec started, the shell's own excepted."""
    forks = sum(1 for line in trace.splitlines() if (m := _FORK.search(line)) and int(m[1]) > 0)
    execs = sum(1 for line in trace.splitlines() if _EXEC.search(line))
    return 1 + forks, max(0, execs - 1)


def _take(path: Path) -> str:
    try:
        return path.read_text()
    finally:
        path.unlink(missing_ok=True)


async def processes(conn: HostConnection, script: str, shell: str, tag: str) -> tuple[int, int]:
    # The session may run as `nobody`: a file it can create, read back here.
    path = Path(f"/tmp/sparkd-bench-strace-{os.getpid()}-{tag}")
    await asyncio.to_thread(path.unlink, missing_ok=True)
    argv = ["strace", "-f", "-qq", "-e", TRACE, "-e", "signal=none", "-o", str(path)]
    await conn.run(shlex.join([*argv, shell, "-c", script]), timeout=60)
    return count(await asyncio.to_thread(_take, path))

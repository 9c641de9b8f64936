"""The real-Ray world's record of the PID namespaces it made (what `World.stop()` waits to see
empty, and what a test checks after it) names only its own: the kernel gives a freed namespace's
number to the next namespace anyone makes on the machine (fs/proc/generic.c, proc_alloc_inum:
the lowest free number), so a name alone would count a stranger's processes as ours. Needs root
and `unshare`, not Ray: the namespaces here run `sleep`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from sparkd_sim.real_ray import RealRay
from tests.support.tiers import require_tier

pytestmark = pytest.mark.realray

# Long enough for the kernel to free a namespace's number (after an RCU grace period) and give
# it to the next one made, which takes well under a second here.
REUSE_WINDOW = 3.0


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "PID namespaces need root (unshare --pid)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    return None


async def _unshare() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        "unshare", "--pid", "--fork", "--kill-child", "sleep", "300",
        stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def _pid_namespace(process: asyncio.subprocess.Process) -> str | None:
    """The PID namespace of the child `unshare --fork` made (None until it is there)."""
    try:
        [child] = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        return os.readlink(f"/proc/{child}/ns/pid")
    except (OSError, ValueError):
        return None


async def test_a_namespace_that_ended_keeps_its_name_from_strangers_until_close() -> None:
    require_tier("real-Ray", _why_not())
    ray = RealRay(lambda _: None)
    ours = await _unshare()
    strangers: list[asyncio.subprocess.Process] = []
    try:
        namespace = await ray._namespace("ours", ours)
        [name] = ray.pid_namespaces
        ray.kill("ours")
        await ours.wait()
        os.close(namespace.pidfd)
        # Namespaces made after ours ended, each kept alive so the next takes another number.
        theirs: list[str] = []
        deadline = time.monotonic() + REUSE_WINDOW
        while time.monotonic() < deadline and name not in theirs:
            strangers.append(stranger := await _unshare())
            while (made := _pid_namespace(stranger)) is None:
                assert stranger.returncode is None
                await asyncio.sleep(0.005)
            theirs.append(made)
            await asyncio.sleep(0.05)
        assert name not in theirs, "a stranger's namespace got the number of one still recorded"
        # Nothing of ours runs any more: close() finds nothing to wait for, strangers or not.
        await asyncio.wait_for(ray.close(), 5.0)
        assert ray.pid_namespaces == {}
        assert all(s.returncode is None for s in strangers)
    finally:
        for process in [ours, *strangers]:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()

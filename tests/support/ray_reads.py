"""The dashboard's reads run on this machine, as the head host runs them: the catalogue's
command text through `/bin/sh -c`, its stdin (Ray's token) fed as sparkd feeds it."""

from __future__ import annotations

import asyncio
import contextlib

from sparkd.shell import catalogue, ray_http


async def run_here(remote: catalogue.remote.Remote, seconds: float) -> ray_http.Ran:
    process = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        remote.command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        # A host's own python3 and timeout, not a version manager's shim ahead of them.
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    try:
        async with asyncio.timeout(seconds + catalogue.remote.KILL_GRACE):
            out, _ = await process.communicate((remote.stdin or "").encode())
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return ray_http.Ran(process.returncode, out.decode("utf-8", errors="replace"))

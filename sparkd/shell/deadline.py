"""A timeout that tells a late wake from a slow answer.

asyncio's timers run on the loop's clock, which goes on while the process does not run (SIGSTOP,
a frozen VM, a loop starved of CPU). Woken long past a deadline, the process finds both the
answer it was waiting for, which arrived meanwhile, and the timer, due since: the timer cancels
the wait before the answer is read, and a command that ended (a fence that refused it: exit 76)
passes for one that did not finish. `bounded` notices the late expiry and first lets what
already arrived be read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

# An expiry run this much past its time means the process was not running meanwhile.
LATE = 1.0
# How long what arrived meanwhile then has to be read, before the timeout stands.
GRACE = 1.0


@contextlib.asynccontextmanager
async def bounded(seconds: float) -> AsyncIterator[None]:
    """`asyncio.timeout(seconds)`, except that an expiry noticed more than LATE past its time
    moves once to GRACE from then."""
    loop = asyncio.get_running_loop()
    due = loop.time() + seconds
    async with asyncio.timeout(None) as timeout:

        def expire() -> None:
            now = loop.time()
            timeout.reschedule(now + GRACE if now - due > LATE else now)

        handle = loop.call_at(due, expire)
        try:
            yield
        finally:
            handle.cancel()

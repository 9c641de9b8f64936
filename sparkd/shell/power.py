"""The operator's power command, run on the ops box: never through a shell, never over SSH.

A wedged host answers nothing, so its power cycle goes through the switched PDU or smart plug
the operator scripted (`[clusters.power] command`). Its output comes back redacted and bounded,
for the action's outcome (logged, and kept in the event). At its timeout the command's whole
process group is killed: a PDU client stuck on its network must not outlive the action.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from sparkd.core import text
from sparkd.model.cluster import PowerSpec
from sparkd.shell.secrets import redact

OUTPUT_KEPT = 600
KILL_WAIT = 2.0


class PowerFailed(Exception):
    """The power command exited non-zero or could not be started."""


def power_argv(spec: PowerSpec, host: str) -> list[str]:
    """The command for `host`: every `{host}` is replaced inside its own element, so a host's
    name is never split or reparsed (it is a config `Name`: no spaces, no leading dash)."""
    if spec.command is None:
        raise PowerFailed("no [clusters.power] command configured")
    return [part.replace("{host}", host) for part in spec.command]


def _tail(output: bytes) -> str:
    said = " ".join(output.decode("utf-8", "replace").split())
    # What a PDU's client may echo of its own credentials, then the secrets sparkd holds.
    return redact(text.redact(said, credentials=True))[-OUTPUT_KEPT:]


async def run_power(argv: list[str], seconds: float) -> str:
    """Run `argv`; its redacted output when it exits 0. Raises PowerFailed on a non-zero exit,
    TimeoutError (after killing its process group) after `seconds`."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        raise PowerFailed(f"{argv[0]}: {exc.strerror or exc}") from None
    try:
        async with asyncio.timeout(seconds):
            output, _ = await proc.communicate()
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_WAIT):
                await proc.wait()
        raise
    said = _tail(output)
    if proc.returncode != 0:
        raise PowerFailed(f"{argv[0]} exited {proc.returncode}: {said or '(no output)'}")
    return said or "(no output)"

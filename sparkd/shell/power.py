"""The operator's power command, run on the ops box: never through a shell, never over SSH.

A wedged host answers nothing, so its power cycle goes through the switched PDU or smart plug
the operator scripted (`[clusters.power] command`). Its output comes back redacted, printable
and bounded, for the action's outcome (logged, and kept in the event): only its last
`OUTPUT_READ` bytes are ever held, however much it prints. At its timeout the command's whole
process group is killed, and every process below it that left the group (`setsid`) while its
parent still runs: a PDU client stuck on its network must not outlive the action. One that
double-forked away (its parent gone, adopted by init) is out of reach here; under the systemd
unit it is still in the daemon's cgroup, ended with the daemon.
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
# What is kept of the output while it runs: its tail, enough for OUTPUT_KEPT characters once
# whitespace is collapsed and secrets masked.
OUTPUT_READ = 64 * 1024
READ_CHUNK = 65536
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
    # Controls (a terminal's escapes) go before anything reads it.
    said = " ".join(text.printable(output.decode("utf-8", "replace"), lines=True).split())
    # What a PDU's client may echo of its own credentials, then the secrets sparkd holds.
    return redact(text.redact(said, credentials=True))[-OUTPUT_KEPT:]


async def _read_tail(stream: asyncio.StreamReader) -> bytes:
    """Everything the command prints is read (so it never blocks on a full pipe), and only the
    last OUTPUT_READ bytes kept."""
    kept = bytearray()
    while chunk := await stream.read(READ_CHUNK):
        kept += chunk
        if len(kept) > 2 * OUTPUT_READ:
            del kept[: len(kept) - OUTPUT_READ]
    return bytes(kept[-OUTPUT_READ:])


def _descendants(root: int) -> list[int]:
    """Every live process below `root` by parent links (/proc): those that called setsid are
    no longer in its process group, but still its children while their parents live."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so from the last ")".
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            parents[int(entry.name)] = int(fields[1])
    found: list[int] = []
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - set(found)
        found.extend(frontier)
    return found


def _kill_all(pid: int) -> None:
    below = _descendants(pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    for child in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


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
            assert proc.stdout is not None
            output = await _read_tail(proc.stdout)
            await proc.wait()
    except (TimeoutError, asyncio.CancelledError):
        _kill_all(proc.pid)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_WAIT):
                await proc.wait()
        raise
    said = _tail(output)
    if proc.returncode != 0:
        raise PowerFailed(f"{argv[0]} exited {proc.returncode}: {said or '(no output)'}")
    return said or "(no output)"

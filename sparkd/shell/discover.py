"""`sparkd init`: check each host's key against known_hosts, then read its deployment over SSH.

A host whose key known_hosts does not hold (or holds another key for) is refused before any
login, with the key's SHA256 fingerprint, as `sparkd known-hosts scan` prints it; the
connection itself verifies the key again (sparkd.shell.ssh).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkd.core.reading.discover import CONTAINER_NAME, HostReads, parse_inspect
from sparkd.model.spec import HostSpec, SshSpec
from sparkd.shell import known_hosts
from sparkd.shell.catalogue import discover as reads
from sparkd.shell.catalogue.remote import Remote
from sparkd.shell.ssh import HostConnection, SshFailure

READ_TIMEOUT = 20.0


class Unreadable(Exception):
    """A host init could not log in to or lost: its reads would say nothing true."""


@dataclass(frozen=True)
class Refused:
    address: str
    port: int
    reason: str


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


async def check_key(address: str, port: int, known_hosts_file: Path) -> Refused | None:
    found = await known_hosts.scan_host(address, port)
    if found.line is None:
        return Refused(address, port, f"unreachable: {found.error}")
    known = await asyncio.to_thread(_lines, known_hosts_file)
    status = known_hosts.compare(known, found)
    if status.startswith("matches"):
        return None
    keytype = found.line.split()[1]
    return Refused(
        address,
        port,
        f"host key {keytype} {found.fingerprint}: {status} ({known_hosts_file}); check it out "
        "of band (on the host: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub) and add it",
    )


def _failed(remote: Remote, failure: SshFailure, errors: list[str]) -> str | None:
    """A read that failed: said (with its last line of stderr), and what it printed anyway."""
    detail = failure.error.detail
    if failure.result is not None and failure.result.stderr.strip():
        detail += ": " + failure.result.stderr.strip().splitlines()[-1]
    errors.append(f"{remote.name}: {detail}")
    return failure.result.stdout if failure.result is not None else None


async def _run(conn: HostConnection, remote: Remote, errors: list[str]) -> str | None:
    try:
        return (await conn.run(remote.command, timeout=READ_TIMEOUT)).stdout
    except SshFailure as failure:
        return _failed(remote, failure, errors)


async def read_host(address: str, port: int, ssh: SshSpec) -> HostReads:
    # The connection wants a host spec; only its address and port are used to log in.
    spec = HostSpec(
        name="init", address=address, port=port, role="worker", data_ip="192.0.2.1",
        interface="init",
    )  # fmt: skip
    conn = HostConnection(spec, ssh)
    errors: list[str] = []
    seconds = READ_TIMEOUT - 2
    try:
        try:
            # The first read also logs in: a host that cannot be reached (or refuses the key)
            # is not read at all, rather than read as holding nothing.
            first = reads.container_names(seconds)
            listing: str | None = (await conn.run(first.command, timeout=READ_TIMEOUT)).stdout
        except SshFailure as failure:
            if failure.result is None:
                raise Unreadable(failure.error.detail) from None
            listing = _failed(first, failure, errors)
        names = [n for n in (listing or "").split() if CONTAINER_NAME.match(n)]
        inspect = None
        if names:
            inspect = await _run(conn, reads.inspect_containers(names, seconds), errors)
        containers = parse_inspect(inspect or "")
        images = sorted({c.image for c in containers if c.image})
        image_env = {}
        for image in images:
            text = await _run(conn, reads.image_env(image, seconds), [])
            if text is not None:
                image_env[image] = text
        top = {}
        for c in containers:
            if c.running:
                text = await _run(conn, reads.container_processes(c.name, seconds), errors)
                if text is not None:
                    top[c.name] = text
        gpu = await _run(conn, reads.gpu_processes(seconds), errors)
        units = await _run(conn, reads.unit_files(seconds), errors)
        addresses = await _run(conn, reads.addresses(seconds), errors)
    finally:
        await conn.close()
    return HostReads(
        address=address, port=port, inspect=inspect, image_env=image_env, top=top,
        gpu_apps=gpu, unit_files=units, addresses=addresses, errors=tuple(errors),
    )  # fmt: skip


async def read_hosts(
    targets: Sequence[tuple[str, int]], ssh: SshSpec
) -> tuple[list[HostReads], list[Refused]]:
    checked = await asyncio.gather(*(check_key(a, p, ssh.known_hosts_file) for a, p in targets))
    refused = [r for r in checked if r is not None]
    if refused:
        return [], refused
    results = await asyncio.gather(
        *(read_host(a, p, ssh) for a, p in targets), return_exceptions=True
    )
    found: list[HostReads] = []
    for (address, port), result in zip(targets, results, strict=True):
        if isinstance(result, Unreadable):
            refused.append(Refused(address, port, f"not read: {result}"))
        elif isinstance(result, BaseException):
            raise result
        else:
            found.append(result)
    return ([], refused) if refused else (found, [])

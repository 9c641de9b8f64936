"""`sparkd known-hosts scan`: each host's SSH host key, for checking out of band.

The scan connects to every configured host without trusting it (no authentication is
attempted), prints the key's SHA256 fingerprint as `ssh-keygen -lf` shows it, and says how it
compares with `known_hosts_file`. It writes that file only when asked (`--accept`), and says
what it added or replaced: nothing is ever trusted silently.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import asyncssh

from sparkd.settings import Settings

EX_UNAVAILABLE = 69
SCAN_TIMEOUT = 10.0


@dataclass(frozen=True)
class Scanned:
    pattern: str  # the known_hosts host field: `addr` or `[addr]:port`
    line: str | None  # `pattern keytype base64`, when the host answered
    fingerprint: str | None
    error: str | None = None


def host_pattern(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


async def scan_host(address: str, port: int) -> Scanned:
    pattern = host_pattern(address, port)
    try:
        async with asyncio.timeout(SCAN_TIMEOUT):
            key = await asyncssh.get_server_host_key(address, port, config=None)
    except TimeoutError:
        return Scanned(pattern, None, None, f"no answer within {SCAN_TIMEOUT:g}s")
    except (OSError, asyncssh.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return Scanned(pattern, None, None, reason)
    if key is None:
        return Scanned(pattern, None, None, "the server sent no host key")
    public = key.export_public_key("openssh").decode().split()
    line = f"{pattern} {public[0]} {public[1]}"
    return Scanned(pattern, line, key.get_fingerprint("sha256"))


def _entries(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _matches(entry: str, pattern: str) -> bool:
    fields = entry.split()
    if len(fields) < 3 or entry.lstrip().startswith("#"):
        return False
    return pattern in fields[0].split(",")


def compare(known: list[str], found: Scanned) -> str:
    if found.line is None:
        return "unreachable"
    _, keytype, blob = found.line.split()
    mine = [e.split() for e in known if _matches(e, found.pattern)]
    if any(f[1:3] == [keytype, blob] for f in mine):
        return "matches known_hosts"
    if mine:
        return "DIFFERS from known_hosts"
    return "not in known_hosts"


def accept(path: Path, found: list[Scanned]) -> list[str]:
    """known_hosts with each answering host's entries replaced by the scanned key; returns what
    was changed, one line each."""
    known = _entries(path)
    changes: list[str] = []
    for item in found:
        if item.line is None:
            continue
        status = compare(known, item)
        if status == "matches known_hosts":
            continue
        known = [e for e in known if not _matches(e, item.pattern)]
        known.append(item.line)
        verb = "replaced" if status.startswith("DIFFERS") else "added"
        changes.append(f"{verb} {item.pattern} {item.fingerprint}")
    if changes:
        _write(path, "".join(f"{e}\n" for e in known))
    return changes


def _write(path: Path, text: str) -> None:
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def scan(settings: Settings, do_accept: bool, out: TextIO, err: TextIO) -> int:
    by_file: dict[Path, list[tuple[str, str, int]]] = {}
    for cluster in settings.clusters:
        targets = by_file.setdefault(cluster.ssh.known_hosts_file, [])
        for host in cluster.hosts:
            targets.append((f"{cluster.name}/{host.name}", host.address, host.port))
    failed = False
    for path, targets in by_file.items():
        found = await asyncio.gather(*(scan_host(a, p) for _, a, p in targets))
        known = _entries(path)
        print(f"# {path}", file=out)
        for (name, _, _), item in zip(targets, found, strict=True):
            if item.line is None:
                failed = True
                print(f"{name} {item.pattern}: unreachable: {item.error}", file=err)
                continue
            keytype = item.line.split()[1]
            print(
                f"{name} {item.pattern} {keytype} {item.fingerprint} ({compare(known, item)})",
                file=out,
            )
        if do_accept:
            for change in accept(path, list(found)):
                print(f"{path}: {change}", file=out)
    if not do_accept:
        print(
            "# nothing written: check each fingerprint out of band (on the host: "
            "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), then run again with --accept",
            file=out,
        )
    return EX_UNAVAILABLE if failed else 0

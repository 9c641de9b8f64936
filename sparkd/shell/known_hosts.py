"""`sparkd known-hosts scan`: each host's SSH host key, for checking out of band.

The scan connects to every configured host without trusting it (no authentication is
attempted), prints the key's SHA256 fingerprint as `ssh-keygen -lf` shows it, and says how it
compares with `known_hosts_file`, read as OpenSSH and asyncssh read it: hashed names
(`HashKnownHosts yes`, `ssh-keygen -H`), wildcards, `@revoked` and `@cert-authority`. It writes
that file only when asked (`--accept`), and says what it added, replaced or refused: nothing is
ever trusted silently, and no old key is left trusted beside the new one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import asyncssh
from asyncssh.pattern import HostPatternList

from sparkd.model.cluster import ClusterSpec
from sparkd.model.exits import EX_UNAVAILABLE
from sparkd.shell.files import atomic_write

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


@dataclass(frozen=True)
class Entry:
    """One known_hosts line as OpenSSH reads it: `[@marker] hosts keytype base64 [comment]`."""

    marker: str | None  # `revoked`, `cert-authority`, or None for a host key
    hosts: str  # comma-separated patterns, or one `|1|salt|hash` (HashKnownHosts)
    keytype: str
    blob: str


def parse_entry(line: str) -> Entry | None:
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker = None
    if fields[0].startswith("@"):
        marker, fields = fields[0][1:], fields[1:]
    if len(fields) < 3:
        return None
    return Entry(marker, fields[0], fields[1], fields[2])


def _hashed_matches(field: str, pattern: str) -> bool:
    """`|1|base64(salt)|base64(HMAC-SHA1(salt, host))`, as `ssh-keygen -H` writes it."""
    try:
        magic, salt, digest = field[1:].split("|")
        salt_bytes, digest_bytes = base64.b64decode(salt), base64.b64decode(digest)
    except (ValueError, binascii.Error):
        return False
    if magic != "1":
        return False
    mine = hmac.new(salt_bytes, pattern.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(mine, digest_bytes)


def hashed(pattern: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, pattern.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def _names(entry: Entry, pattern: str) -> tuple[bool, bool]:
    """Whether the entry names `pattern` exactly (hashed or as one of its patterns), and
    whether it covers it only through a wildcard or CIDR pattern."""
    if entry.hosts.startswith("|"):
        return _hashed_matches(entry.hosts, pattern), False
    names = entry.hosts.split(",")
    if pattern in names:
        return True, False
    address = pattern[1:].partition("]")[0] if pattern.startswith("[") else pattern
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    wild = [n for n in names if any(c in n for c in "*?!/")]
    covered = bool(wild) and HostPatternList(",".join(names)).matches(pattern, address, ip)
    return False, covered


def trusted(known: list[str], found: Scanned) -> tuple[list[str], list[str], list[str]]:
    """What sparkd's own connection would trust for the host, as asyncssh matches known_hosts
    (hashed lines, wildcards and markers included): host keys, CA keys, revoked keys, each as
    `keytype base64`."""
    address, port = _address_port(found.pattern)
    try:
        table = asyncssh.import_known_hosts("\n".join(known))
    except ValueError:
        return [], [], []
    # Port 22 is written without one; another port falls back to the bare address, as asyncssh
    # does when no line names the port.
    keys, cas, revoked, *_ = table.match(address, address, None if port == 22 else port)
    return [_text(k) for k in keys], [_text(k) for k in cas], [_text(k) for k in revoked]


def _text(key: asyncssh.SSHKey) -> str:
    return " ".join(key.export_public_key("openssh").decode().split()[:2])


def _address_port(pattern: str) -> tuple[str, int]:
    if pattern.startswith("["):
        address, _, port = pattern[1:].partition("]:")
        return address, int(port)
    return pattern, 22


def compare(known: list[str], found: Scanned) -> str:
    if found.line is None:
        return "unreachable"
    scanned = " ".join(found.line.split()[1:3])
    keys, _, revoked = trusted(known, found)
    if scanned in revoked:
        return "REVOKED in known_hosts"
    if scanned in keys:
        others = len(set(keys) - {scanned})
        if others:
            return f"matches known_hosts, which also trusts {others} other key(s) for it"
        return "matches known_hosts"
    if keys:
        return "DIFFERS from known_hosts"
    return "not in known_hosts"


def accept(path: Path, found: list[Scanned]) -> list[str]:
    """known_hosts with each answering host's entries replaced by the scanned key; returns what
    was changed (or refused), one line each. `@revoked` and `@cert-authority` lines are kept;
    a scanned key that is `@revoked` is never added. A file with hashed names gets a hashed
    line."""
    known = _entries(path)
    changes: list[str] = []
    for item in found:
        if item.line is None:
            continue
        status = compare(known, item)
        if status == "matches known_hosts":
            continue
        if status.startswith("REVOKED"):
            changes.append(f"refused {item.pattern} {item.fingerprint}: the key is @revoked")
            continue
        known, wild = _without(known, item)
        entries = [e for e in map(parse_entry, known) if e is not None]
        name = hashed(item.pattern) if any(e.hosts.startswith("|") for e in entries) else None
        known.append(item.line if name is None else f"{name} {' '.join(item.line.split()[1:])}")
        verb = "added" if status.startswith("not in") else "replaced"
        changes.append(f"{verb} {item.pattern} {item.fingerprint}")
        changes.extend(
            f"left line {line!r}: its wildcard also names {item.pattern}; edit it by hand"
            for line in wild
        )
    if any(not c.startswith("refused") for c in changes):
        # A file someone else reads (ssh itself) keeps its mode; a new one is world-readable.
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        atomic_write(path, "".join(f"{e}\n" for e in known).encode(), mode)
    return changes


def _without(known: list[str], item: Scanned) -> tuple[list[str], list[str]]:
    """`known` without the host keys it has for the item's host (a name dropped from a line
    that names other hosts too), and the wildcard lines that still cover it."""
    kept: list[str] = []
    wild: list[str] = []
    for line in known:
        entry = parse_entry(line)
        if entry is None or entry.marker is not None:
            kept.append(line)
            continue
        exact, covered = _names(entry, item.pattern)
        if covered:
            wild.append(line)
        if not exact:
            kept.append(line)
            continue
        rest = [n for n in entry.hosts.split(",") if n != item.pattern]
        if rest and not entry.hosts.startswith("|"):
            kept.append(line.replace(entry.hosts, ",".join(rest), 1))
    return kept, wild


async def scan(clusters: Sequence[ClusterSpec], do_accept: bool, out: TextIO, err: TextIO) -> int:
    by_file: dict[Path, list[tuple[str, str, int]]] = {}
    for cluster in clusters:
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

"""`sparkd init`: the running deployment's config draft, on stdout."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

from pydantic import ValidationError

from sparkd.model.exits import EX_UNAVAILABLE, EX_USAGE
from sparkd.model.spec import SshSpec


def host_port(text: str) -> tuple[str, int] | None:
    """`ADDRESS`, `ADDRESS:PORT` or `[IPv6]:PORT`."""
    if text.startswith("["):
        address, sep, port = text[1:].partition("]")
        port = port.removeprefix(":") if sep else ""
    elif text.count(":") == 1:
        address, _, port = text.partition(":")
    else:
        address, port = text, ""
    if not address or any(c.isspace() for c in address) or address.startswith("-"):
        return None
    if not port:
        return address, 22
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return None
    return address, int(port)


def init(args: argparse.Namespace) -> int:
    from sparkd.core.reading.discover import Options, draft
    from sparkd.core.text import printable
    from sparkd.model.fields import NAME_PATTERN

    targets = []
    for text in args.hosts:
        parsed = host_port(text)
        if parsed is None:
            print(f"sparkd init: {printable(text)!r} is not HOST or HOST:PORT", file=sys.stderr)
            return EX_USAGE
        targets.append(parsed)
    if not re.match(NAME_PATTERN, args.name):
        print(f"sparkd init: --name {printable(args.name)!r} is not a valid name", file=sys.stderr)
        return EX_USAGE
    try:
        ssh = SshSpec(
            user=args.ssh_user, key_file=Path(args.key), known_hosts_file=Path(args.known_hosts)
        )
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            print(f"sparkd init: {error['loc'][0]}: {error['msg']}", file=sys.stderr)
        return EX_USAGE
    from sparkd.shell.discover import read_hosts

    found, refused = asyncio.run(read_hosts(targets, ssh))
    for r in refused:
        print(printable(f"sparkd init: {r.address}:{r.port}: {r.reason}"), file=sys.stderr)
    if refused:
        return EX_UNAVAILABLE
    options = Options(
        user=ssh.user,
        key_file=str(ssh.key_file),
        known_hosts_file=str(ssh.known_hosts_file),
        cluster=args.name,
    )
    text = draft(options, found)
    sys.stdout.write(text)
    checks = [line for line in text.splitlines() if line.startswith("# CHECK:")]
    if checks:
        print(
            f"sparkd init: {len(checks)} CHECK line(s) at the end need a decision", file=sys.stderr
        )
    return 0

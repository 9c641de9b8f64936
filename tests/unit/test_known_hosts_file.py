"""known_hosts read as the connection reads it: wildcard lines that still trust an old key are
named, never silently kept or silently widened."""

from __future__ import annotations

from pathlib import Path

import asyncssh

from sparkd.shell.known_hosts import Scanned, accept, compare, hashed, parse_entry


def blob() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()[1]


def test_a_wildcard_line_with_another_key_is_reported_and_left(tmp_path: Path) -> None:
    new, old = blob(), blob()
    found = Scanned("[127.0.0.5]:2222", f"[127.0.0.5]:2222 ssh-ed25519 {new}", "SHA256:new")
    known = tmp_path / "known_hosts"
    wildcard = f"[127.0.0.*]:2222 ssh-ed25519 {old}"
    known.write_text(f"{wildcard}\n")
    assert compare([wildcard], found) == "DIFFERS from known_hosts"
    changes = accept(known, [found])
    assert changes[0] == "replaced [127.0.0.5]:2222 SHA256:new"
    assert any("left line" in c and "edit it by hand" in c for c in changes), changes
    assert wildcard in known.read_text().splitlines()
    assert compare(known.read_text().splitlines(), found).startswith("matches known_hosts, which")


def test_a_hashed_name_matches_only_its_host() -> None:
    entry = parse_entry(f"{hashed('[10.0.0.1]:2222')} ssh-ed25519 {blob()}")
    assert entry is not None and entry.hosts.startswith("|1|")
    key = entry.keytype + " " + entry.blob
    mine = Scanned("[10.0.0.1]:2222", f"[10.0.0.1]:2222 {key}", "f")
    other = Scanned("[10.0.0.2]:2222", f"[10.0.0.2]:2222 {key}", "f")
    line = f"{entry.hosts} {key}"
    assert compare([line], mine) == "matches known_hosts"
    assert compare([line], other) == "not in known_hosts"

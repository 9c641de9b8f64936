"""`sparkd known-hosts scan` against a real OpenSSH sshd: the fingerprint ssh-keygen shows, nothing
written without --accept, a file sparkd then connects with after it."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import asyncssh
import pytest

from sparkd.settings import load_settings
from sparkd.shell.ssh import HostConnection
from tests.support.sshd import RealSshd
from tests.toy import EXAMPLE_CONFIG

pytestmark = pytest.mark.sshd


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def config_for(sshd: RealSshd, tmp_path: Path, known_hosts: Path) -> Path:
    text = EXAMPLE_CONFIG.read_text()
    text = text.replace(
        'address = "10.1.230.180"\n  port = 22', f'address = "127.0.0.1"\n  port = {sshd.port}'
    )
    text = text.replace(
        'address = "10.1.230.181"\n  port = 22', f'address = "127.0.0.1"\n  port = {closed_port()}'
    )
    text = text.replace('"/etc/sparkd/known_hosts"', f'"{known_hosts}"')
    text = text.replace('"/etc/sparkd/id_ed25519"', f'"{sshd.key_file}"')
    text = re.sub(r'user = "aurora"', f'user = "{sshd.user}"', text)
    path = tmp_path / "sparkd.toml"
    path.write_text(text)
    return path


def sparkd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkd.cli", *args], capture_output=True, text=True, timeout=60
    )


def keygen_fingerprint(known_hosts: Path) -> str:
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        pytest.skip("ssh-keygen is missing")
    out = subprocess.run([keygen, "-lf", str(known_hosts)], capture_output=True, text=True)
    return out.stdout.split()[1]


def keygen_lookup(pattern: str, known_hosts: Path) -> str:
    found = subprocess.run(
        ["ssh-keygen", "-l", "-F", pattern, "-f", str(known_hosts)], capture_output=True, text=True
    )
    return found.stdout


def scan_setup(sshd: RealSshd, tmp_path: Path, known_hosts: Path) -> tuple[Path, str, str]:
    """The example config aimed at `sshd` and `known_hosts`; the served key's fingerprint; the
    known_hosts pattern for the served address."""
    config = config_for(sshd, tmp_path, known_hosts)
    return config, keygen_fingerprint(sshd.known_hosts), f"[127.0.0.1]:{sshd.port}"


def fresh_key_blob() -> str:
    """The base64 blob of a new ed25519 key no host serves."""
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()[1]


async def test_scan_prints_fingerprints_and_writes_only_with_accept(
    sshd: RealSshd, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "scanned" / "known_hosts"
    known_hosts.parent.mkdir()
    config, expected, pattern = scan_setup(sshd, tmp_path, known_hosts)

    scanned = sparkd("known-hosts", "scan", "--config", str(config))
    assert scanned.returncode == 69, scanned.stderr  # the worker's port is closed
    assert f"{pattern} ssh-ed25519 {expected} (not in known_hosts)" in scanned.stdout
    assert "unreachable" in scanned.stderr and "spark-b" in scanned.stderr
    assert "--accept" in scanned.stdout
    assert not known_hosts.exists()

    # A stale key for the host (it was re-keyed) and an unrelated entry that must stay.
    other_blob = fresh_key_blob()
    other = f"192.0.2.7 ssh-ed25519 {other_blob}"
    stale = asyncssh.read_private_key(sshd.other_key_file).export_public_key()
    stale_blob = stale.decode().split()[1]
    known_hosts.write_text(f"{other}\n{pattern} ssh-ed25519 {stale_blob}\n")
    differs = sparkd("known-hosts", "scan", "--config", str(config))
    assert "(DIFFERS from known_hosts)" in differs.stdout
    assert stale_blob in known_hosts.read_text()

    accepted = sparkd("known-hosts", "scan", "--config", str(config), "--accept")
    assert f"replaced {pattern} {expected}" in accepted.stdout
    lines = known_hosts.read_text().splitlines()
    assert other in lines and not any(stale_blob in line for line in lines)
    assert expected in keygen_lookup(pattern, known_hosts)

    again = sparkd("known-hosts", "scan", "--config", str(config))
    assert "(matches known_hosts)" in again.stdout

    settings = load_settings(config)
    cluster = settings.clusters[0]
    conn = HostConnection(cluster.head, cluster.ssh)
    try:
        result = await conn.run("echo trusted", timeout=10)
    finally:
        await conn.close()
    assert result.stdout == "trusted\n"


def keygen(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is missing")
    return subprocess.run(["ssh-keygen", *args], capture_output=True, text=True, check=True)


def stale_line(sshd: RealSshd, pattern: str) -> tuple[str, str]:
    stale = asyncssh.read_private_key(sshd.other_key_file).export_public_key().decode().split()
    return f"{pattern} {stale[0]} {stale[1]}", stale[1]


async def test_a_hashed_known_hosts_is_read_and_replaced_whole(
    sshd: RealSshd, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    config, expected, pattern = scan_setup(sshd, tmp_path, known_hosts)
    line, stale_blob = stale_line(sshd, pattern)
    other_blob = fresh_key_blob()
    other = f"192.0.2.7 ssh-ed25519 {other_blob}"
    known_hosts.write_text(f"{other}\n{line}\n")
    # HashKnownHosts yes: ssh-keygen -H replaces every name by its salted hash.
    keygen("-H", "-f", str(known_hosts))
    assert pattern not in known_hosts.read_text() and "192.0.2.7" not in known_hosts.read_text()

    differs = sparkd("known-hosts", "scan", "--config", str(config))
    assert f"{pattern} ssh-ed25519 {expected} (DIFFERS from known_hosts)" in differs.stdout

    accepted = sparkd("known-hosts", "scan", "--config", str(config), "--accept")
    assert f"replaced {pattern} {expected}" in accepted.stdout, accepted
    text = known_hosts.read_text()
    assert stale_blob not in text and pattern not in text  # the new line is hashed too
    found = keygen("-l", "-F", pattern, "-f", str(known_hosts)).stdout
    assert found.count("SHA256:") == 1 and expected in found, found
    assert "192.0.2.7" in keygen("-F", "192.0.2.7", "-f", str(known_hosts)).stdout
    again = sparkd("known-hosts", "scan", "--config", str(config))
    assert f"{pattern} ssh-ed25519 {expected} (matches known_hosts)" in again.stdout


async def test_revoked_and_cert_authority_lines_are_honoured_and_kept(
    sshd: RealSshd, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    config, expected, pattern = scan_setup(sshd, tmp_path, known_hosts)
    served = sshd.known_hosts.read_text().split()
    ca_blob = fresh_key_blob()
    authority = f"@cert-authority *.example ssh-ed25519 {ca_blob}"
    revoked = f"@revoked * {served[-2]} {served[-1]}"
    known_hosts.write_text(f"{authority}\n{revoked}\n")

    scanned = sparkd("known-hosts", "scan", "--config", str(config))
    assert f"{pattern} ssh-ed25519 {expected} (REVOKED in known_hosts)" in scanned.stdout
    accepted = sparkd("known-hosts", "scan", "--config", str(config), "--accept")
    assert f"refused {pattern} {expected}: the key is @revoked" in accepted.stdout, accepted
    assert known_hosts.read_text() == f"{authority}\n{revoked}\n"

    # Revocation lifted, a stale plain key beside the marker lines: the stale key goes, both
    # markers stay.
    line, stale_blob = stale_line(sshd, f"{pattern},192.0.2.9")
    known_hosts.write_text(f"{authority}\n{line}\n")
    accepted = sparkd("known-hosts", "scan", "--config", str(config), "--accept")
    assert f"replaced {pattern} {expected}" in accepted.stdout, accepted
    lines = known_hosts.read_text().splitlines()
    assert authority in lines
    assert f"192.0.2.9 ssh-ed25519 {stale_blob}" in lines  # the other host keeps its key
    found = keygen("-l", "-F", pattern, "-f", str(known_hosts)).stdout
    assert found.count("SHA256:") == 1 and expected in found, found

"""What `check-config` checks beyond the file itself: that what the config points at on this
machine is usable (key files, known_hosts, secrets, the state dir). Each problem is one
`location: problem` line, like a config error."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

import asyncssh

from sparkd.settings import Settings
from sparkd.shell.secrets import SecretFileError, read_secret


def problems(settings: Settings) -> list[str]:
    found: list[str] = []
    found.extend(_state_dir("daemon.state_dir", settings.daemon.state_dir))
    if settings.daemon.control_token_file is not None:
        found.extend(_secret("daemon.control_token_file", settings.daemon.control_token_file))
    for index, cluster in enumerate(settings.clusters):
        where = f"clusters.{index}"
        found.extend(_key(f"{where}.ssh.key_file", cluster.ssh.key_file))
        found.extend(_known_hosts(f"{where}.ssh.known_hosts_file", cluster.ssh.known_hosts_file))
        if cluster.model.api_key_file is not None:
            found.extend(_secret(f"{where}.model.api_key_file", cluster.model.api_key_file))
        if cluster.ray.auth_token_file is not None:
            found.extend(_secret(f"{where}.ray.auth_token_file", cluster.ray.auth_token_file))
    return list(dict.fromkeys(found))


def _state_dir(where: str, path: Path) -> list[str]:
    if path.exists() and not path.is_dir():
        return [f"{where}: {path} is not a directory"]
    probe = path if path.exists() else _existing_parent(path)
    if not os.access(probe, os.W_OK | os.X_OK):
        return [f"{where}: {probe} is not writable by this user"]
    return []


def _existing_parent(path: Path) -> Path:
    for parent in path.parents:
        if parent.exists():
            return parent
    return Path("/")


def _key(where: str, path: Path) -> list[str]:
    readable = _readable(where, path)
    if readable:
        return readable
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return [
            f"{where}: {path} is accessible by group or others (mode {mode:04o}); OpenSSH "
            "refuses such keys and so does sparkd: chmod 600 it"
        ]
    try:
        asyncssh.read_private_key(path)
    except (asyncssh.KeyEncryptionError, asyncssh.KeyImportError, ValueError, OSError) as exc:
        if isinstance(exc, asyncssh.KeyEncryptionError) or "assphrase" in str(exc):
            return [f"{where}: {path} is passphrase-protected; sparkd runs unattended: use a "
                    "key without a passphrase, readable only by sparkd's user"]  # fmt: skip
        return [f"{where}: {path} is not a usable private key"]
    return []


def _known_hosts(where: str, path: Path) -> list[str]:
    readable = _readable(where, path)
    if readable:
        return readable
    try:
        asyncssh.read_known_hosts(str(path))
    except (ValueError, OSError):
        return [f"{where}: {path} is not a valid known_hosts file"]
    return []


def _secret(where: str, path: Path) -> list[str]:
    try:
        read_secret(path)
    except SecretFileError as exc:
        return [f"{where}: {exc}"]
    return []


def _readable(where: str, path: Path) -> list[str]:
    if not path.exists():
        return [f"{where}: {path} does not exist"]
    if not path.is_file():
        return [f"{where}: {path} is not a file"]
    if not os.access(path, os.R_OK):
        return [f"{where}: {path} is not readable by this user"]
    return []


def warnings(settings: Settings) -> list[str]:
    """What `check-config` warns of without refusing: etcd a stranger may write. Write access
    to the `[ha]` prefix decides who owns a cluster and what its memory holds (docs/security.md)."""
    ha = settings.ha
    if ha is None:
        return []
    found: list[str] = []
    if ha.user is None:
        found.append(
            "ha: no user/password_file: anyone who reaches etcd can write the prefix "
            f"{ha.prefix!r} (ownership, memory); turn etcd auth on"
        )
    for endpoint in ha.etcd_endpoints:
        url = urlsplit(endpoint)
        if url.scheme == "http" and not _loopback(url.hostname or ""):
            found.append(
                f"ha.etcd_endpoints: {endpoint} is plain HTTP to another host: its password "
                "and every record can be read and changed on the way; use https://"
            )
    return found


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

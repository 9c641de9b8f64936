"""A config file written for a test: the shipped example, or one pointed at a key, known_hosts
and state dir made for it; what loading it reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.settings import ConfigError, load_settings
from tests.toy import EXAMPLE_CONFIG

BASE = EXAMPLE_CONFIG.read_text()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sparkd.toml"
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    return info.value.problems


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkd.cli", *args], capture_output=True, text=True, env=env
    )


def usable(tmp_path: Path, text: str = BASE) -> Path:
    """The config, pointed at a real key, known_hosts and state dir made for the test."""
    import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "id_ed25519"
    key_file.write_bytes(key.export_private_key())
    key_file.chmod(0o600)
    known = tmp_path / "known_hosts"
    public = key.export_public_key().decode().strip()
    known.write_text(f"10.1.230.180 {public}\n")
    state = tmp_path / "state"
    text = (
        text.replace('"/etc/sparkd/id_ed25519"', f'"{key_file}"')
        .replace('"/etc/sparkd/known_hosts"', f'"{known}"')
        .replace('state_dir = "/var/lib/sparkd"', f'state_dir = "{state}"')
    )
    return write(tmp_path, text)

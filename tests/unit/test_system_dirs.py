"""A system directory is refused as `state_dir` or `log_dir` however it is spelt (or linked),
and sparkd never changes the mode of a directory it did not create."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.model.memory import Memory
from sparkd.runtime.state import StateDir
from sparkd.settings import ConfigError, load_settings
from tests.support.config import BASE, usable, write

SYSTEM = ["/", "/tmp", "/tmp/", "/etc", "//etc", "///etc/", "/var/lib", "/var/lib/../../etc",
          "/usr/./lib", "/proc/self", "/proc/1/cwd", "/sys/fs/cgroup", "/dev/shm", "/dev",
          "/var/tmp"]  # fmt: skip


def refused(tmp_path: Path, old: str, new: str) -> list[str]:
    assert old in BASE
    with pytest.raises(ConfigError) as error:
        load_settings(write(tmp_path, BASE.replace(old, new, 1)))
    return error.value.problems


@pytest.mark.parametrize("path", SYSTEM)
def test_a_system_state_dir_is_refused(tmp_path: Path, path: str) -> None:
    problems = refused(tmp_path, 'state_dir = "/var/lib/sparkd"', f'state_dir = "{path}"')
    assert any("daemon.state_dir" in p and "system directory" in p for p in problems), problems


@pytest.mark.parametrize("path", SYSTEM)
def test_a_system_log_dir_is_refused(tmp_path: Path, path: str) -> None:
    problems = refused(tmp_path, 'log_dir = "/var/lib/sparkd-serve"', f'log_dir = "{path}"')
    assert any("model.log_dir" in p and "system directory" in p for p in problems), problems


def test_a_state_dir_linked_to_a_system_directory_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "state"
    link.symlink_to("/etc")
    problems = refused(tmp_path, 'state_dir = "/var/lib/sparkd"', f'state_dir = "{link}"')
    assert any("/etc" in p and "system directory" in p for p in problems), problems


@pytest.mark.parametrize("path", ["/var/lib/sparkd", "/srv/sparkd", "/var/lib/sparkd-b"])
def test_a_directory_of_its_own_passes(tmp_path: Path, path: str) -> None:
    load_settings(
        write(tmp_path, BASE.replace('state_dir = "/var/lib/sparkd"', f'state_dir = "{path}"'))
    )


def test_check_config_names_the_system_directory(tmp_path: Path) -> None:
    config = usable(tmp_path)
    text = config.read_text()
    config.write_text(text.replace(f'state_dir = "{tmp_path / "state"}"', 'state_dir = "//etc"'))
    result = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 78, result
    assert "daemon.state_dir" in result.stdout + result.stderr


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_existing_directory_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    link = tmp_path / "link"
    link.symlink_to(shared)
    for path in (shared, link):
        state = StateDir(path)
        state.save_memory("c", Memory())
        state.append_events([{"cluster": "c", "kind": "phase"}], keep=10)
        assert mode(shared) == 0o1777, oct(mode(shared))
    assert mode(shared / "memory-c.json") == 0o600


def test_a_directory_sparkd_creates_is_0700_whatever_the_umask(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    old = os.umask(0o700)
    try:
        StateDir(tmp_path / "a" / "state").ensure()
    finally:
        os.umask(old)
    assert mode(tmp_path / "a" / "state") == 0o700

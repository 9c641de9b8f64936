"""`start_model` on the head through a real sshd as the unprivileged login account: the API key
and the spec file never go through a symlink someone else planted in `model.log_dir`."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from sparkd.shell import catalogue
from sparkd.shell.ssh import SshFailure, SshPool
from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim.openssh import LOGIN_USER
from tests.support.live import cluster_of
from tests.support.sshd import openssh_world

pytestmark = pytest.mark.sshd

API_KEY = "sk-log-dir-7d1e9a4c2b"


def victim(path: Path) -> Path:
    """A file the login account may write: a symlink to it would hand it the key."""
    entry = pwd.getpwnam(LOGIN_USER)
    path.write_text("")
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(0o666)
    return path


def plant(log_dir: Path) -> tuple[Path, Path]:
    """The login account's own directory, left writable to all: another user (root here)
    planted symlinks at the key's and the spec's names."""
    log_dir.chmod(0o777)
    stolen = victim(log_dir.parent / "stolen-key")
    spec = victim(log_dir.parent / "stolen-spec")
    for name, target in ((catalogue.actions.API_KEY_FILE, stolen), ("serve.spec", spec)):
        (log_dir / name).unlink(missing_ok=True)
        (log_dir / name).symlink_to(target)
    return stolen, spec


def written_safely(log_dir: Path) -> None:
    key = log_dir / catalogue.actions.API_KEY_FILE
    assert not key.is_symlink() and key.read_text() == API_KEY
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(log_dir.stat().st_mode) == 0o700
    assert not [p.name for p in log_dir.iterdir() if p.name.startswith(".")]


def hand_to_root(log_dir: Path) -> None:
    (log_dir / catalogue.actions.API_KEY_FILE).unlink()
    os.chown(log_dir, 0, 0)
    log_dir.chmod(0o1777)


async def test_a_planted_symlink_never_receives_the_key(tmp_path: Path, pool: SshPool) -> None:
    async with openssh_world(tmp_path / "world", "healthy", spec_labels=sparkd_spec_labels) as w:
        cluster = cluster_of(w)
        log_dir = Path(cluster.model.log_dir)
        seconds = cluster.ssh.command_timeout
        conn = pool.connection(cluster.head, cluster.ssh)
        remote = catalogue.actions.start_model(cluster, seconds, API_KEY)

        stolen, spec = plant(log_dir)
        await conn.run(remote.command, timeout=30, input=remote.stdin)
        assert stolen.read_text() == "" and spec.read_text() == ""
        written_safely(log_dir)

        # A log_dir of another user's, however open, is refused before anything is written.
        hand_to_root(log_dir)
        with pytest.raises(SshFailure) as failure:
            await conn.run(remote.command, timeout=30, input=remote.stdin)
        assert failure.value.result is not None
        assert "not the SSH user's own directory" in failure.value.result.stderr
        assert not (log_dir / catalogue.actions.API_KEY_FILE).exists()
        assert stolen.read_text() == ""

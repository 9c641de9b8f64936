"""Atomic replacement of local files (memory, events, known_hosts): the new content with the
asked mode, nothing beside it, and on a failure the old content with nothing left behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sparkd.shell.files import atomic_write


def test_replaces_the_content_with_the_mode_asked_and_leaves_nothing_beside_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "memory.json"
    path.write_text("old")
    path.chmod(0o644)
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    atomic_write(path, b"newer", 0o644)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.json"]


def test_a_symlink_beside_the_file_is_never_written_through(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    for guess in (f".memory.json.{os.getpid()}.tmp", ".memory.json.tmp"):
        (tmp_path / guess).symlink_to(target)
    atomic_write(tmp_path / "memory.json", b"new")
    assert target.read_text() == "keep"
    assert (tmp_path / "memory.json").read_bytes() == b"new"


def test_a_failed_write_keeps_the_old_content_and_removes_its_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("old\n")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, b"new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["known_hosts"]

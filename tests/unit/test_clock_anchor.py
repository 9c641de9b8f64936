"""Daemon time survives a restart in the same boot and is set anew after a reboot."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.runtime import clock
from sparkd.runtime.clock import DaemonClock


def test_a_restart_in_the_same_boot_keeps_daemon_time_through_a_step() -> None:
    first = DaemonClock(lambda: 1000.0, lambda: 50.0, "boot-1")
    # Restarted later in the same boot, with the wall clock stepped back an hour meanwhile.
    again = DaemonClock(lambda: 1100.0 - 3600, lambda: 150.0, "boot-1", first.anchor)
    assert again.carried
    assert again.now() == 1100.0
    assert again.step() == -3600.0


def test_a_reboot_takes_the_wall_clock() -> None:
    first = DaemonClock(lambda: 1000.0, lambda: 50.0, "boot-1")
    assert not DaemonClock(lambda: 5000.0, lambda: 60.0, "boot-2", first.anchor).carried
    # The same boot id cannot read a monotonic clock below the anchor's.
    assert not DaemonClock(lambda: 5000.0, lambda: 10.0, "boot-1", first.anchor).carried
    assert not DaemonClock(lambda: 5000.0, lambda: 60.0, "", first.anchor).carried


def test_under_the_unit_a_runtime_marker_stands_for_the_boot_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clock, "BOOT_ID", tmp_path / "hidden-by-ProcSubset")
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    first = clock.ops_boot_id()
    assert first and clock.ops_boot_id() == first
    (tmp_path / "run" / "boot-marker").unlink()  # a reboot empties the tmpfs
    assert clock.ops_boot_id() not in ("", first)

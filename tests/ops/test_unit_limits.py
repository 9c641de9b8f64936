"""The unit's stop timeout covers the longest action; its hardening scores well offline."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkd.model.plan import ACTION_KINDS, Action
from sparkd.settings import load_settings
from sparkd.shell.execute import Executor
from sparkd.shell.ssh import SshPool
from sparkd.web.app import MAX_CONNECTIONS

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "sparkd.service"


def setting(name: str) -> str:
    [value] = re.findall(rf"^{name}=(.*)$", UNIT.read_text(), flags=re.M)
    return value.strip()


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(s|min)?", value)
    assert match, value
    return int(match[1]) * (60 if match[2] == "min" else 1)


def test_timeout_stop_outlasts_the_longest_action_of_the_reference_config() -> None:
    """On SIGTERM the action in flight finishes within its own timeout; systemd must wait."""
    [cluster] = load_settings(ROOT / "etc" / "sparkd" / "sparkd.toml").clusters
    executor = Executor(cluster, SshPool())
    longest = max(
        executor.action_timeout(Action(kind=kind, host="h", target="t", reason="r"))
        for kind in ACTION_KINDS
    )
    assert seconds(setting("TimeoutStopSec")) >= longest + 30


def test_starts_after_the_clock_is_synchronised() -> None:
    """Ordered after time-sync.target, which only the NTP client pulls in (systemd.special)."""
    assert "time-sync.target" in setting("After").split()
    assert "time-sync.target" not in setting("Wants").split()


def test_descriptor_limit_leaves_room_beside_the_api_connection_cap() -> None:
    assert int(setting("LimitNOFILE")) >= 4 * MAX_CONNECTIONS


def test_security_exposure_is_at_most_1_5(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze on this machine")
    unit = tmp_path / "sparkd.service"
    unit.write_text(UNIT.read_text())
    result = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for sparkd\.service: (\d+\.\d+)", result.stdout)
    if found is None:
        pytest.skip(f"systemd-analyze security --offline cannot run here: {result.stderr[:200]}")
    assert float(found[1]) <= 1.5, result.stdout

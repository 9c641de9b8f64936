"""The unit's stop timeout covers the longest action; its hardening scores well offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkd.model.plan import ACTION_KINDS, Action
from sparkd.settings import load_settings
from sparkd.shell.execute import Executor
from sparkd.shell.ssh import SshPool
from sparkd.web.guard import MAX_CONNECTIONS
from tests.ops.tools import analyze_unit, setting

ROOT = Path(__file__).resolve().parents[2]


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
    result = analyze_unit(tmp_path, "security", "--offline=true", "--no-pager")
    found = re.search(r"Overall exposure level for sparkd\.service: (\d+\.\d+)", result.stdout)
    if found is None:
        pytest.skip(f"systemd-analyze security --offline cannot run here: {result.stderr[:200]}")
    assert float(found[1]) <= 1.5, result.stdout

"""Maintenance windows: when one is open, and how the config validates them."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sparkd.model.cluster import MaintenanceSpec
from sparkd.model.exits import EX_CONFIG
from sparkd.runtime.maintenance import Window, window_at
from sparkd.settings import ConfigError, load_settings
from tests.toy import EXAMPLE_CONFIG

SUNDAY_3AM = MaintenanceSpec(cron="0 3 * * SUN", duration="2h", reason="updates", timezone="UTC")


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("when", "opened"),
    [
        ("2026-11-29T02:59:59", None),  # a Sunday, a second before
        ("2026-11-29T03:00:00", "2026-11-29T03:00:00"),
        ("2026-11-29T04:59:59", "2026-11-29T03:00:00"),
        ("2026-11-29T05:00:00", None),  # closed at its end
        ("2026-11-28T03:30:00", None),  # a Saturday
        ("2026-12-06T03:30:00", "2026-12-06T03:00:00"),
    ],
)
def test_window_at(when: str, opened: str | None) -> None:
    window = window_at([SUNDAY_3AM], at(when))
    if opened is None:
        assert window is None
    else:
        assert window == Window("updates", at(opened), at(opened) + 7200)


def test_overlapping_windows_end_at_the_latest() -> None:
    nightly = MaintenanceSpec(cron="30 4 * * *", duration="90m", reason="backup", timezone="UTC")
    window = window_at([SUNDAY_3AM, nightly], at("2026-11-29T04:45:00"))
    assert window == Window("backup", at("2026-11-29T04:30:00"), at("2026-11-29T06:00:00"))


def test_the_cron_runs_in_its_timezone() -> None:
    berlin = MaintenanceSpec(cron="0 3 * * *", duration="1h", reason="r", timezone="Europe/Berlin")
    # 03:00 in Berlin in winter is 02:00 UTC.
    assert window_at([berlin], at("2026-11-30T02:30:00")) is not None
    assert window_at([berlin], at("2026-11-30T03:30:00")) is None


def config_with(tmp_path: Path, block: str) -> Path:
    path = tmp_path / "sparkd.toml"
    path.write_text(EXAMPLE_CONFIG.read_text() + "\n" + block)
    return path


WINDOW = """
  [[clusters.maintenance]]
  cron = "{cron}"
  duration = "{duration}"
  reason = "weekly host updates"
  {extra}
"""


def test_config_accepts_a_window(tmp_path: Path) -> None:
    block = WINDOW.format(cron="0 3 * * SUN", duration="2h", extra='timezone = "UTC"')
    [spec] = load_settings(config_with(tmp_path, block)).clusters[0].maintenance
    assert (spec.duration, spec.reason, spec.timezone) == (7200, "weekly host updates", "UTC")


@pytest.mark.parametrize(
    ("cron", "duration", "extra", "problem"),
    [
        ("0 25 * * SUN", "2h", "", "clusters.0.maintenance.0: cron '0 25 * * SUN': "),
        ("0 3 * *", "2h", "", "clusters.0.maintenance.0: cron '0 3 * *': "),
        ("0 3 * * SUN", "two hours", "", "clusters.0.maintenance.0.duration: bad duration"),
        ("0 3 * * SUN", "2h", 'timezone = "Mars/Base"', "clusters.0.maintenance.0: unknown"),
        ("0 0 31 2 *", "2h", "", "clusters.0.maintenance.0: cron '0 0 31 2 *' never fires"),
        ("0 0 30 2 *", "2h", 'timezone = "UTC"', "clusters.0.maintenance.0: cron '0 0 30 2 *' nev"),
    ],
)
def test_config_rejects_a_bad_window(
    tmp_path: Path, cron: str, duration: str, extra: str, problem: str
) -> None:
    path = config_with(tmp_path, WINDOW.format(cron=cron, duration=duration, extra=extra))
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    [line] = info.value.problems
    assert line.startswith(problem), line
    result = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == EX_CONFIG
    assert result.stderr.splitlines() == [line]


def test_check_config_shows_the_next_opening(tmp_path: Path) -> None:
    from tests.unit.test_settings import usable

    text = (
        EXAMPLE_CONFIG.read_text()
        + "\n"
        + WINDOW.format(cron="0 3 * * SUN", duration="2h", extra="")
    )
    path = usable(tmp_path, text)
    result = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    line = result.stdout.splitlines()[1]
    assert line.startswith("  maintenance '0 3 * * SUN' (")
    assert "for 7200s: weekly host updates; next " in line
    opens = datetime.fromisoformat(line.rsplit("next ", 1)[1])
    assert opens.weekday() == 6 and (opens.hour, opens.minute) == (3, 0)
    assert opens > datetime.now(opens.tzinfo)

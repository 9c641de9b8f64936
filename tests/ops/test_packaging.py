"""The systemd unit passes systemd-analyze; the Dockerfile keeps its promises."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is missing: .ci/run must install systemd")
        pytest.skip("no systemd-analyze on this machine")
    sparkd = Path(sys.executable).with_name("sparkd")
    assert sparkd.exists()
    unit = (ROOT / "systemd" / "sparkd.service").read_text()
    assert (
        "Type=notify" in unit and "WatchdogSec=" in unit and "RestartPreventExitStatus=78" in unit
    )
    # Verify against this checkout's executable: systemd-analyze checks that ExecStart exists.
    local = tmp_path / "sparkd.service"
    local.write_text(unit.replace("/usr/local/bin/sparkd", str(sparkd)))
    result = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "sparkd.service" not in result.stderr, result.stderr


def test_dockerfile_runs_unprivileged_with_a_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines()]
    user = [line for line in lines if line.startswith("USER ")]
    assert user and user[-1] not in ("USER root", "USER 0")
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    assert "/healthz" in text
    assert "ENV PYTHONUNBUFFERED=1" in text
    assert 'ENTRYPOINT ["sparkd"]' in text

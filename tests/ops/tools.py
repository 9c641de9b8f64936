"""Finding the Prometheus tools, the shipped rules with their `for:` durations scaled, and the
shipped systemd unit read and checked by systemd-analyze."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "etc" / "prometheus" / "sparkd.rules.yml"
RULE_TESTS = ROOT / "etc" / "prometheus" / "sparkd.rules.test.yml"
ALERTMANAGER_CONFIG = ROOT / "etc" / "alertmanager" / "sparkd.yml"
DASHBOARD = ROOT / "etc" / "grafana" / "sparkd.json"
RUNBOOK = ROOT / "docs" / "runbook.md"
UNIT = ROOT / "systemd" / "sparkd.service"
# Debian's prometheus-alertmanager package names its daemon prometheus-alertmanager.
COMMANDS = {
    "prometheus": ("prometheus",),
    "promtool": ("promtool",),
    "alertmanager": ("alertmanager", "prometheus-alertmanager"),
    "amtool": ("amtool",),
}


def tool(name: str) -> str:
    """The tool's path; a missing tool skips the test, and fails it in CI."""
    for command in COMMANDS[name]:
        found = shutil.which(command)
        if found:
            return found
    if os.environ.get("CI") == "true":
        pytest.fail(f"{name} is missing: .ci/run must install it")
    pytest.skip(f"no {name} on this machine")


FOR = re.compile(r"^(\s*for:\s*)(\d+)([mh])\s*$", re.M)


def scaled_rules(text: str) -> str:
    """The rules with every `for:` of N minutes (hours) made N seconds (minutes)."""

    def scale(match: re.Match[str]) -> str:
        unit = {"m": "s", "h": "m"}[match.group(3)]
        return f"{match.group(1)}{match.group(2)}{unit}"

    scaled, count = FOR.subn(scale, text)
    assert count, "no for: durations found to scale"
    return scaled


def setting(name: str) -> str:
    """The value of the shipped unit's `name=` line."""
    [value] = re.findall(rf"^{name}=(.*)$", UNIT.read_text(), flags=re.M)
    return value.strip()


def analyze_unit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze ARGS` on a copy of the shipped unit; skipped where there is none."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze on this machine")
    unit = tmp_path / "sparkd.service"
    unit.write_text(UNIT.read_text())
    return subprocess.run(
        [analyze, *args, str(unit)], capture_output=True, text=True, timeout=60, check=False
    )


METRIC = re.compile(r"\b((?:cluster:)?sparkd_[a-z0-9_:]+)")


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def expressions() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(expr))

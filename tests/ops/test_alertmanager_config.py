"""The example Alertmanager config: amtool accepts it and routes each severity as documented."""

from __future__ import annotations

import subprocess

import yaml

from tests.ops.tools import ALERTMANAGER_CONFIG, RULES, tool

WEBHOOK_BASE = "https://alerts.example.invalid/"


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("amtool"), *args], capture_output=True, text=True)


def test_amtool_check_config() -> None:
    result = amtool("check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_routes_by_severity() -> None:
    config = f"--config.file={ALERTMANAGER_CONFIG}"
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            severity = rule["labels"]["severity"]
            result = amtool(
                "config", "routes", "test", config, f"alertname={rule['alert']}",
                f"severity={severity}", "cluster=sparks",
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            expected = {
                "critical": "sparkd-page",
                "warning": "sparkd-ticket",
                "info": "sparkd-info",
            }[severity]
            assert result.stdout.strip() == expected, (rule["alert"], result.stdout)
    unknown = amtool("config", "routes", "test", config, "alertname=Other")
    assert unknown.stdout.strip() == "sparkd-ticket"


def test_inhibitions_and_receivers() -> None:
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    sources = {r["source_matchers"][0]: r for r in config["inhibit_rules"]}
    host = sources['alertname="SparkdHostUnreachable"']
    assert "cluster" in host["equal"]
    assert "SparkdModelNotReady" in host["target_matchers"][0]
    assert "SparkdProbeFailing" in host["target_matchers"][0]
    down = sources['alertname="SparkdDown"']
    assert 'alertname!="SparkdDown"' in down["target_matchers"]
    # Every notification goes to one base URL, which the Alertmanager test points at loopback.
    urls = [w["url"] for r in config["receivers"] for w in r.get("webhook_configs", [])]
    assert urls and all(u.startswith(WEBHOOK_BASE) for u in urls)

"""The shipped alert and recording rules: promtool checks and unit tests, runbook coverage."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.ops.tools import RULE_TESTS, RULES, RUNBOOK, scaled_rules, tool

SEVERITIES = {"critical", "warning", "info"}


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], cwd=cwd, capture_output=True, text=True)


def test_promtool_checks_and_unit_tests_pass() -> None:
    checked = promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_unit_tests_catch_a_rule_that_pages_during_a_pause(tmp_path: Path) -> None:
    text = RULES.read_text()
    guard = (
        "sparkd_host_up == 0\n"
        "          unless on (job, instance, cluster) sparkd_cluster_paused == 1"
    )
    assert guard in text
    (tmp_path / RULES.name).write_text(text.replace(guard, "sparkd_host_up == 0"))
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "SparkdHostUnreachable" in tested.stdout + tested.stderr


def test_every_alert_and_recording_rule_is_tested_both_ways() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names == firing, names ^ firing
    assert names == quiet, names ^ quiet
    recorded = {r["record"] for r in rules() if "record" in r}
    exprs = " ".join(check["expr"] for case in tests for check in case.get("promql_expr_test", []))
    assert {r for r in recorded if r in exprs} == recorded


def test_alerts_carry_severity_annotations_and_a_runbook_section() -> None:
    runbook = RUNBOOK.read_text()
    sections = re.findall(r"^## (\S+)$", runbook, re.M)
    for alert in alerts():
        name = alert["alert"]
        assert re.fullmatch(r"Sparkd[A-Z][A-Za-z]+", name), name
        assert alert["labels"]["severity"] in SEVERITIES, name
        annotations = alert["annotations"]
        assert annotations["summary"] and "{{" not in annotations["summary"], name
        assert "{{" in annotations["description"], name
        assert annotations["runbook_url"] == f"docs/runbook.md#{name.lower()}"
        assert name in sections, f"docs/runbook.md has no section for {name}"
        body = runbook.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("What it means", "What sparkd already did", "What a human does"):
            assert f"**{part}:**" in body, (name, part)
    assert set(sections) - {a["alert"] for a in alerts()} == {"Testing"}


def test_scaled_rules_change_only_the_for_durations(tmp_path: Path) -> None:
    scaled = scaled_rules(RULES.read_text())
    original = yaml.safe_load(RULES.read_text())
    fast = yaml.safe_load(scaled)
    units = {"m": 60, "h": 3600, "s": 1}
    for group, fast_group in zip(original["groups"], fast["groups"], strict=True):
        for rule, fast_rule in zip(group["rules"], fast_group["rules"], strict=True):
            if "for" not in rule:
                assert rule == fast_rule
                continue
            slow, quick = rule.pop("for"), fast_rule.pop("for")
            assert units[slow[-1]] * int(slow[:-1]) == 60 * units[quick[-1]] * int(quick[:-1])
            assert rule == fast_rule
    (tmp_path / "fast.yml").write_text(scaled)
    assert promtool("check", "rules", "fast.yml", cwd=tmp_path).returncode == 0


def test_a_rule_reading_a_recorded_series_comes_after_it_in_the_same_group() -> None:
    # Groups are evaluated independently (promtool test rules too, in random order): a rule in
    # another group reads the recorded value of this step or of the last by chance.
    document = yaml.safe_load(RULES.read_text())
    home: dict[str, tuple[int, int]] = {}
    for g, group in enumerate(document["groups"]):
        for i, rule in enumerate(group["rules"]):
            if "record" in rule:
                home[rule["record"]] = (g, i)
    readers = 0
    for g, group in enumerate(document["groups"]):
        for i, rule in enumerate(group["rules"]):
            for name, (record_group, record_index) in home.items():
                if re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", rule["expr"]):
                    readers += 1
                    where = rule.get("alert") or rule.get("record")
                    assert (g, i) > (record_group, record_index) and g == record_group, where
    assert readers >= 2

"""`make check`'s core of end-to-end stories (tests/core.py) keeps one story for every action
kind, every triage class and each of the daemon's duties, and every story it names exists."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from sparkd.model.plan import ActionKind, TriageClass
from tests.core import CORE_STORIES, DUTIES, is_core

ROOT = Path(__file__).resolve().parents[2]


def test_every_action_kind_triage_class_and_duty_has_a_story() -> None:
    claimed = {what for whats in CORE_STORIES.values() for what in whats}
    wanted = {*get_args(ActionKind), *get_args(TriageClass), *DUTIES}
    assert wanted - claimed == set()
    assert claimed - wanted == set()


def test_every_story_names_a_test_that_exists() -> None:
    missing = []
    for story in CORE_STORIES:
        path, _, name = story.partition("::")
        tests = {
            node.name
            for node in ast.parse((ROOT / path).read_text()).body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        if name.partition("[")[0] not in tests:
            missing.append(story)
    assert missing == []


def test_a_story_is_selected_with_its_parameters_and_nothing_beside_it() -> None:
    cold = "tests/e2e/test_recovery.py::test_cold_start_from_seed_morning"
    assert is_core(cold + "[asyncssh]")
    assert not is_core(cold + "_and_more")
    lost = "tests/e2e/test_below_vllm.py::test_a_lost_gpu_blocks_with_a_reboot_restarts_nothing"
    assert is_core(lost + "_and_a_reboot_recovers[xid-79-needs a reboot]")
    assert not is_core(lost + "_and_a_reboot_recovers[lost-gpu-the GPU]")
    assert is_core("tests/unit/test_planner.py::test_anything")
    assert not is_core("tests/etcd/test_client.py::test_anything")

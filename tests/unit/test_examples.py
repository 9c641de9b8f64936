"""The shipped example snapshots: in sync with their builders, and replayed to the right plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.core.deciding.planner import plan
from sparkd.model.snapshot import load_snapshot
from tests.examples import EXAMPLE_SET, EXAMPLES, Example, render
from tests.toy import EXAMPLE_CONFIG, ROOT, reference_cluster


@pytest.mark.parametrize("example", EXAMPLE_SET, ids=[e.name for e in EXAMPLE_SET])
def test_example_file_is_current(example: Example) -> None:
    path = EXAMPLES / f"{example.name}.json"
    assert path.read_text() == render(example), "run: .venv/bin/python -m tests.examples"


@pytest.mark.parametrize("example", EXAMPLE_SET, ids=[e.name for e in EXAMPLE_SET])
def test_example_replays(example: Example) -> None:
    document = load_snapshot((EXAMPLES / f"{example.name}.json").read_bytes())
    assert document.snapshot_version == 1
    result = plan(reference_cluster(), document.observed(), document.memory, document.observed_at)
    assert result.phase == example.phase, result.reason
    assert tuple(a.kind for a in result.actions) == example.kinds


def plan_from_snapshot(snapshot: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`sparkd plan --from-snapshot` on the example config, as an operator runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkd.cli",
            "plan",
            "--from-snapshot",
            str(snapshot),
            "--config",
            str(EXAMPLE_CONFIG),
            *flags,
        ],
        capture_output=True,
        text=True,
    )


def test_seed_morning_replay_cli_json() -> None:
    proc = plan_from_snapshot(EXAMPLES / "seed-morning.json", "--json")
    assert proc.returncode == 0, proc.stderr
    [cluster] = json.loads(proc.stdout)
    assert set(cluster) >= {"cluster", "phase", "reason", "converged", "actions"}
    assert cluster["converged"] is False
    kinds = [a["kind"] for a in cluster["actions"]]
    assert kinds == ["stop_unit"] * 4 + ["remove_container"] * 2 + [
        "start_ray_head",
        "start_ray_worker",
    ]
    assert [a["target"] for a in cluster["actions"][:4]] == [
        "vllm-cluster.service",
        "vllm-proxy.service",
        "vllm-embeddings.service",
        "vllm-reranker.service",
    ]
    assert {a["target"] for a in cluster["actions"][4:6]} == {"glm-flash"}
    assert "start_model" not in kinds
    for action in cluster["actions"]:
        assert set(action) == {"kind", "host", "target", "reason"}


def test_snapshot_round_trip_is_exact() -> None:
    text = (EXAMPLES / "loading-40pct.json").read_text()
    document = load_snapshot(text)
    assert document.model_dump_json(indent=2) + "\n" == text


def test_bad_snapshot_exit_65(tmp_path: object) -> None:
    import pathlib

    path = pathlib.Path(str(tmp_path)) / "bad.json"
    path.write_text(json.dumps({"snapshot_version": 2, "cluster": "sparks"}))
    proc = plan_from_snapshot(path)
    assert proc.returncode == 65
    assert "snapshot_version" in proc.stderr


@pytest.mark.parametrize("example", EXAMPLE_SET, ids=[e.name for e in EXAMPLE_SET])
def test_documents_written_before_new_fields_still_replay(example: Example) -> None:
    """`snapshot_version: 1` documents from before the planner learnt image IDs, failed reads,
    load marks and Ray first sightings load and replay to the same decision."""
    old = ROOT / "tests" / "fixtures" / "snapshots-v1" / f"{example.name}.json"
    document = load_snapshot(old.read_bytes())
    result = plan(reference_cluster(), document.observed(), document.memory, document.observed_at)
    if example.name == "load-stalled":
        # A stall is judged from what sparkd remembers of the load, no longer from the log's
        # mtime (a chatty log is not progress): without that memory the load gets a window.
        assert result.phase == "loading", result.reason
        assert result.actions == ()
        return
    assert result.phase == example.phase, result.reason
    assert tuple(a.kind for a in result.actions) == example.kinds

"""The state dir against what crashes, full disks and other versions leave behind."""

from __future__ import annotations

import json
from pathlib import Path

from sparkd.model.memory import Attempt, Memory, Pause
from sparkd.runtime.state import StateDir


def test_memory_from_a_newer_version_is_read_ignoring_what_it_does_not_know(
    tmp_path: Path,
) -> None:
    state = StateDir(tmp_path)
    written = Memory(
        attempts=(Attempt(key="start_model:spark-a", at=5.0, ok=False),),
        paused=Pause(reason="disk swap", by="ops", since=1.0),
    ).model_dump(mode="json")
    written["version"] = 7
    written["gpu_fingerprints"] = {"spark-a": "abc"}
    written["paused"]["ticket"] = "OPS-12"
    state.memory_path("sparks").write_text(json.dumps(written))
    read = state.read_memory("sparks", now=10.0)
    assert read.problem is None
    assert read.version == 7
    assert sorted(read.ignored) == ["gpu_fingerprints", "paused.ticket"]
    assert read.memory.paused == Pause(reason="disk swap", by="ops", since=1.0)
    assert read.memory.attempts == (Attempt(key="start_model:spark-a", at=5.0, ok=False),)
    assert read.memory.blocked is None
    assert list(tmp_path.glob("*.corrupt-*")) == []


def test_newer_version_with_a_wrong_type_is_still_unreadable(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.memory_path("sparks").write_text(json.dumps({"version": 7, "new": 1, "paused": "yes"}))
    read = state.read_memory("sparks", 10.0)
    assert read.problem is not None
    assert read.memory.blocked is not None


def test_events_skip_a_torn_line_and_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.append_events([{"cluster": "a", "kind": "phase", "n": 1}], keep=100)
    with state.events_path().open("ab") as handle:
        handle.write(b'{"cluster": "a", "kind": "bad\xff\xfe"}\n')
        handle.write(b'{"cluster": "a", "kind": "remedi')  # torn by a crash mid-write
    assert [e["n"] for e in state.read_events_counted(10)[0]] == [1]
    assert state.events_skipped == 2
    state.append_events([{"cluster": "a", "kind": "phase", "n": 2}], keep=100)
    assert [e["n"] for e in state.read_events_counted(10)[0]] == [2, 1]
    assert state.events_skipped == 2
    assert state.read_events_counted(1)[0] == [{"cluster": "a", "kind": "phase", "n": 2}]


def test_retention_is_per_cluster(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.append_events([{"cluster": "quiet", "n": i} for i in range(3)], keep=5)
    for i in range(40):
        state.append_events([{"cluster": "noisy", "n": i}], keep=5)
    quiet = state.read_events_counted(100, "quiet")[0]
    noisy = state.read_events_counted(100, "noisy")[0]
    assert [e["n"] for e in quiet] == [2, 1, 0]
    assert [e["n"] for e in noisy][:5] == [39, 38, 37, 36, 35]
    assert len(noisy) <= 10
    lines = state.events_path().read_bytes().splitlines()
    assert len(lines) <= 13


def test_retention_counts_what_an_earlier_process_wrote(tmp_path: Path) -> None:
    first = StateDir(tmp_path)
    for i in range(9):
        first.append_events([{"cluster": "a", "n": i}], keep=5)
    second = StateDir(tmp_path)  # a restarted daemon
    for i in range(9, 12):
        second.append_events([{"cluster": "a", "n": i}], keep=5)
    # Without counting the first process's nine, three appends would never compact.
    assert [e["n"] for e in second.read_events_counted(100)[0]] == [11, 10, 9, 8, 7, 6]

"""Persisted memory, events and the state-dir lock on a real filesystem."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.model.memory import Attempt, Memory
from sparkd.runtime.state import LockHeld, StateDir


def test_memory_round_trip_and_permissions(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    memory = Memory(attempts=(Attempt(key="k", at=1.0, ok=True),), launched_at=5.0)
    state.save_memory("sparks", memory)
    read = state.read_memory("sparks", 10.0)
    assert (read.memory, read.problem) == (memory, None)
    assert stat.S_IMODE(state.path.stat().st_mode) == 0o700
    assert stat.S_IMODE(state.memory_path("sparks").stat().st_mode) == 0o600
    assert [p.name for p in state.path.iterdir()] == ["memory-sparks.json"]


def test_missing_memory_is_fresh(tmp_path: Path) -> None:
    read = StateDir(tmp_path).read_memory("x", 10.0)
    assert (read.memory, read.problem) == (Memory(), None)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"version": 0}',
        b'{"version": 1, "attempts": 5}',
        b"\xff\xfe{}",
        b"[]",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"version": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
    ids=["torn", "version-0", "wrong-type", "not-utf8", "not-object", "deep", "deep-field"],
)
def test_unreadable_memory_is_kept_aside_and_blocks(tmp_path: Path, content: bytes) -> None:
    state = StateDir(tmp_path)
    state.memory_path("sparks").write_bytes(content)
    read = state.read_memory("sparks", 100.0)
    memory, problem = read.memory, read.problem
    assert problem is not None and "unreadable" in problem
    assert memory.blocked is not None and memory.blocked.since == 100.0
    assert "not acting until resumed" in memory.blocked.reason
    [aside] = list(tmp_path.glob("memory-sparks.json.corrupt-*"))
    assert aside.read_bytes() == content
    assert str(aside) in problem
    # The latch is on disk in the file's place: a restart stays hands-off.
    again = state.read_memory("sparks", 200.0)
    assert again.problem is None
    assert again.memory.blocked == memory.blocked


def test_events_newest_first_with_retention(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    for i in range(25):
        state.append_events([{"n": i}], keep=5)
    events = state.read_events_counted(100)[0]
    assert events[0] == {"n": 24}
    assert len(events) <= 10
    assert state.read_events_counted(3)[0] == [{"n": 24}, {"n": 23}, {"n": 22}]


def test_lock_is_exclusive_across_processes(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    holder = (
        "import sys, time; from pathlib import Path; from sparkd.runtime.state import StateDir\n"
        "with StateDir(Path(sys.argv[1])).lock():\n"
        "    print('held', flush=True); time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld, match=f"pid {proc.pid}"), state.lock():
            pass
    finally:
        proc.kill()
        proc.wait()
    with state.lock():
        pass


def test_an_unchanged_memory_is_not_rewritten(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    memory = Memory(launched_at=1.0)
    state.save_memory("sparks", memory)
    path = state.memory_path("sparks")
    first = path.stat().st_ino
    for _ in range(5):
        state.save_memory("sparks", memory)
    assert path.stat().st_ino == first  # an atomic rewrite would have replaced the file
    state.save_memory("sparks", memory.model_copy(update={"launched_at": 2.0}))
    assert path.stat().st_ino != first
    assert state.read_memory("sparks", 10.0).memory.launched_at == 2.0


def test_a_remembered_pause_reason_is_read_printable(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    memory = Memory.model_validate(
        {"paused": {"reason": "ok\x1b[2J\x1b[32mhealthy\u202e", "by": "\x9bop", "since": 1.0}}
    )
    state.save_memory("c", memory)
    again = StateDir(tmp_path)
    for paused in (again.read_memory("c", 2.0).memory.paused, again.peek_memory("c").paused):
        assert paused is not None and paused.reason.startswith("ok")
        text = paused.reason + paused.by
        assert not any(c in text for c in "\x1b\x9b\u202e"), repr(text)


def test_a_retired_memory_field_still_loads_and_is_not_a_newer_version(tmp_path: Path) -> None:
    # `launch_spec` was written (always null) before it was dropped.
    state = StateDir(tmp_path)
    state.ensure()
    old = {"version": 1, "launched_at": 5.0, "launch_spec": None, "launch_nodes": ["n1"]}
    state.memory_path("c").write_text(json.dumps(old))
    read = state.read_memory("c", 10.0)
    assert read.problem is None and read.ignored == ()
    assert read.memory.launched_at == 5.0 and read.memory.launch_nodes == ("n1",)
    assert "launch_spec" not in read.memory.model_dump()

"""Reading the newest events reads the end of the file, not all of it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.runtime.state import StateDir, _lines_from_end


def bytes_read() -> int:
    """What this process has read through system calls so far (the kernel's own count)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_the_newest_events_are_read_from_the_end(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.ensure()
    detail = "x" * 1000
    lines = (
        json.dumps({"cluster": "c", "kind": "phase", "n": i, "reason": detail}, sort_keys=True)
        for i in range(20_000)
    )
    state.events_path().write_text("\n".join(lines) + "\n")
    size = state.events_path().stat().st_size
    before = bytes_read()
    newest = state.read_events_counted(10, "c")[0]
    read = bytes_read() - before
    assert [e["n"] for e in newest] == list(range(19_999, 19_989, -1))
    assert read < size / 50, (read, size)


def test_an_endless_line_is_skipped_without_being_held(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.ensure()
    with state.events_path().open("wb") as handle:
        handle.write(b'{"cluster": "c", "n": 1}\n')
        handle.write(b"y" * (3 * 1024 * 1024) + b"\n")
        handle.write(b'{"cluster": "c", "n": 2}\n')
    assert [e["n"] for e in state.read_events_counted(10)[0]] == [2, 1]
    assert state.events_skipped == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    st.booleans(),
    st.integers(1, 9),
)
def test_lines_from_the_end_are_the_lines(lines: list[bytes], newline: bool, chunk: int) -> None:
    data = b"\n".join(lines) + (b"\n" if newline and lines else b"")
    fd = os.memfd_create("events")
    try:
        os.write(fd, data)
        got = list(_lines_from_end(fd, chunk=chunk, max_line=1000))
    finally:
        os.close(fd)
    assert [g for g in got if g] == [line for line in reversed(lines) if line]

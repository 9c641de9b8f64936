"""Persisted planner memory and events in the state dir, and the single-controller lock.

Writes are atomic (temp file, fsync, rename, fsync of the directory), files 0600 in a 0700
directory. A file that cannot be read is moved aside, never silently overwritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sparkd.model.memory import MEMORY_VERSION, Memory

EVENTS_FILE = "events.jsonl"
LOCK_FILE = "sparkd.lock"
SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class LockHeld(Exception):
    """Another sparkd process (normally `sparkd run`) holds the state dir."""


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    def ensure(self) -> None:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)

    def memory_path(self, cluster: str) -> Path:
        return self.path / f"memory-{SAFE.sub('_', cluster)}.json"

    def load_memory(self, cluster: str) -> tuple[Memory, str | None]:
        """The remembered memory, or a fresh one; the second value says what went wrong."""
        path = self.memory_path(cluster)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return Memory(), None
        try:
            document = json.loads(raw)
            if not isinstance(document, dict):
                raise ValueError("not a JSON object")
            if document.get("version") != MEMORY_VERSION:
                raise ValueError(f"unsupported memory version {document.get('version')!r}")
            return Memory.model_validate(document), None
        except (ValueError, ValidationError) as exc:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            os.replace(path, aside)
            return Memory(), f"{path} unreadable ({str(exc).splitlines()[0]}); moved to {aside}"

    def peek_memory(self, cluster: str) -> Memory:
        """The remembered memory without touching the file (for commands that change nothing)."""
        try:
            return Memory.model_validate_json(self.memory_path(cluster).read_bytes())
        except (OSError, ValueError):
            return Memory()

    def save_memory(self, cluster: str, memory: Memory) -> None:
        self.ensure()
        atomic_write(self.memory_path(cluster), memory.model_dump_json(indent=1).encode())

    # -- events -------------------------------------------------------------------------

    def events_path(self) -> Path:
        return self.path / EVENTS_FILE

    def append_events(self, events: list[dict[str, Any]], keep: int) -> None:
        """Append, and rewrite to the newest `keep` once the file holds twice that."""
        if not events:
            return
        self.ensure()
        path = self.events_path()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            for event in events:
                handle.write(json.dumps(event, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > 2 * keep:
            atomic_write(path, ("\n".join(lines[-keep:]) + "\n").encode())

    def read_events(self, limit: int) -> list[dict[str, Any]]:
        """Newest first."""
        try:
            lines = self.events_path().read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        out: list[dict[str, Any]] = []
        for line in reversed(lines):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    out.append(event)
            if len(out) >= limit:
                break
        return out

    # -- lock ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive while held; the kernel drops it if the process dies."""
        self.ensure()
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
                raise LockHeld(f"state dir {self.path} is locked by pid {holder}") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)

"""Persisted planner memory and events in the state dir, and the single-controller lock.

Writes are atomic (temp file, fsync, rename, fsync of the directory), files 0600 in a 0700
directory. A memory file that cannot be read is kept aside for the operator and replaced by a
memory that holds the cluster `blocked` until `sparkd resume`: a lost pause or latch never turns
into action. Fields a newer sparkd wrote are ignored. The events file is JSON lines; a torn or
undecodable line is skipped and counted, and each cluster keeps its own newest events.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sparkd.core.text import printable_json
from sparkd.model.memory import MEMORY_VERSION, Blocked, Memory
from sparkd.runtime import logs
from sparkd.shell.files import atomic_write

EVENTS_FILE = "events.jsonl"
LOCK_FILE = "sparkd.lock"
SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class LockHeld(Exception):
    """Another sparkd process (normally `sparkd run`) holds the state dir."""


@dataclass(frozen=True)
class MemoryRead:
    memory: Memory
    # Set when the file could not be read: the memory is then a `blocked` latch.
    problem: str | None = None
    # Fields (dotted paths) a newer sparkd wrote that this one does not know; ignored.
    ignored: tuple[str, ...] = ()
    version: int = MEMORY_VERSION


def _validate_ignoring_unknown(document: dict[str, Any]) -> tuple[Memory, tuple[str, ...]]:
    """Validate, dropping fields this version does not know (at any depth); any other
    problem is an error."""
    ignored: list[str] = []
    for _ in range(64):
        try:
            return Memory.model_validate(document), tuple(ignored)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            if any(e["type"] != "extra_forbidden" for e in errors):
                raise
            for error in errors:
                _drop(document, error["loc"])
                ignored.append(".".join(str(part) for part in error["loc"]))
    raise ValueError("too many unknown fields")


def _drop(document: Any, loc: tuple[int | str, ...]) -> None:
    for part in loc[:-1]:
        document = document[part]
    if isinstance(document, dict):
        document.pop(loc[-1], None)


def _event(line: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError both are
        return None
    return event if isinstance(event, dict) else None


# The events file is read from its end in chunks of this size; a line longer than the longest
# event sparkd writes is not one of its events, skipped without being held whole.
READ_CHUNK = 64 * 1024
MAX_EVENT_LINE = 1024 * 1024
_UNREADABLE = b"\xff"


def _lines_from_end(
    fd: int, chunk: int = READ_CHUNK, max_line: int = MAX_EVENT_LINE
) -> Iterator[bytes]:
    """The file's lines, last first, reading backwards `chunk` bytes at a time; a line over
    `max_line` comes out as one undecodable line."""
    end = os.fstat(fd).st_size
    partial = b""
    too_long = False
    while end > 0:
        start = max(0, end - chunk)
        block = os.pread(fd, end - start, start)
        end = start
        *complete, last = block.split(b"\n")
        if complete:
            # `last` ends the line that continued into the blocks read before.
            yield _UNREADABLE if too_long else last + partial
            yield from reversed(complete[1:])
            partial, too_long = complete[0], False
        elif not too_long:
            partial = last + partial
        if len(partial) > max_line:
            partial, too_long = b"", True
    if too_long:
        yield _UNREADABLE
    elif partial:
        yield partial


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = logs.get()
        # Events per cluster in the file, counted once and then kept up to date by appends.
        self._counts: dict[Any, int] | None = None
        self.events_skipped = 0
        # What each memory file holds as last written by this process: an unchanged memory
        # (a steady cluster between probes) is not rewritten and fsynced every cycle.
        self._written: dict[Path, bytes] = {}

    def ensure(self) -> None:
        """Create the directory 0700 if it is not there. One that exists is never chmodded: it
        may be shared (or a symlink to something that is), and its owner chose its mode."""
        if self.path.is_dir():
            return
        try:
            self.path.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            return
        # mkdir's mode is masked by the umask; this directory is sparkd's own (opened without
        # following a symlink, should one have replaced it meanwhile).
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)

    def memory_path(self, cluster: str) -> Path:
        return self.path / f"memory-{SAFE.sub('_', cluster)}.json"

    def read_memory(self, cluster: str, now: float) -> MemoryRead:
        """The remembered memory, a fresh one when there is none, or, when the file cannot be
        read, a memory `blocked` with the reason (the file kept aside for the operator)."""
        path = self.memory_path(cluster)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return MemoryRead(Memory())
        except OSError as exc:
            return self._unreadable(path, f"{path} unreadable ({exc.strerror or exc})", now)
        try:
            # A pause reason written by an older version (or by hand) is shown by `status`,
            # `plan` and `once`: its controls go here, where the file is parsed.
            document = printable_json(json.loads(raw))
            if not isinstance(document, dict):
                raise ValueError("not a JSON object")
            version = document.get("version")
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise ValueError(f"unsupported memory version {version!r}")
            memory, ignored = _validate_ignoring_unknown(document)
        except (ValueError, ValidationError, RecursionError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return self._unreadable(path, f"{path} unreadable ({reason})", now)
        return MemoryRead(memory, ignored=ignored, version=version)

    def _unreadable(self, path: Path, problem: str, now: float) -> MemoryRead:
        """Keep the file for the operator, then put a blocked memory in its place. Until that
        write lands the unreadable file stays where it is, so a crash cannot lose the latch."""
        aside = path.with_name(f"{path.name}.corrupt-{int(now)}")
        kept = True
        try:
            os.link(path, aside)
        except FileExistsError:
            pass
        except OSError as exc:
            kept = False
            problem += f"; left in place, no copy could be kept ({exc.strerror or exc})"
        if kept:
            problem += f"; kept as {aside}"
        memory = Memory(
            blocked=Blocked(reason=f"memory {problem}; not acting until resumed", since=now)
        )
        if kept:
            with contextlib.suppress(OSError):
                self.save_memory_at(path, memory)
        return MemoryRead(memory, problem=problem)

    def peek_memory(self, cluster: str) -> Memory:
        """The remembered memory without touching the file (for commands that change nothing)."""
        try:
            document = printable_json(json.loads(self.memory_path(cluster).read_bytes()))
            return Memory.model_validate(document)
        except (OSError, ValueError, RecursionError):
            return Memory()

    def save_memory(self, cluster: str, memory: Memory) -> None:
        path = self.memory_path(cluster)
        data = memory.model_dump_json(indent=1).encode()
        if self._written.get(path) == data and path.exists():
            return
        self.ensure()
        atomic_write(path, data)
        self._written[path] = data

    @staticmethod
    def save_memory_at(path: Path, memory: Memory) -> None:
        atomic_write(path, memory.model_dump_json(indent=1).encode())

    # -- events -------------------------------------------------------------------------

    def events_path(self) -> Path:
        return self.path / EVENTS_FILE

    def append_events(self, events: list[dict[str, Any]], keep: int) -> None:
        """Append; once a cluster has twice `keep` events, keep each cluster's newest `keep`.

        A torn last line (a crash or a full disk mid-write) is closed off first, so it costs
        only itself."""
        if not events:
            return
        self.ensure()
        path = self.events_path()
        counts = self._counts if self._counts is not None else self._count_events()
        data = b"".join(json.dumps(e, sort_keys=True).encode() + b"\n" for e in events)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        for event in events:
            cluster = event.get("cluster")
            counts[cluster] = counts.get(cluster, 0) + 1
        self._counts = counts
        if max(counts.values()) > 2 * keep:
            self._compact(keep)

    def _count_events(self) -> dict[Any, int]:
        counts: dict[Any, int] = {}
        for event in self._scan()[0]:
            cluster = event.get("cluster")
            counts[cluster] = counts.get(cluster, 0) + 1
        return counts

    def _compact(self, keep: int) -> None:
        events, skipped = self._scan()
        kept: list[dict[str, Any]] = []
        per_cluster: dict[Any, int] = {}
        for event in reversed(events):
            cluster = event.get("cluster")
            if per_cluster.get(cluster, 0) < keep:
                per_cluster[cluster] = per_cluster.get(cluster, 0) + 1
                kept.append(event)
        kept.reverse()
        atomic_write(
            self.events_path(),
            b"".join(json.dumps(e, sort_keys=True).encode() + b"\n" for e in kept),
        )
        self._counts = per_cluster
        if skipped:
            self.log.warning(
                "events_unreadable_dropped", path=str(self.events_path()), lines=skipped
            )

    def _scan(self) -> tuple[list[dict[str, Any]], int]:
        """Every readable event, oldest first, and how many lines were not."""
        try:
            raw = self.events_path().read_bytes()
        except FileNotFoundError:
            return [], 0
        events: list[dict[str, Any]] = []
        skipped = 0
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            event = _event(line)
            if event is None:
                skipped += 1
            else:
                events.append(event)
        return events, skipped

    def read_events_counted(
        self, limit: int, cluster: str | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """Newest first, of one cluster or all, and how many unreadable lines this read met
        (safe in a thread). Lines that are torn, not UTF-8 or not a JSON object are skipped;
        `events_skipped` says how many the latest read met."""
        try:
            fd = os.open(self.events_path(), os.O_RDONLY)
        except FileNotFoundError:
            self.events_skipped = 0
            return [], 0
        out: list[dict[str, Any]] = []
        skipped = 0
        try:
            found = self._newest(fd, limit, cluster)
            for event in found:
                if event is None:
                    skipped += 1
                else:
                    out.append(event)
        finally:
            os.close(fd)
        if skipped and skipped != self.events_skipped:
            self.log.warning(
                "events_unreadable_skipped", path=str(self.events_path()), lines=skipped
            )
        self.events_skipped = skipped
        return out, skipped

    @staticmethod
    def _newest(fd: int, limit: int, cluster: str | None) -> Iterator[dict[str, Any] | None]:
        """The newest `limit` matching events (None for each unreadable line met on the way),
        read from the end of the file in chunks: a request for the last few events reads
        about as much as they take, whatever the file holds before them."""
        taken = 0
        for line in _lines_from_end(fd):
            if taken >= limit:
                return
            if not line.strip():
                continue
            event = _event(line)
            if event is None:
                yield None
            elif cluster is None or event.get("cluster") == cluster:
                taken += 1
                yield event

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

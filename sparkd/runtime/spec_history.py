"""The specs this box's configs ran, per cluster: what a rollback may launch.

`<state_dir>/specs-<cluster>.json`, written atomically (shell.files.atomic_write), holds the Ray
and model sections of each spec a config on this box asked for, under its hash, the newest
HISTORY_KEPT. A memory (the state dir's, or etcd's under `[ha]`) only names its last-good spec
by hash; core.deciding.known_specs takes the sections from here.

A state dir from before the history existed has no file: its own memory's last-good spec is
then taken as one this box ran (that memory was written by this box), once, when the history
is first written. Etcd's memory never seeds it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkd.core.deciding.known_specs import KnownSpec, known_of
from sparkd.core.spec import identity
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import GoodSpec
from sparkd.runtime.state import SAFE, StateDir
from sparkd.shell.files import atomic_write

HISTORY_VERSION = 1
# Specs kept per cluster, the most recently run last: many more config changes than a rollback
# ever reaches back across.
HISTORY_KEPT = 64


class SpecHistory:
    def __init__(self, state: StateDir, wall_clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.wall_clock = wall_clock

    def path(self, cluster: str) -> Path:
        return self.state.path / f"specs-{SAFE.sub('_', cluster)}.json"

    def _entries(self, cluster: str) -> list[dict[str, Any]] | None:
        """The file's entries, oldest first; None when there is no file. One that cannot be read
        holds nothing: a spec it named is not launched."""
        try:
            raw = self.path(cluster).read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            return []
        try:
            document = json.loads(raw)
            specs = document["specs"]
        except (ValueError, KeyError, TypeError):
            return []
        if not isinstance(specs, list):
            return []
        return [
            e
            for e in specs
            if isinstance(e, dict)
            and isinstance(e.get("hash"), str)
            and isinstance(e.get("ray"), dict)
            and isinstance(e.get("model"), dict)
        ]

    def known(self, cluster: str, seed: GoodSpec | None = None) -> dict[str, KnownSpec]:
        """The specs recorded for `cluster` by hash (unchecked: core.deciding.known_specs checks
        each against its hash); with no history yet, `seed` (the state dir's own last-good spec)."""
        entries = self._entries(cluster)
        if entries is None:
            entries = [] if seed is None else [_entry(seed.hash, KnownSpec(seed.ray, seed.model))]
        return {e["hash"]: KnownSpec(ray=e["ray"], model=e["model"]) for e in entries}

    def record(self, cluster: ClusterSpec, seed: GoodSpec | None = None) -> None:
        """Note that this box runs `cluster`'s spec (first written with `seed`, see known).
        Raises OSError when the state dir cannot be written."""
        entries = self._entries(cluster.name)
        if entries is None:
            entries = [] if seed is None or not seed.ray or not seed.model else [
                _entry(seed.hash, KnownSpec(seed.ray, seed.model), seed_at=self.wall_clock())
            ]  # fmt: skip
        want = identity(cluster)
        ours = _entry(want, known_of(cluster), seed_at=self.wall_clock())
        if entries and _same(entries[-1], ours):
            return
        others = [e for e in entries if e["hash"] != want]
        kept = [*others[-(HISTORY_KEPT - 1) :], ours]
        document = {"version": HISTORY_VERSION, "specs": kept}
        self.state.ensure()
        atomic_write(self.path(cluster.name), json.dumps(document, indent=1).encode())


def _entry(hash: str, known: KnownSpec, seed_at: float | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"hash": hash, "ray": known.ray, "model": known.model}
    if seed_at is not None:
        entry["recorded"] = seed_at
    return entry


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("hash", "ray", "model"))

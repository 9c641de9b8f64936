"""The public snapshot document: one cycle's observation plus the planner's memory.

Replaying a saved document (`sparkd plan --from-snapshot`) at its `observed_at` gives exactly
the plan the daemon made. Documented in docs/snapshot.md.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from sparkd.model.memory import Memory
from sparkd.model.observed import Observed

SNAPSHOT_VERSION: Final = 1


class SnapshotDocument(Observed):
    snapshot_version: Literal[1] = Field(
        SNAPSHOT_VERSION, description="the document's version: bumped by any change not an addition"
    )
    memory: Memory = Field(Memory(), description="the planner's memory at that time")

    @classmethod
    def of(cls, observed: Observed, memory: Memory) -> SnapshotDocument:
        return cls(**dict(observed), memory=memory)

    def observed(self) -> Observed:
        fields = {name: getattr(self, name) for name in Observed.model_fields}
        return Observed(**fields)


def dump_snapshot(observed: Observed, memory: Memory) -> str:
    return SnapshotDocument.of(observed, memory).model_dump_json(indent=2)


def load_snapshot(text: str | bytes) -> SnapshotDocument:
    return SnapshotDocument.model_validate_json(text)

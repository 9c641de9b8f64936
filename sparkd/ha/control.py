"""An operator's pause or resume in etcd, so it reaches whichever instance owns the cluster.

Any instance's API (so `sparkd pause`/`resume` on any box) writes `<prefix>clusters/<cluster>/
control`; the owner reads it every renewal and hears it at once through its watch. A record is
applied once to each instance's memory: the owner records the revision it applied in
`<prefix>clusters/<cluster>/control_applied/<instance>`, a write guarded by its fencing token.
An owner that takes over applies the newest record unless its own memory already took it, and
a restart never applies it again (a resume would clear a latch set after it).

The request itself is not guarded by the token on purpose: the writer is an operator, not an
owner, and the latest request wins, as it does on one box.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

# What the API takes (web.app.MAX_TEXT): a longer record was not written by sparkd.
MAX_TEXT = 1000


class Control(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    paused: bool
    reason: str = Field(default="", max_length=MAX_TEXT)
    by: str = Field(default="api", max_length=MAX_TEXT)
    # Wall clock: an operator's intent, the same on every box (given NTP).
    at: float
    until: float | None = None


def control_key(prefix: str, cluster: str) -> str:
    return f"{prefix}clusters/{cluster}/control"


def applied_key(prefix: str, cluster: str, instance: str) -> str:
    # Per instance: each keeps its memory in its own state dir.
    return f"{prefix}clusters/{cluster}/control_applied/{instance}"


def applied_revision(raw: bytes | None) -> int:
    try:
        return int(raw) if raw else 0
    except ValueError:
        return 0


def encode(control: Control) -> bytes:
    return json.dumps(control.model_dump(mode="json"), sort_keys=True).encode()


def decode(raw: bytes) -> Control | None:
    """None for a record nobody can act on (hand-written, truncated): it is logged, not applied."""
    try:
        return Control.model_validate_json(raw)
    except ValueError:
        return None

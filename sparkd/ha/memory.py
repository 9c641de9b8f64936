"""The memory and intent records in etcd: their keys and their JSON.

`<prefix>clusters/<cluster>/memory` holds the memory with every daemon-time stamp as its age at the
write (sparkd.core.remembering.handover): another box's elapsed clock means nothing here, and a new
owner resumes each grace with at least what remained. `<prefix>clusters/<cluster>/intent` names the
action about to run. Who writes them, and when, is sparkd.runtime.ha_store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from sparkd.core.remembering.handover import from_ages, to_ages
from sparkd.model.memory import Blocked, Memory

RECORD_VERSION = 1


def memory_key(prefix: str, cluster: str) -> str:
    return f"{prefix}clusters/{cluster}/memory"


def intent_key(prefix: str, cluster: str) -> str:
    return f"{prefix}clusters/{cluster}/intent"


def encode(memory: Memory, now: float, token: int, instance: str, control: int = 0) -> bytes:
    record = {
        "version": RECORD_VERSION,
        "token": token,
        "instance": instance,
        # The operator's control record (its etcd revision) this memory has taken, if any.
        "control": control,
        # Wall clock, for people only: nothing is decided on it.
        "written": time.time(),
        "memory": _hashes_only(to_ages(memory, now).model_dump(mode="json")),
    }
    return json.dumps(record, sort_keys=True).encode()


def _hashes_only(document: dict[str, Any]) -> dict[str, Any]:
    """The memory as etcd keeps it: its last-good spec by hash alone. Whoever can write the
    prefix is not the config's author, so no launchable spec is kept there (a new owner takes
    the sections from its own history, core.deciding.known_specs)."""
    good = document.get("last_good")
    if isinstance(good, dict):
        document["last_good"] = {k: v for k, v in good.items() if k not in ("ray", "model")}
    return document


def decode(
    raw: bytes, now: float, validate: Callable[[dict[str, Any]], Memory] = Memory.model_validate
) -> tuple[Memory, int]:
    """The stored memory on the daemon time whose present is `now`, and the control record it
    took; one nobody can read holds the cluster `blocked` until an operator resumes it, as an
    unreadable state file does. `validate` reads the memory document (the state dir's, which
    ignores fields a newer sparkd wrote)."""
    try:
        record = json.loads(raw)
        stored = validate(dict(record["memory"]))
        control = int(record.get("control") or 0)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        reason = f"memory in etcd unreadable ({type(exc).__name__}); not acting until resumed"
        return Memory(blocked=Blocked(reason=reason, since=now)), 0
    return from_ages(stored, now), control


def read_intent(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        return {"unreadable": True}
    return doc if isinstance(doc, dict) else {"unreadable": True}

"""The rollout part of `/status`: desired, running and last-good specs, what differs, and the
latest rollout. Daemon-time stamps are shown as wall clock; no key, not even its fingerprint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkd.core import spec
from sparkd.core.deciding import rollout

if TYPE_CHECKING:
    from sparkd.runtime.controller import Controller


def rollout_json(controller: Controller) -> dict[str, Any]:
    memory = controller.memory
    wall = controller.clock.wall_of
    snapshot = controller.view.snapshot
    serve = snapshot.serve if snapshot is not None else None
    good = memory.last_good
    record = memory.rollout
    latest: dict[str, Any] | None = None
    if record is not None:
        latest = {
            "id": record.id,
            "started": record.started,
            "from": record.from_hash,
            "to": record.to_hash,
            "result": record.result,
            "stopped_at": _at(wall, record.stopped_at),
            "accepted_at": _at(wall, record.accepted_at),
            "downtime_seconds": record.downtime,
            "rolled_back": record.rolled_back,
            "rolled_back_at": _at(wall, record.rolled_back_at),
            "restored_at": _at(wall, record.restored_at),
        }
    held = record is not None and record.result == "rolled_back"
    return {
        "desired": spec.identity(controller.cluster),
        "running": serve.spec_hash if serve is not None and serve.running else None,
        "last_good": (
            {"spec": good.hash, "at": wall(good.at), "model": good.model.get("id")}
            if good is not None
            else None
        ),
        "differs": rollout.differs(controller.cluster, good),
        "in_progress": record is not None and record.result == "in_progress",
        "rolled_back": held
        and record is not None
        and record.to_hash == spec.identity(controller.cluster),
        "latest": latest,
    }


def _at(wall: Any, stamp: float | None) -> float | None:
    return wall(stamp) if stamp is not None else None

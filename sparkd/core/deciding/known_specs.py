"""Which last-good spec a rollback may launch: only one this box's configs ran. Pure.

The memory names its last-good spec by hash. Neither store it comes from is the config's
author: etcd is written by whoever holds the prefix, the state dir by whoever holds the box's
sparkd account. So the Ray and model sections a rollback launches are never the memory's own
copy: they are those this box recorded when it ran a config with that hash (its spec history,
runtime.spec_history), each checked against the hash it is filed under. A memory whose last-good
spec, or the rollout it is in, names a spec no config here ran is refused: its last-good spec
and rollout are dropped, and the cluster is latched `blocked` until an operator has looked.

Why `blocked` rather than carrying on with the config's spec: such a record is either written
by someone who should not write it, or is a rollback in progress on a box that never ran the
spec it holds. In both cases a human decides; while the latch holds nothing is started or
stopped, so whatever serves keeps serving, and after `sparkd resume` the config's spec is the
only one left to run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkd.core.spec import identity, spec_of
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Blocked, GoodSpec, Memory

# A rollout in one of these may still launch its last-good spec (or hold it).
LIVE_ROLLOUTS = frozenset({"in_progress", "rolled_back", "rollback_failed"})
# The fields whose change widens what a launch may do on a host: its privileges (extra docker
# arguments), what of the host it sees (mounts, and the model's directories bind-mounted into
# the head's container), the environment programs in the container act on (by name), and whose
# image runs (its repository, the tag aside).
SECURITY_FIELDS = (
    "ray.extra_docker_args",
    "ray.mounts",
    "ray.env names",
    "ray.image repository",
    "model.log_dir",
    "model.cache_dir",
)


@dataclass(frozen=True)
class KnownSpec:
    """The Ray and model sections of a spec this box ran, as its config said them."""

    ray: dict[str, Any]
    model: dict[str, Any]


def known_of(spec: ClusterSpec) -> KnownSpec:
    return KnownSpec(ray=spec.ray.model_dump(mode="json"), model=spec.model.model_dump(mode="json"))


def hash_of(desired: ClusterSpec, known: KnownSpec) -> str | None:
    """The hash `known`'s sections make with the desired cluster's hosts; None when this sparkd
    cannot read them."""
    try:
        return identity(spec_of(desired, _good("", known)))
    except ValueError:
        return None


def _good(hash: str, known: KnownSpec, key: str | None = None, at: float = 0.0) -> GoodSpec:
    return GoodSpec(hash=hash, ray=known.ray, model=known.model, key=key, at=at)


def trusted(desired: ClusterSpec, history: Mapping[str, KnownSpec]) -> dict[str, KnownSpec]:
    """The specs a rollback may launch: the history's entries whose sections make the hash they
    are filed under (with today's hosts), and the desired spec."""
    found = {h: k for h, k in history.items() if hash_of(desired, k) == h}
    found[identity(desired)] = known_of(desired)
    return found


def vet(
    desired: ClusterSpec, memory: Memory, history: Mapping[str, KnownSpec], now: float
) -> tuple[Memory, str | None]:
    """`memory` with its last-good sections taken from this box's history, or, when it names a
    spec the history does not hold, refused: last-good spec and rollout dropped, `blocked` with
    the reason (returned too)."""
    known = trusted(desired, history)
    good = memory.last_good
    unknown: list[str] = []
    if good is not None and good.hash not in known:
        unknown.append(f"last-good spec {good.hash}")
    rollout = memory.rollout
    if rollout is not None and rollout.result in LIVE_ROLLOUTS:
        for what, name in (("from", rollout.from_hash), ("to", rollout.to_hash)):
            if name not in known:
                unknown.append(f"rollout {rollout.id} {what} spec {name}")
    if unknown:
        reason = (
            f"memory names {', '.join(unknown)}, which no config on this box ran: refused, "
            "nothing launched from it; check who can write the memory (the etcd prefix, the "
            "state dir), then `sparkd resume` to run the config's spec"
        )
        return memory.evolve(
            last_good=None, rollout=None, blocked=Blocked(reason=reason, since=now)
        ), reason
    if good is not None:
        ours = known[good.hash]
        memory = memory.evolve(last_good=_good(good.hash, ours, good.key, good.at))
    return memory, None


def security_differences(desired: ClusterSpec, good: KnownSpec) -> list[str]:
    """What in `good` widens a launch beyond what the config allows (SECURITY_FIELDS), each as
    `field: LAST-GOOD -> CONFIG` (as core.deciding.rollout.differs says it)."""
    ray, model = desired.ray.model_dump(mode="json"), desired.model.model_dump(mode="json")
    values: list[tuple[Any, Any]] = [
        (ray.get("extra_docker_args"), good.ray.get("extra_docker_args")),
        (ray.get("mounts"), good.ray.get("mounts")),
        (sorted(ray.get("env") or {}), sorted(good.ray.get("env") or {})),
        (repository(str(ray.get("image", ""))), repository(str(good.ray.get("image", "")))),
        (model.get("log_dir"), good.model.get("log_dir")),
        (model.get("cache_dir"), good.model.get("cache_dir")),
    ]
    return [
        f"{name}: {was!r} -> {now!r}"
        for name, (now, was) in zip(SECURITY_FIELDS, values, strict=True)
        if now != was
    ]


def repository(image: str) -> str:
    """An image reference without its digest and tag (`registry:5000/repo:tag` is
    `registry:5000/repo`): a tag's colon is the last one after the last slash."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name

"""The HA tiers' invariant checker (HA.md section 6): per cluster, every command the hosts ran
names one owner (token and instance), the tokens never go backwards, the spans in which
different tokens' commands ran never overlap, and neither do the spans of different
instances' actions in their own logs."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim.timing import Timing
from sparkd_sim.world import World


class Logged(Protocol):
    """A `sparkd run` process as the checker reads it: its name, its JSON log, its death."""

    name: str
    killed_at: float | None

    def events(self) -> list[dict[str, Any]]: ...


def stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def action_spans(instance: Logged, until: float) -> dict[str, list[tuple[float, float]]]:
    """Per cluster, [start, end] of each action in the instance's log."""
    spans: dict[str, list[tuple[float, float]]] = {}
    open_at: dict[str, float] = {}
    for event in instance.events():
        cluster = event.get("cluster")
        if not isinstance(cluster, str):
            continue
        at = stamp(event)
        if event.get("event") == "action_start":
            open_at[cluster] = at
        elif event.get("event") == "action" and cluster in open_at:
            spans.setdefault(cluster, []).append((open_at.pop(cluster), at))
    for cluster, at in open_at.items():
        spans.setdefault(cluster, []).append((at, instance.killed_at or until))
    return spans


def check_one_actor_per_cluster(world: World, instances: list[Logged]) -> int:
    """The checker; returns how many owned commands the hosts ran, so a test sees it looked."""
    by_token: dict[tuple[str, int], list[float]] = {}
    instance_of: dict[tuple[str, int], str] = {}
    newest: dict[str, int] = {}
    ran = 0
    for command in sorted(world.owned_commands(), key=lambda c: c.at):
        if command.refused:
            continue
        ran += 1
        owner = command.owner
        key = (owner.cluster, owner.token)
        assert instance_of.setdefault(key, owner.instance) == owner.instance, key
        assert owner.token >= newest.get(owner.cluster, 0), (
            f"{owner.instance} token {owner.token} ran on {command.host} at {command.at:.3f} "
            f"after token {newest[owner.cluster]}"
        )
        newest[owner.cluster] = owner.token
        by_token.setdefault(key, []).append(command.at)
    spans = sorted((c, min(ats), max(ats), t) for (c, t), ats in by_token.items())
    for (c1, _, end, t1), (c2, start, _, t2) in itertools.pairwise(spans):
        if c1 == c2:
            assert end <= start, f"{c1}: token {t1} ran until {end}, token {t2} from {start}"
    now = time.time() + 1
    logged = [(i.name, action_spans(i, now)) for i in instances]
    for index, (name1, spans1) in enumerate(logged):
        for name2, spans2 in logged[index + 1 :]:
            for cluster, found in spans1.items():
                for s1, e1 in found:
                    for s2, e2 in spans2.get(cluster, []):
                        assert e1 < s2 or e2 < s1, f"{cluster}: {name1} and {name2} both acted"
    return ran


@asynccontextmanager
async def healthy_world(
    directory: Path, first_address: str, hosts: int = 2, clusters: int = 1
) -> AsyncIterator[World]:
    """A world in the `healthy` scenario at test speed, stamped with the spec labels sparkd
    computes from its config, so nothing drifts: an owner has work only when a test makes it.
    Each test file its own `first_address`, so worlds of tests run at once never collide."""
    async with World(
        directory,
        hosts=hosts,
        clusters=clusters,
        scenario="healthy",
        timing=Timing.fast(),
        spec_labels=sparkd_spec_labels,
        first_address=first_address,
    ) as world:
        yield world

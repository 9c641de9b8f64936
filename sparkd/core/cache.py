"""vLLM's compile cache on each host: which entry a launch uses, and which old ones go.

A launch runs with `VLLM_CACHE_ROOT=<model.cache_root>/<key>`, the key named from the image
the head container runs (its ID: a re-pulled tag is a new image) and the model, so a new image
or model starts clean while a restart of the same ones loads what the last run compiled
(vLLM keys the artifacts inside by its own config hash). The launch builds the key on the host
from `docker inspect` (sparkd.shell.catalogue.actions.start_model); `cache_key` here is the same
rule, so the planner knows which entry is in use. Pruning is decided here, only while the cluster is
healthy (the serve process running then is the desired one, using the desired key), never the
entry in use, and only entries of sparkd's own naming.
"""

from __future__ import annotations

import re

from sparkd.core.judge import act
from sparkd.core.spec import SHORT_ID_DIGITS, container_name, short_image_id
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import CacheEntry, HostFacts
from sparkd.model.plan import Action

SLUG_MAX = 100
# An entry sparkd made: image digits, a dash, the model's slug. Never `.` or `..`, never a `/`.
ENTRY = re.compile(rf"[0-9a-f]{{{SHORT_ID_DIGITS}}}-[A-Za-z0-9_][A-Za-z0-9._-]{{0,{SLUG_MAX - 1}}}")
# At most this many entries pruned per host per plan: each is one bounded `rm -rf`.
PRUNE_PER_PLAN = 4


def model_slug(model_id: str) -> str:
    """The model id as one safe path component: `Qwen/Qwen3-8B` -> `Qwen--Qwen3-8B`."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_id.replace("/", "--"))
    slug = slug.strip(".-")[:SLUG_MAX].rstrip(".-")
    return slug or "model"


def image_digits(image_id: str) -> str | None:
    digits = short_image_id(image_id.strip())
    return digits if re.fullmatch(rf"[0-9a-f]{{{SHORT_ID_DIGITS}}}", digits) else None


def cache_key(image_id: str, model_id: str) -> str | None:
    """The entry a launch of `model_id` in a container of image `image_id` uses; None for an
    ID that is not one."""
    digits = image_digits(image_id)
    return f"{digits}-{model_slug(model_id)}" if digits is not None else None


def in_use(cluster: ClusterSpec, head: HostFacts) -> str | None:
    """The key of the serve process the head container runs now, from the image ID it was
    observed running; None when that is unknown."""
    container = head.container(container_name(cluster, cluster.head))
    if container is None or container.image_id is None:
        return None
    return cache_key(container.image_id, cluster.model.id)


def parse_listing(text: str) -> tuple[CacheEntry, ...]:
    """`find DIR -mindepth 1 -maxdepth 1 -printf '%T@ %f\\n'`: modification time (the host's
    own clock, used only to order the host's own entries) and name, one a line."""
    entries: list[CacheEntry] = []
    for line in text.splitlines():
        stamp, _, name = line.partition(" ")
        try:
            mtime = float(stamp)
        except ValueError:
            continue
        if name:
            entries.append(CacheEntry(name=name, mtime=mtime))
    return tuple(entries)


def judge_cache(cluster: ClusterSpec, facts: dict[str, HostFacts]) -> tuple[list[Action], str]:
    """Prune actions for each host's old entries, and a note saying why (empty: none)."""
    head = facts.get(cluster.head.name)
    key = in_use(cluster, head) if head is not None else None
    if key is None:
        return [], ""
    actions: list[Action] = []
    root = cluster.model.cache_root
    for host in cluster.hosts:
        seen = facts.get(host.name)
        if seen is None or not seen.reachable or seen.cache_entries is None:
            continue
        keep = cluster.model.cache_keep
        tight = seen.cache_free_bytes is not None and (
            seen.cache_free_bytes < cluster.model.min_disk_free
        )
        if tight:
            keep = 1
        newest: dict[str, float] = {}
        for e in seen.cache_entries:
            if e.name != key and ENTRY.fullmatch(e.name):
                newest[e.name] = max(e.mtime, newest.get(e.name, e.mtime))
        old = sorted(newest, key=lambda name: (-newest[name], name))
        for name in old[keep - 1 :][:PRUNE_PER_PLAN]:
            why = (
                f"{root} has {seen.cache_free_bytes} bytes free (below min_disk_free)"
                if tight
                else f"older than the {keep} newest kept"
            )
            actions.append(
                act(
                    "prune_cache",
                    host.name,
                    name,
                    f"compile cache entry {name} on {host.name} is not in use ({key} is) and {why}",
                )
            )
    if not actions:
        return [], ""
    return actions, f"pruning {len(actions)} old compile cache entries (in use: {key})"

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

from sparkd.core.judging.judge import act
from sparkd.core.reading.cache_entries import ENTRY, cache_key
from sparkd.core.spec import container_name
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import HostFacts
from sparkd.model.plan import Action

# At most this many entries pruned per host per plan: each is one bounded `rm -rf`.
PRUNE_PER_PLAN = 4


def in_use(cluster: ClusterSpec, head: HostFacts) -> str | None:
    """The key of the serve process the head container runs now, from the image ID it was
    observed running; None when that is unknown."""
    container = head.container(container_name(cluster, cluster.head))
    if container is None or container.image_id is None:
        return None
    return cache_key(container.image_id, cluster.model.id)


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

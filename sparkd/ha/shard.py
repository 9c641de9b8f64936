"""Which clusters an instance contends for, when several share them. Pure.

Bounded-load rendezvous hashing, kept sticky: every member holds `clusters // members` or one
more (so none above the cap, `ceil(clusters / members)`), and a cluster stays with its current
owner unless that owner holds more than its share. Which of an owner's clusters it keeps, and
where an unowned or shed cluster goes, is decided by the rendezvous score `sha256(cluster,
member)`, so every instance reading the same members and owner keys computes the same answer.
Staying put is what plain rendezvous hashing lacks once loads are capped: with the cap alone a
member joining can set off a chain of moves among the others (2.18 moves where
1.5 would do for 6 clusters on 3 members); here a join or a leave moves exactly as many
clusters as the balance requires, and an assignment already balanced is left as it is.

The fingerprint says whether two instances were given the same clusters: only members with
this instance's fingerprint share them, and one whose fingerprint differs refuses them.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Phases with no action under way and no grace window open: a handoff cannot cut one short.
SETTLED_PHASES = frozenset({"healthy", "paused", "blocked"})
# At most one handoff per instance in this many seconds: a flapping member moves nothing twice.
HANDOFF_SPACING = 60.0


def score(cluster: str, member: str) -> int:
    digest = hashlib.sha256(f"{cluster}\0{member}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def cap(clusters: int, members: int) -> int:
    return -(-clusters // members) if members else 0


def assign(
    clusters: Iterable[str], members: Iterable[str], owners: Mapping[str, str]
) -> dict[str, str]:
    """The member each cluster belongs to; `owners` maps a cluster to its current owner (an
    owner that is not among `members` counts as none). Empty without members."""
    names = sorted(set(clusters))
    live = sorted(set(members))
    if not live:
        return {}
    low, extra = divmod(len(names), len(live))
    held: dict[str, list[str]] = {m: [] for m in live}
    for name in names:
        owner = owners.get(name)
        if owner in held:
            held[owner].append(name)
    # The larger shares go to the members holding most already: that keeps the most in place.
    order = sorted(live, key=lambda m: (-len(held[m]), -score("", m), m))
    target = {m: low + (1 if i < extra else 0) for i, m in enumerate(order)}
    result: dict[str, str] = {}
    for member in live:
        kept = sorted(held[member], key=lambda c: (-score(c, member), c))[: target[member]]
        result.update((c, member) for c in kept)
    load = Counter(result.values())
    for name in names:
        if name in result:
            continue
        room = [m for m in live if load[m] < target[m]]
        chosen = max(room, key=lambda m: (score(name, m), m))
        result[name] = chosen
        load[chosen] += 1
    return result


def fingerprint(clusters: Iterable[Mapping[str, object]]) -> str:
    """A short hash of the clusters' specs as configured (the specs hold paths to secrets,
    never a secret itself), in any order."""
    canonical = sorted(json.dumps(c, sort_keys=True, default=str) for c in clusters)
    return hashlib.sha256("\n".join(canonical).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Member:
    instance: str
    fingerprint: str | None


def odd_one_out(
    mine: str, members: Iterable[Member], owner_configs: Iterable[str | None]
) -> str | None:
    """The fingerprint this instance must defer to, or None when it may share the clusters:
    one that more members carry than this one's, or as many and an owner key of another
    instance already carries it (the one acting first keeps them)."""
    counts = Counter(m.fingerprint for m in members if m.fingerprint is not None)
    counts[mine] = max(counts[mine], 1)
    held = {c for c in owner_configs if c is not None and c != mine}
    for other, count in counts.most_common():
        if other == mine:
            continue
        if count > counts[mine] or (count == counts[mine] and other in held):
            return other
    return None

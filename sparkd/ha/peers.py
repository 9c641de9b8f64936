"""What one instance knows of the others, read each renewal round: the live members (their keys
are on their session leases, so a dead one's goes with its owner keys), their fingerprints,
and from that which clusters this instance contends for now and which one it hands off.

The timings are this instance's own clock (CLOCK_BOOTTIME), never a time another box wrote:
* a cluster nobody holds is contended by whichever member it is assigned to; by anyone once it
  has gone unheld for one TTL (after its settling and its assignee's), whatever the
  assignment says, so it is never left unowned;
* a fresh instance waits one TTL (`settle`) before contending for its share of clusters it
  has not seen owned, so instances started together register first and spread them without
  handing any off; a cluster whose owner it saw go is its to take at once;
* a held cluster assigned to another member is handed off only once that member has been
  seen for two TTLs, two rounds in a row assigned it there, while the cluster is settled,
  and one handoff per HANDOFF_SPACING.
Without a fingerprint (an instance on its own, as the ownership tests run it) there is no
sharing: it contends for every cluster and hands nothing off.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from sparkd.ha.etcd import KeyValue
from sparkd.ha.shard import HANDOFF_SPACING, Member, assign, odd_one_out


def value_of(kv: KeyValue) -> dict[str, object]:
    try:
        value = json.loads(kv.value)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Peers:
    def __init__(self, instance: str, fingerprint: str | None, ttl: float, settle: float) -> None:
        self.instance = instance
        self.fingerprint = fingerprint
        self.ttl = ttl
        self.settle = settle
        # When this instance's member key was last written anew (None: not yet).
        self.registered_at: float | None = None
        # Live members sharing this fingerprint, with when each was first seen.
        self.seen: dict[str, float] = {}
        self.members: list[Member] = []
        self.assigned: dict[str, str] = {}
        # The round before's: a handoff needs two rounds that agree, never one odd reading.
        self.assigned_before: dict[str, str] = {}
        # When each cluster was first read with no owner key, since it last had one.
        self.unheld_since: dict[str, float] = {}
        # Clusters read with an owner key: losing that owner is a takeover, not a start.
        self.seen_held: set[str] = set()
        self.handed_off_at: float | None = None
        self.handoffs = 0
        # The fingerprint this instance defers to while its own differs from the others'.
        self.defer_to: str | None = None

    def member_value(self) -> dict[str, object]:
        return {} if self.fingerprint is None else {"fingerprint": self.fingerprint}

    def read(
        self,
        clusters: Iterable[str],
        member_kvs: Iterable[KeyValue],
        owners: dict[str, KeyValue],
        held: Iterable[str],
        now: float,
    ) -> None:
        """One round's members and owner keys (cluster -> key) -> the assignment."""
        names = list(clusters)
        for name in names:
            if name in owners:
                self.unheld_since.pop(name, None)
                self.seen_held.add(name)
            else:
                self.unheld_since.setdefault(name, now)
        for name in set(self.unheld_since) - set(names):
            del self.unheld_since[name]
        self.members = []
        for kv in member_kvs:
            value = value_of(kv)
            instance = str(value.get("instance", kv.key.rsplit("/", 1)[-1]))
            found = value.get("fingerprint")
            self.members.append(Member(instance, found if isinstance(found, str) else None))
        if self.fingerprint is None:
            return
        others = {m.instance for m in self.members} - {self.instance}
        holders = {name: str(value_of(kv).get("instance", "?")) for name, kv in owners.items()}
        configs = [
            c if isinstance(c := value_of(kv).get("config"), str) else None
            for name, kv in owners.items()
            if holders[name] in others
        ]
        self.defer_to = odd_one_out(self.fingerprint, self.members, configs)
        sharing = {m.instance for m in self.members if m.fingerprint == self.fingerprint} | {
            self.instance
        }
        self.seen = {m: self.seen.get(m, now) for m in sharing}
        current = {n: h for n, h in holders.items() if h in sharing} | dict.fromkeys(
            held, self.instance
        )
        self.assigned_before = self.assigned
        self.assigned = assign(names, sharing, current)

    def contend(self, cluster: str, now: float) -> bool:
        """Whether to try to acquire `cluster`, which nobody holds."""
        if self.fingerprint is None:
            return True
        if self.defer_to is not None:
            return False
        if self.registered_at is None:
            return False
        settling = now - self.registered_at < self.settle
        if settling and cluster not in self.seen_held:
            return False
        # Counted from the end of the settling, this instance's and the assignee's: the member
        # it is assigned to had its chance. One that registered seconds later (started with the
        # others on a loaded box) is still settling when this one's own settling ends.
        # Capped at one settle past this instance's own: a member whose key keeps coming
        # back must not postpone the deadline for ever.
        assignee = self.assigned.get(cluster, self.instance)
        joined = max(self.registered_at, self.seen.get(assignee, self.registered_at))
        joined = min(joined, self.registered_at + self.settle)
        since = max(self.unheld_since.get(cluster, now), joined + self.settle)
        if now - since >= self.ttl:
            return True  # orphaned: whoever it is assigned to has not taken it
        return self.assigned.get(cluster) == self.instance

    def handoff(self, held: Iterable[str], now: float, quiet: Callable[[str], bool]) -> str | None:
        """A held cluster to give to the member it is assigned to now, if one may go."""
        if self.fingerprint is None:
            return None
        if self.handed_off_at is not None and now - self.handed_off_at < HANDOFF_SPACING:
            return None
        for name in sorted(held):
            to = self.assigned.get(name, self.instance)
            if to == self.instance or now - self.seen.get(to, now) < 2 * self.ttl:
                continue
            if self.assigned_before.get(name) != to:
                continue
            if quiet(name):
                return name
        return None

    def handed_off(self, now: float) -> None:
        self.handed_off_at = now
        self.handoffs += 1

    def status(self) -> dict[str, object]:
        if self.fingerprint is None:
            return {}
        return {
            "fingerprint": self.fingerprint,
            "members": sorted(m.instance for m in self.members),
            "assigned": dict(sorted(self.assigned.items())),
            "config_mismatch": (
                None
                if self.defer_to is None
                else {"mine": self.fingerprint, "theirs": self.defer_to}
            ),
        }

"""The sharding rule (sparkd.ha.shard): who contends for which cluster, and who defers."""

from __future__ import annotations

import itertools
import json
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.ha.etcd import KeyValue
from sparkd.ha.peers import Peers
from sparkd.ha.shard import HANDOFF_SPACING, Member, assign, cap, fingerprint, odd_one_out, score

NAMES = st.text("abcdefghij-0123456789", min_size=1, max_size=6)
CLUSTERS = st.lists(NAMES.map(lambda s: f"c-{s}"), min_size=0, max_size=14, unique=True)
MEMBERS = st.lists(NAMES.map(lambda s: f"ops-{s}"), min_size=1, max_size=6, unique=True)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[str], list[str], dict[str, str]]:
    """Clusters, live members, and current owners, some of them gone or never members."""
    clusters = draw(CLUSTERS)
    members = draw(MEMBERS)
    holders = [*members, "ops-gone"]
    owners = {}
    for name in clusters:
        holder = draw(st.sampled_from([None, *holders]))
        if holder is not None:
            owners[name] = holder
    return clusters, members, owners


def fewest_moves(clusters: list[str], members: list[str], owners: dict[str, str]) -> int:
    """By brute force: the fewest clusters that change live owner in any balanced assignment."""
    low, extra = divmod(len(clusters), len(members))
    load = Counter(owners[c] for c in clusters if owners.get(c) in members)
    best = len(clusters)
    for heavier in itertools.combinations(members, extra):
        shed = sum(max(0, load[m] - low - (m in heavier)) for m in members)
        best = min(best, shed)
    return best


def moved(before: dict[str, str], after: dict[str, str], members: list[str]) -> set[str]:
    return {c for c, owner in before.items() if owner in members and after[c] != owner}


@settings(max_examples=400, deadline=None)
@given(worlds())
def test_every_cluster_one_member_none_above_the_cap_fewest_moves(
    world: tuple[list[str], list[str], dict[str, str]],
) -> None:
    clusters, members, owners = world
    result = assign(clusters, members, owners)
    assert sorted(result) == sorted(clusters)
    assert set(result.values()) <= set(members)
    load = Counter(result.values())
    low = len(clusters) // len(members)
    assert all(low <= load[m] <= cap(len(clusters), len(members)) for m in members)
    assert len(moved(owners, result, members)) == fewest_moves(clusters, members, owners)
    # Balanced already: nothing moves, so instances that computed it never hand anything off.
    assert assign(clusters, members, result) == result
    # The same answer whichever order an instance lists them in.
    assert assign(reversed(clusters), reversed(members), owners) == result


@settings(max_examples=300, deadline=None)
@given(CLUSTERS, MEMBERS, NAMES.map(lambda s: f"new-{s}"))
def test_a_member_joining_takes_only_for_itself_and_no_more_than_needed(
    clusters: list[str], members: list[str], newcomer: str
) -> None:
    before = assign(clusters, members, {})
    after = assign(clusters, [*members, newcomer], before)
    changed = moved(before, after, members)
    assert {after[c] for c in changed} <= {newcomer}
    assert len(changed) == len(clusters) // (len(members) + 1)
    assert len(changed) == fewest_moves(clusters, [*members, newcomer], before)


@settings(max_examples=300, deadline=None)
@given(CLUSTERS, MEMBERS.filter(lambda m: len(m) >= 2), st.data())
def test_a_member_leaving_moves_only_its_own_clusters(
    clusters: list[str], members: list[str], data: st.DataObject
) -> None:
    before = assign(clusters, members, {})
    gone = data.draw(st.sampled_from(members))
    rest = [m for m in members if m != gone]
    after = assign(clusters, rest, before)
    assert {c for c in clusters if after[c] != before[c]} == {
        c for c in clusters if before[c] == gone
    }


def test_six_clusters_on_three_then_four_members() -> None:
    clusters = [f"sparks-{i}" for i in range(1, 7)]
    three = assign(clusters, ["ops-a", "ops-b", "ops-c"], {})
    assert sorted(Counter(three.values()).values()) == [2, 2, 2]
    four = assign(clusters, ["ops-a", "ops-b", "ops-c", "ops-d"], three)
    assert sorted(Counter(four.values()).values()) == [1, 1, 2, 2]
    assert [c for c in clusters if four[c] != three[c]] == [
        c for c in clusters if four[c] == "ops-d"
    ]
    assert assign(clusters, [], {}) == {}


def test_fingerprint_ignores_order_and_sees_any_change() -> None:
    one = {"name": "a", "hosts": ["h1", "h2"], "interval": 30}
    two = {"name": "b", "hosts": ["h3"], "interval": 30}
    assert fingerprint([one, two]) == fingerprint([two, one])
    assert fingerprint([one, two]) != fingerprint([one, {**two, "interval": 31}])
    assert fingerprint([one]) != fingerprint([one, two])
    assert len(fingerprint([one])) == 16


def test_the_odd_instance_defers_and_a_tie_goes_to_the_one_acting() -> None:
    same = [Member("a", "f1"), Member("b", "f1"), Member("c", "f2")]
    assert odd_one_out("f2", same, []) == "f1"
    assert odd_one_out("f1", same, ["f2"]) is None
    tie = [Member("a", "f1"), Member("c", "f2")]
    assert odd_one_out("f2", tie, []) is None  # nobody acts yet: either may start
    assert odd_one_out("f2", tie, ["f1"]) == "f1"
    assert odd_one_out("f1", tie, ["f1"]) is None
    # A member from before fingerprints (none in its key) counts for nobody.
    assert odd_one_out("f1", [Member("a", None), Member("b", None)], []) is None


def kv(key: str, value: dict[str, object]) -> KeyValue:
    return KeyValue(key, json.dumps(value).encode(), 1, 1, 1)


def test_a_handoff_needs_two_rounds_that_agree() -> None:
    """One reading that moves a cluster (a key read mid-change) hands nothing off; the same
    assignment read again does."""
    members = [kv(f"m/{m}", {"instance": m, "fingerprint": "f"}) for m in ("ops-a", "ops-b")]

    def owners(held: dict[str, str]) -> dict[str, KeyValue]:
        return {c: kv(f"o/{c}", {"instance": m}) for c, m in held.items()}

    # Four clusters, a holding the two it keeps; then it also holds a third, one of its first
    # two scoring lowest for it, so that one is what it sheds.
    names = next(
        n
        for i in range(100)
        if min((n := [f"c{i}-{j}" for j in range(4)])[:3], key=lambda c: score(c, "ops-a")) != n[2]
    )
    peers = Peers("ops-a", "f", ttl=3, settle=0)
    before = {names[0]: "ops-a", names[1]: "ops-a", names[2]: "ops-b", names[3]: "ops-b"}
    peers.read(names, members, owners(before), [names[0], names[1]], now=0.0)
    assert peers.handoff(names[:2], 10.0, lambda c: True) is None  # balanced
    moved = {**before, names[2]: "ops-a"}
    mine = names[:3]
    peers.read(names, members, owners(moved), mine, now=10.0)
    shed = min(mine, key=lambda c: score(c, "ops-a"))
    assert peers.assigned[shed] == "ops-b"
    assert peers.handoff(mine, 10.0, lambda c: True) is None  # the first round saying so
    peers.read(names, members, owners(moved), mine, now=11.0)
    assert peers.handoff(mine, 11.0, lambda c: c != shed) is None  # not settled
    assert peers.handoff(mine, 11.0, lambda c: True) == shed
    peers.handed_off(11.0)
    assert peers.handoff(mine, 11.0 + HANDOFF_SPACING - 0.1, lambda c: True) is None


def test_a_member_that_registered_later_has_its_settling_before_anyone_contends() -> None:
    """Instances started together but seconds apart (a slow start on a loaded box): the first
    one's orphan delay must not run out while the cluster's assignee is still settling, or the
    first one takes clusters that are not its share and the spread needs handoffs."""
    members = [kv(f"m/{m}", {"instance": m, "fingerprint": "f"}) for m in ("ops-a", "ops-c")]
    names = ["c0", "c1"]
    peers = Peers("ops-c", "f", ttl=3, settle=3)
    peers.registered_at = 0.0
    peers.read(names, members[1:], {}, [], now=0.0)  # alone: both clusters are ops-c's
    assert not peers.contend(names[0], 1.0)  # settling
    peers.read(names, members, {}, [], now=2.2)  # ops-a registered: one of them is its share
    (name,) = [n for n, who in peers.assigned.items() if who == "ops-a"]
    for now in (3.0, 5.0, 6.1, 8.0):  # ops-a settles until 5.2, then has a TTL to take it
        peers.read(names, members, {}, [], now=now)
        assert not peers.contend(name, now), now
    peers.read(names, members, {}, [], now=8.3)
    assert peers.contend(name, 8.3)  # never left unowned: past that, an orphan


def test_a_member_whose_key_keeps_coming_back_cannot_postpone_an_orphan_for_ever() -> None:
    """A flapping member (its key gone one read, back the next) is seen anew each time it
    returns; counting its settling from then on would push the orphan deadline on for as long
    as it flaps, while it never settles long enough to take the cluster itself."""
    members = [kv(f"m/{m}", {"instance": m, "fingerprint": "f"}) for m in ("ops-a", "ops-c")]
    names = ["c0", "c1"]
    peers = Peers("ops-c", "f", ttl=3, settle=3)
    peers.registered_at = 0.0
    peers.read(names, members, {}, [], now=0.0)
    (name,) = [n for n, who in peers.assigned.items() if who == "ops-a"]
    now = 0.0
    while now < 9.0:  # ops-a gone for a read, back for the next, again and again
        now += 0.5
        peers.read(names, members[1:], {}, [], now=now)
        now += 0.5
        peers.read(names, members, {}, [], now=now)
    # At most one settle beyond this instance's own: settle (3) + settle (3) + TTL (3).
    assert peers.contend(name, now)

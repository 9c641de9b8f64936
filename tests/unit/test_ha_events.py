"""The event journal's records in etcd: keys in the journal's order, the bound, the merge of
several clusters' journals, and records nobody can read."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from sparkd.ha import events


@given(st.integers(0, 10**15), st.integers(0, 10**15))
def test_keys_sort_as_their_sequence_numbers(a: int, b: int) -> None:
    ka, kb = events.event_key("p/", "c1", a), events.event_key("p/", "c1", b)
    assert (ka < kb) == (a < b)
    assert ka.startswith(events.events_prefix("p/", "c1"))
    assert events.seq_of(ka) == a


def test_a_key_sparkd_did_not_write_has_no_sequence_number() -> None:
    assert events.seq_of("p/events/c1/notes") is None
    assert events.seq_of("p/events/c1/12") is None


@given(st.integers(0, 10**6), st.integers(1, 2000))
def test_the_bound_keeps_exactly_the_newest(last: int, keep: int) -> None:
    first = events.trimmed_below(last, keep)
    assert last - first + 1 == min(keep, last + 1)


def test_a_record_is_the_event_stamped_with_its_writer() -> None:
    event = {"at": 1.7e9, "cluster": "c1", "kind": "remediation", "host": "spark-a"}
    record = events.decode_event(events.encode_event(event, 42, "ops-a"))
    assert record == {**event, "token": 42, "instance": "ops-a"}


def test_an_unreadable_record_is_none() -> None:
    assert events.decode_event(b"\xff{") is None
    assert events.decode_event(b"[1, 2]") is None
    assert events.decode_event(json.dumps({"kind": "x"}).encode()) == {"kind": "x"}


def test_journals_merge_newest_first_by_wall_clock() -> None:
    c1 = [{"at": 30.0, "k": "c1-b"}, {"at": 10.0, "k": "c1-a"}]
    c2 = [{"at": 20.0, "k": "c2-a"}, {"at": "junk", "k": "c2-odd"}]
    assert [e["k"] for e in events.newest_first([c1, c2], 10)] == ["c1-b", "c2-a", "c1-a", "c2-odd"]
    assert [e["k"] for e in events.newest_first([c1, c2], 2)] == ["c1-b", "c2-a"]


def test_a_clusters_own_order_stands_between_events_stamped_alike() -> None:
    journal = [{"at": 5.0, "k": "second"}, {"at": 5.0, "k": "first"}]
    assert [e["k"] for e in events.newest_first([journal], 5)] == ["second", "first"]


def test_a_journals_order_stands_when_a_new_owners_clock_is_behind() -> None:
    # Newest first by key: the new owner's events after the former owner's, stamped earlier
    # by a box whose clock is behind. Across journals the merge is by wall clock.
    journal = [
        {"at": 5.0, "k": "fence_swept"},
        {"at": 6.0, "k": "adopted"},
        {"at": 9.0, "k": "old"},
    ]
    other = [{"at": 7.0, "k": "c2"}]
    merged = [e["k"] for e in events.newest_first([journal, other], 10)]
    assert [k for k in merged if k != "c2"] == ["fence_swept", "adopted", "old"]
    assert events.newest_first([journal], 2) == journal[:2]

"""The event journal in etcd: its keys, its records and its bound.

`<prefix>events/<cluster>/<seq>` holds one event of the cluster's journal, stamped with the
instance and the token that wrote it. The sequence number is zero-padded, so the keys' order is
the journal's and a range read newest first is a reverse range by key; the journal keeps the
newest `keep` events (the local journal's bound) by deleting, in the same transaction as each
append, every key below the oldest one kept. Events hold only wall-clock times (`at`, a
pause's `until`, an intent's `started`): they read the same on every box. Who writes them, and
when, is sparkd.runtime.ha_store.
"""

from __future__ import annotations

import heapq
import itertools
import json
from typing import Any

SEQ_DIGITS = 20
# No journal reaches this (10^19 events); a key at or past it was planted, and a sequence
# continued from it would outgrow SEQ_DIGITS, so that its keys sort below the trim range's end.
SEQ_LIMIT = 10 ** (SEQ_DIGITS - 1)


def events_prefix(prefix: str, cluster: str) -> str:
    return f"{prefix}events/{cluster}/"


def event_key(prefix: str, cluster: str, seq: int) -> str:
    return f"{events_prefix(prefix, cluster)}{seq:0{SEQ_DIGITS}d}"


def seq_of(key: str) -> int | None:
    """The sequence number a key under a cluster's events prefix ends in; None for a key
    sparkd did not write (one at or past SEQ_LIMIT included)."""
    tail = key.rpartition("/")[2]
    if len(tail) != SEQ_DIGITS or not tail.isascii() or not tail.isdigit():
        return None
    return int(tail) if int(tail) < SEQ_LIMIT else None


def encode_event(event: dict[str, Any], token: int, instance: str) -> bytes:
    return json.dumps({**event, "token": token, "instance": instance}, sort_keys=True).encode()


def decode_event(raw: bytes) -> dict[str, Any] | None:
    """An event as written; None for one nobody can read (skipped and counted, as a torn line
    of the local journal is)."""
    try:
        event = json.loads(raw)
    except ValueError:  # UnicodeDecodeError too
        return None
    return event if isinstance(event, dict) else None


def trimmed_below(last: int, keep: int) -> int:
    """The first sequence number kept once `last` is written: every one below it goes."""
    return max(0, last - keep + 1)


def newest_first(journals: list[list[dict[str, Any]]], limit: int) -> list[dict[str, Any]]:
    """Several journals (each newest first, in its own order) as one, at most `limit`: merged
    by wall clock across journals, never reordered within one. A cluster's order is its keys',
    which a takeover between boxes whose clocks differ (or a clock stepped back) must not
    change: the new owner's events follow the former owner's whatever their `at` says."""
    return list(itertools.islice(heapq.merge(*journals, key=lambda e: -_at(e)), limit))


def _at(event: dict[str, Any]) -> float:
    at = event.get("at")
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0

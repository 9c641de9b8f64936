"""The memory store under `[ha]`: each cluster's memory and intent record in etcd (their keys
and JSON: sparkd.ha.memory), written by its owner only.

The memory is written behind the controller; the intent record names the action about to run:
it is written with the memory that charges its attempt, before the command is sent, and cleared
with the memory that records its outcome. Every write is one
transaction compared on the owner key's create revision (the fencing token): one refused says
this instance is no longer the owner, and takes the fenced host's path (demote, event).

The state dir keeps a copy of every save: `sparkd status` and a standby read it, and it is what
a first start with `[ha]` imports when etcd has no memory for the cluster yet.

The owner's events go to the cluster's journal in etcd (sparkd.ha.events) by the same writer,
in the same guarded transactions as the memory, each batch trimming the journal to its bound;
a batch etcd did not answer is sent again with the same sequence numbers (a write that landed
unseen is put again, unchanged). Events still unwritten when this instance stops owning the
cluster are logged (`events_unwritten`), never dropped silently; the local journal has them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from sparkd.ha.etcd import EtcdError, EtcdUnavailable
from sparkd.ha.events import (
    decode_event,
    encode_event,
    event_key,
    events_prefix,
    newest_first,
    seq_of,
    trimmed_below,
)
from sparkd.ha.memory import decode, encode, intent_key, memory_key, read_intent
from sparkd.ha.ownership import Ownership
from sparkd.model.memory import Memory
from sparkd.model.plan import Action
from sparkd.runtime import logs
from sparkd.runtime.clock import elapsed
from sparkd.runtime.persist import EVENTS_KEPT
from sparkd.runtime.state import MemoryRead, StateDir, _validate_ignoring_unknown
from sparkd.runtime.store import Adopted, EventsUnreadable
from sparkd.shell.secrets import redact_json

# A write etcd did not answer is tried again after this long, while this instance owns it.
RETRY = 0.5
# Events per transaction: with the memory, the intent and the trim, well under etcd's default
# limit of 128 operations in one transaction (--max-txn-ops).
EVENTS_PER_WRITE = 100
# The journal's newest keys read at a claim, to continue after the newest sparkd wrote.
NEWEST_READ = 16
# Events made once this instance no longer holds the token: they stay in its state dir, and
# its /events shows them beside etcd's journal.
UNGUARDED_KINDS = frozenset({"fenced"})


class EtcdStore:
    def __init__(
        self,
        ha: Ownership,
        local: StateDir,
        *,
        monotonic: Callable[[], float] = elapsed,
        on_refused: Callable[[str, str], None] = lambda cluster, detail: None,
        events_kept: int = EVENTS_KEPT,
    ) -> None:
        self.ha = ha
        self.local = local
        self.monotonic = monotonic
        self.on_refused = on_refused
        self.prefix = ha.spec.prefix
        self.log = logs.get().bind(component="ha")
        # Per cluster: the token whose memory this instance continues from.
        self.adopted: dict[str, int] = {}
        # Per cluster: the newest control record the memory took (its etcd revision).
        self.controls: dict[str, int] = {}
        self._pending: dict[str, tuple[Memory, float]] = {}
        self._settled: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._writers: dict[str, asyncio.Task[None]] = {}
        # Per cluster: events not yet in etcd, oldest first, and the next sequence number
        # (read from etcd when the memory is adopted).
        self.events_kept = events_kept
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._seq: dict[str, int] = {}
        # Per cluster: writes etcd did not answer in a row.
        self._failures: dict[str, int] = {}

    def _lock(self, cluster: str) -> asyncio.Lock:
        return self._locks.setdefault(cluster, asyncio.Lock())

    def _token(self, cluster: str) -> int | None:
        """The token writes are guarded by: this instance's, once its memory was adopted."""
        token = self.ha.token(cluster)
        return token if token is not None and self.adopted.get(cluster) == token else None

    def _now(self, memory: Memory) -> float:
        # The controller's daemon time: its anchor is in the memory it saves.
        anchor = memory.clock
        return self.monotonic() + anchor.offset if anchor is not None else time.time()

    # -- the store protocol ---------------------------------------------------------------

    def read(self, cluster: str, now: float) -> MemoryRead:
        return self.local.read_memory(cluster, now)

    def save(self, cluster: str, memory: Memory) -> None:
        self.local.save_memory(cluster, memory)
        if self._token(cluster) is None:
            return
        self._pending[cluster] = (memory, self._now(memory))
        self._start_writer(cluster)

    def journal(self, cluster: str, events: list[dict[str, Any]]) -> None:
        """The owner's events go to etcd's journal too (a standby's stay in its own)."""
        if not events or self._token(cluster) is None:
            return
        self._events.setdefault(cluster, []).extend(events)
        self._start_writer(cluster)

    def _start_writer(self, cluster: str) -> None:
        writer = self._writers.get(cluster)
        if writer is None or writer.done():
            self._writers[cluster] = asyncio.get_running_loop().create_task(
                self._write_behind(cluster), name=f"ha:memory:{cluster}"
            )

    async def adopt(self, cluster: str, memory: Memory, now: float) -> Adopted | None:
        """On becoming the owner: etcd's memory (or the local one imported, when etcd has
        none), and the former owner's intent left behind. None when nothing changed."""
        token = self.ha.token(cluster)
        if token is None or self.adopted.get(cluster) == token:
            return None
        owner, key, ikey = (
            self.ha.key(cluster),
            memory_key(self.prefix, cluster),
            intent_key(self.prefix, cluster),
        )
        async with self._lock(cluster):
            self._pending.pop(cluster, None)
            self._settled.discard(cluster)
            self._unwritten(cluster, "a claim before this one")
            stored, _ = await self.ha.client.get(key)
            left, _ = await self.ha.client.get(ikey)
            # After the owner key is ours: no former owner's event can land behind this read.
            newest = await self.ha.client.newest(events_prefix(self.prefix, cluster), NEWEST_READ)
            seqs = [seq_of(kv.key) for kv in newest]
            last = next((seq for seq in seqs if seq is not None), None)
            refused = [kv.key[-40:] for kv, seq in zip(newest, seqs, strict=True) if seq is None]
            if refused:
                # Keys sparkd never writes (sorting after its own): continued from, the
                # journal's next keys would outgrow their width and every write would fail.
                self.log.warning("events_keys_refused", cluster=cluster, keys=refused)
            control = None
            if stored is None:
                raw = self._encode(cluster, memory, now, token)
                if not await self.ha.client.guarded(owner, token, {key: raw}, absent=key):
                    # Written meanwhile, or the key moved on: the next look tries again.
                    return None
                adopted, source = memory, "imported"
            else:
                (adopted, control), source = read_record(stored.value, now), "etcd"
            intent = read_intent(left.value) if left is not None else None
            # What was read is this claim's only if the owner key is still the one created at
            # the token: an instance paused past its lease between its claim and these reads
            # would otherwise continue from its successor's memory. The intent goes with it.
            # (An import was already written under the same guard.)
            deletes = [ikey] if left is not None else []
            confirmed = stored is None and left is None
            if not confirmed and not await self.ha.client.guarded(owner, token, {}, deletes):
                self.log.info("memory_adopt_refused", cluster=cluster, token=token)
                return None
            if control is not None:
                self.controls[cluster] = control
            self._seq[cluster] = 0 if last is None else last + 1
            self.adopted[cluster] = token
        self.log.info(
            "memory_adopted", cluster=cluster, token=token, source=source,
            attempts=len(adopted.attempts), paused=adopted.paused is not None,
            blocked=adopted.blocked is not None, intent=intent,
        )  # fmt: skip
        return Adopted(adopted, source, intent)

    async def continued(self, cluster: str) -> None:
        """The controller continues from the adopted memory: a pause or resume recorded while
        no owner could take it applies now, before the new owner's first action, not at its
        next renewal."""
        await self.ha.offer_controls()

    async def ready(self, cluster: str, action: Action) -> str | None:
        """Write the attempt and the intent before the command goes; why not, when it must
        not go."""
        token = self._token(cluster)
        if token is None:
            return "not owner: memory not adopted under the current token"
        intent = {
            "action": action.kind,
            "host": action.host,
            "target": action.target,
            "key": action.key,
            "token": token,
            "instance": self.ha.spec.instance,
            "started": time.time(),
        }
        puts = {intent_key(self.prefix, cluster): json.dumps(intent, sort_keys=True).encode()}
        async with self._lock(cluster):
            pending = self._pending.pop(cluster, None)
            if pending is not None:
                memory, now = pending
                puts[memory_key(self.prefix, cluster)] = self._encode(cluster, memory, now, token)
            # Cleared by the first write after the outcome (`settled`), not before.
            self._settled.discard(cluster)
            try:
                written = await self.ha.client.guarded(self.ha.key(cluster), token, puts)
            except (EtcdUnavailable, EtcdError, OSError) as exc:
                if pending is not None:
                    self._pending.setdefault(cluster, pending)
                return f"etcd unreachable: intent not recorded ({type(exc).__name__})"
        if not written:
            self._refused(cluster, token)
            return "no longer the owner: etcd refused the intent"
        return None

    def settled(self, cluster: str) -> None:
        self._settled.add(cluster)

    # -- operators' control records (sparkd.ha.control) -----------------------------------

    def current(self, cluster: str) -> bool:
        """This instance owns `cluster` and continues from etcd's memory: a control record
        is applied to that memory, never to the local one a takeover is about to replace."""
        return self._token(cluster) is not None

    def took(self, cluster: str, revision: int) -> bool:
        """Whether the memory already took the control record at `revision` (a former owner
        applied it): applied again, a resume would clear a latch set after it."""
        return revision <= self.controls.get(cluster, 0)

    def applied(self, cluster: str, revision: int) -> None:
        """The controller applied the record: every memory written from now on says so."""
        self.controls[cluster] = max(revision, self.controls.get(cluster, 0))

    async def close(self) -> None:
        """Let the writes in progress land (a graceful stop, before the lease is revoked)."""
        writers = [task for task in self._writers.values() if not task.done()]
        if writers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*writers, return_exceptions=True),
                    timeout=2 * self.ha.spec.request_timeout,
                )
        for cluster in list(self._events):
            self._unwritten(cluster, "stopping before etcd took them")

    # -- writing --------------------------------------------------------------------------

    def _encode(self, cluster: str, memory: Memory, now: float, token: int) -> bytes:
        control = self.controls.get(cluster, 0)
        return encode(memory, now, token, self.ha.spec.instance, control)

    async def _write_behind(self, cluster: str) -> None:
        while True:
            async with self._lock(cluster):
                token = self._token(cluster)
                pending = self._pending.pop(cluster, None)
                events = self._events.get(cluster, [])[:EVENTS_PER_WRITE]
                if token is None:
                    self._unwritten(cluster, "not the owner")
                    return
                if pending is None and not events:
                    return
                puts, ranges = self._journal_puts(cluster, events, token)
                if pending is not None:
                    memory, now = pending
                    puts[memory_key(self.prefix, cluster)] = self._encode(
                        cluster, memory, now, token
                    )
                deletes = [intent_key(self.prefix, cluster)] if cluster in self._settled else []
                written: bool | None
                try:
                    written = await self.ha.client.guarded(
                        self.ha.key(cluster), token, puts, deletes, ranges=ranges
                    )
                except (EtcdUnavailable, EtcdError, OSError) as exc:
                    if pending is not None:
                        self._pending.setdefault(cluster, pending)
                    failures = self._failures[cluster] = self._failures.get(cluster, 0) + 1
                    # Once is etcd's hiccup; again and again (retried every RETRY) is a fault
                    # someone has to see.
                    log = self.log.warning if failures > 1 else self.log.info
                    log(
                        "memory_unwritten", cluster=cluster, error=type(exc).__name__,
                        events=len(self._events.get(cluster, [])), failures=failures,
                    )  # fmt: skip
                    written = None
                else:
                    self._failures.pop(cluster, None)
                if written:
                    if deletes:
                        self._settled.discard(cluster)
                    if events:
                        # Appended to meanwhile (journal takes no lock), or reported unwritten
                        # by a stop that could wait no longer.
                        del self._events.get(cluster, [])[: len(events)]
                        self._seq[cluster] += len(events)
                elif written is False:
                    self._refused(cluster, token)
                    return
            if written is None:
                await asyncio.sleep(RETRY)

    def _journal_puts(
        self, cluster: str, events: list[dict[str, Any]], token: int
    ) -> tuple[dict[str, bytes], list[tuple[str, str]]]:
        """The batch's keys, from the next sequence number on, and the range that trims the
        journal to its bound once they are in."""
        if not events:
            return {}, []
        first = self._seq[cluster]
        instance = self.ha.spec.instance
        # Other boxes read these: a secret of this one never leaves it (as on /events).
        puts = {
            event_key(self.prefix, cluster, first + i): encode_event(
                redact_json(event), token, instance
            )
            for i, event in enumerate(events)
        }
        below = trimmed_below(first + len(events) - 1, self.events_kept)
        # The range ends before the first new key whatever their order: etcd refuses a
        # transaction that puts a key it also deletes.
        end = min(event_key(self.prefix, cluster, below), event_key(self.prefix, cluster, first))
        ranges = [(events_prefix(self.prefix, cluster), end)]
        return puts, ranges if below > 0 else []

    def _unwritten(self, cluster: str, why: str) -> None:
        """Events that can no longer go to etcd under the token they were made under: said,
        not dropped silently (the local journal keeps them)."""
        lost = self._events.pop(cluster, [])
        if lost:
            self.log.warning(
                "events_unwritten", cluster=cluster, count=len(lost), why=why,
                kinds=sorted({str(e.get("kind")) for e in lost}),
            )  # fmt: skip

    # -- reading --------------------------------------------------------------------------

    async def read_events(
        self, clusters: list[str], limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        """The newest `limit` events of `clusters` from etcd's journal, newest first, and how
        many records could not be read."""
        journals: list[list[dict[str, Any]]] = []
        skipped = 0
        try:
            for cluster in clusters:
                found = await self.ha.client.newest(events_prefix(self.prefix, cluster), limit)
                events = [decode_event(kv.value) for kv in found]
                skipped += sum(event is None for event in events)
                journals.append([event for event in events if event is not None])
        except (EtcdUnavailable, EtcdError) as exc:
            raise EventsUnreadable(f"no etcd ({type(exc).__name__})") from None
        journals.append(await asyncio.to_thread(self._own_unguarded, clusters))
        return newest_first(journals, limit), skipped

    def _own_unguarded(self, clusters: list[str]) -> list[dict[str, Any]]:
        """This instance's own events no token can write to etcd, from its state dir, newest
        first: `fenced` is made as the claim goes (a host's or etcd's refusal), and it is what
        an operator looks for first."""
        found, _ = self.local.read_events_counted(self.events_kept)
        instance = self.ha.spec.instance
        return [
            {**e, "instance": instance}
            for e in found
            if e.get("kind") in UNGUARDED_KINDS and e.get("cluster") in clusters
        ]

    def _refused(self, cluster: str, token: int) -> None:
        self._pending.pop(cluster, None)
        self._unwritten(cluster, "etcd refused the token")
        if self.adopted.get(cluster) == token:
            del self.adopted[cluster]
        if self.ha.token(cluster) != token:
            # An older claim's write, refused after this instance took the cluster again (or
            # after it was already demoted): the current claim stands.
            self.log.info("memory_write_refused", cluster=cluster, token=token, stale=True)
            return
        detail = f"etcd refused a write guarded by token {token}: the owner key moved on"
        self.log.warning("memory_write_refused", cluster=cluster, token=token)
        self.on_refused(cluster, detail)


def read_record(raw: bytes, now: float) -> tuple[Memory, int]:
    """A memory record, read as the state file is: fields a newer sparkd wrote (a rolling
    upgrade) are ignored, anything else unreadable latches the cluster."""
    return decode(raw, now, lambda document: _validate_ignoring_unknown(document)[0])

"""Memory through a shared store and back, as another box reads it: no grace shortened, no
attempt, pause or latch lost, whatever the two boxes' daemon clocks read."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.core.remembering.handover import from_ages, to_ages
from sparkd.ha.memory import decode, encode
from sparkd.model.memory import Attempt, Blocked, ClockAnchor, LoadMark, Memory, Pause, Rollout
from sparkd.runtime.ha_store import read_record

# Daemon time on one box: near the wall clock of its anchor, any boot.
NOW = st.floats(1.0e9, 2.0e9, allow_nan=False)
AGE = st.floats(0.0, 7 * 86400.0, allow_nan=False)


@st.composite
def memories(draw: st.DrawFn) -> tuple[Memory, float]:
    now = draw(NOW)

    def stamp() -> float:
        return now - draw(AGE)

    attempts = tuple(
        Attempt(key=draw(st.sampled_from(["restart_model:a", "start_ray_worker:b"])), at=stamp(),
                ok=draw(st.booleans()), reason="r")
        for _ in range(draw(st.integers(0, 6)))
    )  # fmt: skip
    memory = Memory(
        attempts=attempts,
        backoff_reset_at=draw(st.sampled_from([0.0, stamp()])),
        blocked=draw(st.sampled_from([None, Blocked(reason="latched", since=stamp())])),
        paused=draw(
            st.sampled_from([None, Pause(reason="p", by="x", since=now - 5, until=now + 60)])
        ),
        launched_at=stamp(),
        model_ready_at=draw(st.sampled_from([None, stamp()])),
        ray_unsettled_since=draw(st.sampled_from([None, stamp()])),
        healthy_since=draw(st.sampled_from([None, stamp()])),
        fabric_held_since=draw(st.sampled_from([None, stamp()])),
        ray_seen={"n1": stamp()},
        ray_started={"spark-a": stamp()},
        went_unreachable={"spark-b": (stamp(), stamp())},
        load_mark=LoadMark(launch=stamp(), key="k", at=stamp(), entered=stamp()),
        rollout=Rollout(id=1, started=now - 100, began_at=stamp(), from_hash="a", to_hash="b",
                        stopped_at=stamp()),
        unreachable_since={"spark-b": stamp()},
        flapped_at={"spark-a": stamp()},
        gid_moved={"spark-b": (3, 5, stamp())},
        clock=ClockAnchor(boot_id="box-a", offset=now - 1000.0, mono_at=10.0),
    )  # fmt: skip
    return memory, now


def stamps(memory: Memory) -> list[float | None]:
    mark, rollout = memory.load_mark, memory.rollout
    assert mark is not None and rollout is not None
    return [
        *(a.at for a in memory.attempts),
        memory.blocked.since if memory.blocked else None,
        memory.launched_at,
        memory.model_ready_at,
        memory.ray_unsettled_since,
        memory.healthy_since,
        memory.fabric_held_since,
        *memory.ray_seen.values(),
        *memory.ray_started.values(),
        *memory.went_unreachable["spark-b"],
        memory.unreachable_since["spark-b"],
        memory.flapped_at["spark-a"],
        memory.gid_moved["spark-b"][2],
        mark.launch,
        mark.at,
        mark.entered,
        rollout.began_at,
        rollout.stopped_at,
    ]


@settings(max_examples=200, deadline=None)
@given(memories(), NOW, st.floats(0.0, 3600.0))
def test_to_the_store_and_back_never_shortens_a_grace(
    written: tuple[Memory, float], reader_now: float, gap: float
) -> None:
    memory, writer_now = written
    # The reader's clock is another box's: any reading, read any time after the write; the
    # record goes through its JSON as etcd holds it.
    read, control = decode(encode(memory, writer_now, 7, "ops-a", 41), reader_now + gap)
    assert control == 41
    for before, after in zip(stamps(memory), stamps(read), strict=True):
        assert (before is None) == (after is None)
        if before is not None and after is not None:
            # Age at the read never exceeds age at the write: what remained still remains. Nor
            # is it less: the gap between write and read is not counted, nothing more.
            assert abs(((reader_now + gap) - after) - (writer_now - before)) < 1e-3
            assert after <= reader_now + gap
    assert [(a.key, a.ok) for a in read.attempts] == [(a.key, a.ok) for a in memory.attempts]
    assert read.paused == memory.paused
    assert (read.blocked is None) == (memory.blocked is None)
    assert [g[:2] for g in read.gid_moved.values()] == [g[:2] for g in memory.gid_moved.values()]
    assert read.backoff_reset_at == 0.0 if memory.backoff_reset_at == 0.0 else True
    assert read.rollout is not None and memory.rollout is not None
    assert read.rollout.started == memory.rollout.started
    assert read.clock is None


def test_a_grace_resumes_with_what_remained_on_a_clock_far_behind() -> None:
    # The writer's daemon time runs a day ahead of the reader's: a naive copy would make the
    # load look a day younger or, the other way round, long past its grace.
    memory = Memory(
        load_mark=LoadMark(launch=2_000_000_000.0 - 50, key="k", at=2_000_000_000.0 - 20)
    )
    read = from_ages(to_ages(memory, 2_000_000_000.0), 1_999_913_600.0)
    assert read.load_mark is not None
    assert read.load_mark.at == 1_999_913_600.0 - 20
    assert read.load_mark.launch == 1_999_913_600.0 - 50


def test_a_record_nobody_can_read_holds_the_cluster() -> None:
    read, control = decode(b'{"memory": {"attempts": "many"}}', 500.0)
    assert read.blocked is not None and "unreadable" in read.blocked.reason
    assert control == 0


def test_fields_a_newer_sparkd_wrote_are_ignored() -> None:
    record = json.loads(encode(Memory(launched_at=90.0), 100.0, 7, "ops-a"))
    record["memory"]["from_the_future"] = 1
    read, _ = read_record(json.dumps(record).encode(), 500.0)
    assert read.blocked is None and read.launched_at == 490.0
    # Without the state dir's reading, the same record would latch the cluster.
    assert decode(json.dumps(record).encode(), 500.0)[0].blocked is not None


def test_an_age_from_the_future_is_taken_as_now() -> None:
    stored = Memory(launched_at=30.0)
    assert from_ages(stored, 500.0).launched_at == 500.0

"""A last-good spec is launched only as this box's history holds it (core.deciding.known_specs), and
the history itself (runtime.spec_history)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from sparkd.core.deciding import known_specs, rollout
from sparkd.core.spec import good_of, identity
from sparkd.ha.memory import decode, encode
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory, Rollout
from sparkd.runtime.controller import Controller
from sparkd.runtime.spec_history import HISTORY_KEPT, SpecHistory
from sparkd.runtime.state import StateDir
from sparkd.shell.ssh import SshPool
from tests.support.hostile import flagged, hostile
from tests.toy import reference_cluster


def held_rollback(desired: ClusterSpec, good: ClusterSpec) -> Memory:
    """A rollout of `desired` rolled back to `good`: the planner launches and holds `good`."""
    want, was = identity(desired), identity(good)
    record = Rollout(
        id=1, started=0.0, began_at=0.0, from_hash=was, to_hash=want, result="rolled_back",
        rolled_back="failed", rolled_back_at=1.0,
    )  # fmt: skip
    return Memory(last_good=good_of(good, None, 0.0), rollout=record, rollout_seq=1)


def test_a_last_good_spec_no_config_here_ran_is_refused_and_launches_nothing() -> None:
    desired = reference_cluster()
    memory = held_rollback(desired, hostile(desired))
    # Before: the hostile spec is what the planner would launch.
    assert rollout.steer(desired, memory).spec.ray.extra_docker_args == (
        "--privileged",
        "-v",
        "/:/host",
    )
    vetted, refused = known_specs.vet(desired, memory, {}, now=5.0)
    assert refused is not None and identity(hostile(desired)) in refused
    assert vetted.blocked is not None and vetted.blocked.reason == refused
    assert vetted.last_good is None and vetted.rollout is None
    assert rollout.steer(desired, vetted).spec == desired


def test_a_known_hash_launches_the_historys_sections_not_the_memorys() -> None:
    """The memory names a spec this box ran, with hostile sections beside the hash: the
    history's sections are launched."""
    desired = reference_cluster()
    old = flagged(desired, "--max-num-seqs", "8")
    memory = held_rollback(desired, old)
    assert memory.last_good is not None
    planted = memory.last_good.model_copy(
        update={"ray": hostile(desired).ray.model_dump(mode="json")}
    )
    memory = memory.evolve(last_good=planted)
    history = {identity(old): known_specs.known_of(old)}
    vetted, refused = known_specs.vet(desired, memory, history, now=5.0)
    assert refused is None and vetted.blocked is None
    assert rollout.steer(desired, vetted).spec == old


def test_a_history_entry_that_does_not_make_its_hash_is_not_trusted() -> None:
    desired = reference_cluster()
    old = flagged(desired, "--max-num-seqs", "8")
    # Filed under the old spec's hash, holding the hostile sections.
    history = {identity(old): known_specs.known_of(hostile(desired))}
    assert identity(old) not in known_specs.trusted(desired, history)
    _, refused = known_specs.vet(desired, held_rollback(desired, old), history, now=5.0)
    assert refused is not None


def test_a_rollout_naming_an_unknown_target_is_refused() -> None:
    desired = reference_cluster()
    memory = held_rollback(desired, desired)
    assert memory.rollout is not None
    memory = memory.evolve(
        last_good=None, rollout=memory.rollout.model_copy(update={"to_hash": "0" * 12})
    )
    _, refused = known_specs.vet(desired, memory, {}, now=5.0)
    assert refused is not None and "0" * 12 in refused


def test_security_differences_name_privileges_mounts_env_names_and_image() -> None:
    desired = reference_cluster()
    found = known_specs.security_differences(desired, known_specs.known_of(hostile(desired)))
    assert [line.split(":")[0] for line in found] == ["ray.extra_docker_args", "ray.env names"]
    other = desired.ray.model_copy(
        update={"image": "evil.example/vllm:" + "1", "mounts": ("/:/host",)}
    )
    found = known_specs.security_differences(
        desired, known_specs.known_of(desired.model_copy(update={"ray": other}))
    )
    assert [line.split(":")[0] for line in found] == ["ray.mounts", "ray.image repository"]
    tag = desired.ray.model_copy(
        update={"image": known_specs.repository(desired.ray.image) + ":other"}
    )
    assert (
        known_specs.security_differences(
            desired, known_specs.known_of(desired.model_copy(update={"ray": tag}))
        )
        == []
    )
    assert known_specs.repository("registry:5000/a/b:1@sha256:ab") == "registry:5000/a/b"
    assert known_specs.repository("registry:5000/a/b") == "registry:5000/a/b"


def test_etcds_record_holds_the_last_good_spec_by_hash_alone() -> None:
    desired = reference_cluster()
    memory = held_rollback(desired, flagged(desired, "--max-num-seqs", "8"))
    raw = encode(memory, now=10.0, token=7, instance="ops-a")
    stored = json.loads(raw)["memory"]["last_good"]
    assert set(stored) == {"hash", "key", "at"}
    read, _ = decode(raw, now=10.0)
    assert read.last_good is not None and read.last_good.hash == memory.last_good.hash  # type: ignore[union-attr]
    assert read.last_good.ray == {} and read.last_good.model == {}


def test_the_history_records_each_spec_once_bounded_and_seeds_from_the_state_dir(
    tmp_path: Path,
) -> None:
    state = StateDir(tmp_path / "state")
    history = SpecHistory(state, wall_clock=lambda: 100.0)
    desired = reference_cluster()
    old = flagged(desired, "--max-num-seqs", "8")
    # No file yet: the state dir's own last-good spec is one this box ran.
    seed = good_of(old, None, 0.0)
    assert set(history.known(desired.name, seed=seed)) == {seed.hash}
    history.record(desired, seed=seed)
    assert list(history.known(desired.name)) == [seed.hash, identity(desired)]
    # Once written, a seed is never taken again.
    other = good_of(flagged(desired, "--max-num-seqs", "9"), None, 0.0)
    history.record(desired, seed=other)
    assert other.hash not in history.known(desired.name, seed=other)
    mode = history.path(desired.name).stat().st_mode & 0o777
    assert mode == 0o600
    for n in range(HISTORY_KEPT + 5):
        history.record(flagged(desired, "--max-num-seqs", str(n + 10)))
    known = history.known(desired.name)
    assert len(known) == HISTORY_KEPT
    assert identity(flagged(desired, "--max-num-seqs", str(HISTORY_KEPT + 14))) in known
    # Running an older config again makes it the newest entry, not a second one.
    history.record(desired)
    assert list(history.known(desired.name))[-1] == identity(desired)
    assert len(history.known(desired.name)) == HISTORY_KEPT


def test_an_unreadable_history_holds_nothing(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    history = SpecHistory(state)
    desired = reference_cluster()
    history.path(desired.name).write_text("{not json")
    seed = good_of(flagged(desired, "--max-num-seqs", "8"), None, 0.0)
    assert history.known(desired.name, seed=seed) == {}


def _started(state: Path, desired: ClusterSpec) -> Controller:
    return Controller(desired, cast(SshPool, None), StateDir(state), watch_events=False)


def test_a_state_dir_memory_naming_a_spec_no_config_here_ran_is_refused_at_start(
    tmp_path: Path,
) -> None:
    """The state dir's memory holds a rollback to a planted spec, and this box's history (it
    has run a config before) does not know it: the controller starts latched, says why, and
    keeps nothing launchable from it."""
    desired = reference_cluster()
    state = tmp_path / "state"
    _started(state, desired)  # this box runs the config: its history exists
    StateDir(state).save_memory(desired.name, held_rollback(desired, hostile(desired)))
    ctl = _started(state, desired)
    assert ctl.memory.blocked is not None and ctl.memory.last_good is None
    assert rollout.steer(desired, ctl.memory).spec == desired
    lines = (state / "events.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds[-2:] == ["spec_refused", "blocked"]
    assert StateDir(state).peek_memory(desired.name).last_good is None


def test_a_state_dir_from_before_the_history_keeps_its_rollback(tmp_path: Path) -> None:
    """Upgrading: no history yet, the state dir's own last-good spec is one this box ran."""
    desired = reference_cluster()
    old = flagged(desired, "--max-num-seqs", "8")
    state = tmp_path / "state"
    StateDir(state).save_memory(desired.name, held_rollback(desired, old))
    ctl = _started(state, desired)
    assert ctl.memory.blocked is None
    assert rollout.steer(desired, ctl.memory).spec == old
    assert set(SpecHistory(StateDir(state)).known(desired.name)) == {
        identity(old),
        identity(desired),
    }

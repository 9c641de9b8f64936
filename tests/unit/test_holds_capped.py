"""Holds on an answer only a human changes end (docs/decisions.md, "Every hold ends"): a host
whose SSH refuses sparkd (its key, a changed host key, a refused connection), or whose
`nvidia-smi` fails with the GPU not lost (an NVML driver/library mismatch after a driver
upgrade without a reboot), is held for `policy.hold_cap`, then `blocked` with what to check.
Before, each held for ever ("unreachable", or a model start waiting on unknown GPU processes).

The messages are the real tools': OpenSSH 9.6 `sshconnect.c` ("Host key verification failed."),
`sshconnect2.c` ("Permission denied (publickey)."), `sshconnect.c` `ssh_connect_direct`
("connect to host ... port 22: Connection refused"), and a session whose every command
fails (a broken login shell); NVML's `NVML_ERROR_LIB_RM_VERSION_MISMATCH` as nvidia-smi prints it
("Failed to initialize NVML: Driver/library version mismatch"; nvml.h: "RM detects a
driver/library version mismatch").
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import GpuProcess, HostError, Observed, RayState
from tests.support.planning import BASES, COMMON, healthy, host, looks
from tests.toy import Toy

CAP = 600.0
ANSWERS = {
    "auth": ("Permission denied (publickey).", "authorized_keys"),
    "host_key": ("Host key verification failed.", "known_hosts"),
    "refused": ("connect to host 127.0.0.2 port 22: Connection refused", "sshd runs"),
    "exit_nonzero": ("exit status 126", "login shell"),
}
NVML = "Failed to initialize NVML: Driver/library version mismatch"


def answering(toy: Toy, cluster: ClusterSpec, name: str, error: HostError | None) -> Observed:
    seen = toy.observe()
    if error is not None and name == cluster.head.name:
        # Nothing is read through a head that refuses sparkd: no Ray, serve, endpoint or probe.
        nothing = {"ray": None, "serve": None, "endpoint": None, "probe": None}
        seen = seen.model_copy(update=nothing)
    return host(seen, name, error=error) if error is not None else seen


@pytest.mark.parametrize("kind", sorted(ANSWERS))
@pytest.mark.parametrize("name", ["spark-a", "spark-b"])
def test_an_ssh_refusal_ends_blocked_with_what_to_check(kind: str, name: str) -> None:
    toy, memory = healthy()
    assert toy.cluster.policy.hold_cap == CAP
    detail, check = ANSWERS[kind]
    error = HostError(kind=kind, detail=detail)  # type: ignore[arg-type]
    plans, memory = looks(toy, memory, 12, 60.0, lambda t: answering(t, toy.cluster, name, error))
    assert plans[0].phase == "unreachable", plans[0].reason
    assert all(p.phase != "blocked" for p in plans[:9]), [p.reason for p in plans[:9]]
    last = plans[-1]
    assert last.phase == "blocked", last.reason
    assert check in last.reason and "policy.hold_cap" in last.reason
    assert not any(a.kind == "power_cycle" for p in plans for a in p.actions)
    assert memory.blocked is None  # not latched: an answer lifts it
    after, _ = looks(toy, memory, 1, 60.0)
    assert after[0].phase != "blocked", after[0].reason


def test_an_nvml_driver_library_mismatch_ends_blocked_naming_a_reboot() -> None:
    toy, memory = healthy()
    # The serve process is gone (a reboot, an exit): a model start waits on the GPUs' owners.
    toy.serve_running = False
    toy.ready = False
    plans, memory = looks(
        toy, memory, 12, 60.0, lambda t: host(t.observe(), "spark-b", gpu_error=NVML)
    )
    assert all(p.phase != "blocked" for p in plans[:9]), [p.reason for p in plans[:9]]
    last = plans[-1]
    assert last.phase == "blocked", last.reason
    assert "driver upgrade without a reboot" in last.reason and "reboot spark-b" in last.reason
    assert not any(a.kind == "start_model" for p in plans for a in p.actions)


def test_a_gpu_process_of_unknown_owner_ends_blocked_naming_docker() -> None:
    # A container's `docker top` failing for one look is a race with its exit; a GPU process
    # whose owner stays unknown past the cap (Docker answering `ps` but not `top`) held a
    # model start for ever before.
    toy, memory = healthy()
    toy.serve_running = False
    toy.ready = False
    stray = GpuProcess(pid=4242, name="python3", owner_unknown=True)

    def look(t: Toy) -> Observed:
        return host(t.observe(), "spark-b", gpu_processes=(stray,))

    plans, memory = looks(toy, memory, 12, 60.0, look)
    assert all(p.phase != "blocked" for p in plans[:9]), [p.reason for p in plans[:9]]
    last = plans[-1]
    assert last.phase == "blocked", last.reason
    assert "docker top" in last.reason and "policy.hold_cap" in last.reason
    assert not any(a.kind in ("start_model", "kill_gpu_process") for p in plans for a in p.actions)
    assert memory.blocked is None  # not latched: a readable process list lifts it


# -- the liveness property covers them ----------------------------------------------------------

WAITS = frozenset(
    {"unreachable", "cleaning", "starting_ray", "starting_model", "loading", "probing"}
)


@st.composite
def answered(draw: st.DrawFn, kinds: list[str]) -> tuple[ClusterSpec, Observed, Memory, float]:
    """An example situation in which a host (any) answers with one of `kinds` (an SSH refusal)
    or an NVML mismatch from some look on, learnt over one look; then a look up to three caps
    later."""
    toy, memory = draw(st.sampled_from(BASES)).build()
    cluster = toy.cluster
    name = draw(st.sampled_from([h.name for h in cluster.hosts]))
    kind = draw(st.sampled_from([*kinds, "nvml"]))

    def look(t: Toy) -> Observed:
        if kind == "nvml":
            return host(t.observe(), name, gpu_error=NVML)
        error = HostError(kind=kind, detail=ANSWERS[kind][0])  # type: ignore[arg-type]
        return answering(t, cluster, name, error)

    _, memory = looks(toy, memory, 1, cluster.interval, look)
    toy.advance(draw(st.floats(0.0, 3 * CAP)))
    return cluster, look(toy), memory, toy.now


@COMMON
@given(answered(sorted(ANSWERS)))
def test_every_hold_on_an_answer_ends(case: tuple[ClusterSpec, Observed, Memory, float]) -> None:
    """Property: a plan that waits on such a host ends, with nothing observed changing, within
    `policy.hold_cap` more, in an action or `blocked` with a reason."""
    cluster, seen, memory, now = case
    first = plan(cluster, seen, memory, now)
    if first.actions or first.phase not in WAITS:
        return
    later = plan(cluster, seen, memory, now + CAP + cluster.interval)
    assert later.actions or later.phase not in WAITS, (first.reason, later.reason)
    if later.phase == "blocked":
        assert later.reason


def count_short(toy: Toy) -> Observed:
    """The node list has every node ALIVE with its GPU; `ray status` counts one GPU fewer."""
    seen = toy.observe()
    assert seen.ray is not None
    counted = seen.ray.model_copy(update={"gpus_usable": toy.cluster.ray.expected_gpus - 1.0})
    return seen.model_copy(update={"ray": counted})


def test_ray_status_counting_fewer_gpus_than_the_node_list_ends_blocked() -> None:
    """A node is listed ALIVE a few seconds before `ray status` counts its GPU: a short wait.
    Past `ray.join_timeout` the two disagreeing is no longer Ray settling but a report that
    stopped updating (under autoscaler v1 `ray status` prints the report the monitor last
    wrote to Ray's KV, ray 2.60 `_private/ray_constants.py` DEBUG_AUTOSCALING_STATUS) or a
    layout the parser does not read: no node can be named, so no restart, and the model's
    start must not wait for ever either. Before, it held the start with no end."""
    toy, memory = healthy()
    toy.serve_running = False
    toy.ready = False
    join = toy.cluster.ray.join_timeout
    plans, memory = looks(toy, memory, int(join // 60) + 4, 60.0, count_short)
    assert plans[0].phase == "starting_ray" and "GPUs usable yet" in plans[0].reason
    assert not any(a.kind in ("restart_ray", "start_model") for p in plans for a in p.actions)
    last = plans[-1]
    assert last.phase == "blocked", last.reason
    assert "`ray status`" in last.reason and "ray.join_timeout" in last.reason
    assert memory.blocked is None  # not latched: `ray status` counting every GPU lifts it
    after, _ = looks(toy, memory, 1, 60.0)
    assert after[0].phase != "blocked", after[0].reason


def ageless(toy: Toy, ray: RayState | None = None) -> Observed:
    """Every container's start unknown (its `docker top` unread: sparkd takes a container's
    start from its processes' age), and Ray as given."""
    seen = toy.observe()
    hosts = tuple(
        h.model_copy(
            update={
                "containers": tuple(c.model_copy(update={"started_at": None}) for c in h.containers)
            }
        )
        for h in seen.hosts
    )
    return seen.model_copy(update={"hosts": hosts, "ray": ray if ray is not None else seen.ray})


def test_a_silent_ray_head_of_unknown_age_ends_blocked_not_restarted() -> None:
    """The head's `ray` times out and its container's age cannot be read. The age is what tells
    a head that has not answered for `ray.join_timeout` from one that just started (a restart
    of that one cuts its start short), so nothing is restarted on it; before, the wait had no
    end (phase starting_ray for ever). Past `ray.join_timeout` of sparkd's own looks it is
    `blocked` with what to check."""
    toy, memory = healthy()
    toy.serve_running = False
    toy.ready = False
    silent = RayState(error="`ray` timed out")
    plans, memory = looks(toy, memory, 8, 60.0, lambda t: ageless(t, silent))
    assert plans[0].phase == "starting_ray", plans[0].reason
    assert not any(a.kind == "restart_ray" for p in plans for a in p.actions)
    last = plans[-1]
    assert last.phase == "blocked", last.reason
    assert "docker top" in last.reason and "ray.join_timeout" in last.reason
    assert memory.blocked is None


def test_a_worker_missing_from_ray_with_unknown_age_ends_blocked_not_restarted() -> None:
    toy, memory = healthy()
    toy.serve_running = False
    toy.ready = False
    worker = toy.cluster.workers[0]

    def without_worker(t: Toy) -> Observed:
        seen = t.observe()
        assert seen.ray is not None
        nodes = tuple(n for n in seen.ray.nodes if n.ip != worker.ip)
        gpus = sum(n.gpus for n in nodes if n.alive)
        return ageless(t, seen.ray.model_copy(update={"nodes": nodes, "gpus_total": gpus}))

    plans, memory = looks(toy, memory, 8, 60.0, without_worker)
    assert "joining" in plans[0].reason, plans[0].reason
    assert not any(a.kind == "restart_ray" for p in plans for a in p.actions)
    last = plans[-1]
    assert last.phase == "blocked", last.reason
    assert "docker top" in last.reason and worker.name in last.reason

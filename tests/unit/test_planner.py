"""The planner, rule by rule: one named case per rule, each asserting phase, actions and reason."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from sparkd.core.deciding.planner import plan
from sparkd.core.remembering.remember import remember
from sparkd.core.spec import LABEL_SPEC, container_name
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Attempt, Blocked, Memory, Pause
from sparkd.model.observed import GpuProcess, ModelEndpoint, RayNode
from sparkd.model.plan import Plan
from tests.support.planning import Setup, healthy, loading
from tests.toy import Toy


@dataclass(frozen=True)
class Case:
    name: str
    setup: Setup
    phase: str
    kinds: tuple[str, ...]
    reason: str
    hosts: tuple[str, ...] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


def with_policy(toy: Toy, **changes: Any) -> None:
    toy.cluster = toy.cluster.model_copy(
        update={"policy": toy.cluster.policy.model_copy(update=changes)}
    )


def replace_container(toy: Toy, host: str, **changes: Any) -> None:
    name = container_name(toy.cluster, toy.cluster.host(host))
    box = toy.containers[host][name]
    toy.containers[host][name] = box.model_copy(update=changes)


def seed() -> tuple[Toy, Memory]:
    return Toy.seed_morning(), Memory()


def seed_worker_unreachable() -> tuple[Toy, Memory]:
    toy = Toy.seed_morning()
    toy.unreachable("spark-b")
    return toy, Memory()


def healthy_then(mutate: Callable[[Toy, Memory], Memory | None]) -> Setup:
    def setup() -> tuple[Toy, Memory]:
        toy, memory = healthy()
        changed = mutate(toy, memory)
        return toy, changed if changed is not None else memory

    return setup


def serve_gone(toy: Toy) -> None:
    """No `vllm serve` on the head, and so no model answering."""
    toy.serve_running = False
    toy.ready = False


def _head_exited(toy: Toy, memory: Memory) -> None:
    replace_container(toy, "spark-a", state="exited", status="Exited (1) 1 minute ago")
    toy.ray_nodes = []
    serve_gone(toy)


def _worker_missing_from_ray(age: float) -> Callable[[Toy, Memory], None]:
    def mutate(toy: Toy, memory: Memory) -> None:
        toy.ray_nodes = [n for n in toy.ray_nodes if n.ip != "192.168.200.13"]
        replace_container(toy, "spark-b", started_at=toy.now - age)

    return mutate


def probe_failing(outcome: str, failures_before: int, busy: bool = False) -> Setup:
    def setup() -> tuple[Toy, Memory]:
        toy, memory = healthy()
        toy.probe_style = outcome  # type: ignore[assignment]
        toy.probe_busy = busy
        return toy, memory.model_copy(update={"consecutive_failures": failures_before})

    return setup


def _ray_read_failed(since: float | None, serving: bool) -> Callable[[Toy, Memory], Memory]:
    def mutate(toy: Toy, memory: Memory) -> Memory:
        toy.ray_nodes = []  # the read failed: observe() reports Ray as not answering
        replace_container(toy, "spark-a", started_at=toy.now - 3600)
        if not serving:
            serve_gone(toy)
        unsettled = toy.now - since if since is not None else None
        return memory.model_copy(update={"ray_unsettled_since": unsettled})

    return mutate


# Each case after the builders only it uses; a case that is a healthy cluster with one change
# is named above that change (`rule`).
CASES: list[Case] = []
Mutate = Callable[[Toy, Memory], Memory | None]


def rule(
    name: str,
    phase: str,
    kinds: tuple[str, ...],
    reason: str,
    hosts: tuple[str, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> Callable[[Mutate], Mutate]:
    """Adds the case of the healthy cluster the decorated function changes."""

    def register(mutate: Mutate) -> Mutate:
        setup = healthy_then(mutate)
        CASES.append(Case(name, setup, phase, kinds, reason, hosts, kwargs or {}))
        return mutate

    return register


@rule(
    "foreign_gpu_process_with_a_stale_unit_cleans_first",
    "cleaning",
    ("stop_unit",),
    "1 stale unit(s) to stop; foreign GPU process pid 48213",
)
def _foreign_gpu_with_stale_unit(toy: Toy, memory: Memory) -> None:
    from tests.toy import Unit

    _foreign_gpu(toy, memory)
    toy.units["spark-a"]["vllm-cluster.service"] = Unit(active=True, enabled=True)


CASES += [
    Case(
        "one_failed_ray_read_while_serving_restarts_nothing",
        healthy_then(_ray_read_failed(None, serving=True)),
        "degraded",
        (),
        "but the model serves; watching",
    ),
    Case(
        "ray_not_answering_briefly_waits",
        healthy_then(_ray_read_failed(10, serving=False)),
        "starting_ray",
        (),
        "Ray head not answering",
    ),
    Case(
        "ray_not_answering_past_join_timeout_restarts_head",
        healthy_then(_ray_read_failed(300, serving=False)),
        "starting_ray",
        ("restart_ray", "restart_ray"),
        "Ray head not answering for 5m00s",
    ),
]


def _gpu_short_for(seconds: float) -> Callable[[Toy, Memory], Memory]:
    def mutate(toy: Toy, memory: Memory) -> Memory:
        _gpus_short(toy, memory)
        serve_gone(toy)
        return memory.model_copy(update={"ray_unsettled_since": toy.now - seconds})

    return mutate


CASES += [
    Case(
        "gpu_shortfall_past_join_timeout_rejoins_the_short_worker",
        healthy_then(_gpu_short_for(300)),
        "starting_ray",
        ("restart_ray",),
        "Ray node on 192.168.200.13 registered with 0 GPUs",
        hosts=("spark-b",),
    ),
]


@rule("healthy_between_probes_stays_healthy", "healthy", (), "probe reasoning_only")
def _between_probes(toy: Toy, memory: Memory) -> Memory:
    observed_probe = toy.observe().probe
    toy.probe_at = None  # no probe due this cycle
    return memory.model_copy(update={"last_probe": observed_probe})


@rule("a_launch_memory_missed_is_loading", "loading", (), "left alone while it progresses")
def _launch_memory_missed(toy: Toy, memory: Memory) -> Memory:
    from sparkd.model.plan import Action

    toy.apply(Action(kind="restart_model", host="spark-a", target="m", reason=""))
    toy.load_seconds = 10_000
    toy.advance(60)
    # Memory still says the previous launch was ready: the new launch must read as loading.
    return memory


@rule(
    "dry_run_never_latches",
    "degraded",
    (),
    "dry-run: 3 consecutive failed probes",
    kwargs={"dry_run": True},
)
def _dry_run_budget(toy: Toy, memory: Memory) -> Memory:
    return _budget_spent(toy, memory)


CASES += [
    Case(
        "seed_morning_cleans_then_starts_ray",
        seed,
        "cleaning",
        ("stop_unit",) * 4 + ("remove_container",) * 2 + ("start_ray_head", "start_ray_worker"),
        "4 stale unit(s) to stop, 2 conflicting container(s) to remove",
    ),
    Case(
        "unreachable_worker_leaves_it_alone_but_cleans_head",
        seed_worker_unreachable,
        "unreachable",
        ("stop_unit",) * 4 + ("remove_container", "start_ray_head"),
        "spark-b (worker) unreachable (unreachable: No route to host)",
        hosts=("spark-a",),
    ),
    Case("healthy_is_converged", healthy, "healthy", (), "probe reasoning_only"),
    Case(
        "healthy_with_answer",
        probe_failing("answer", 0),
        "healthy",
        (),
        "probe answer",
    ),
]


@rule(
    "worker_unreachable_touches_nothing", "unreachable", (), "spark-b (worker) unreachable (timeout"
)
def _worker_unreachable(toy: Toy, memory: Memory) -> None:
    toy.unreachable("spark-b", "timeout")


@rule("head_unreachable_touches_nothing", "unreachable", (), "spark-a (head) unreachable (refused")
def _head_unreachable(toy: Toy, memory: Memory) -> None:
    toy.unreachable("spark-a", "refused")


CASES += [
    Case(
        "head_exited_restarts_head_then_workers",
        healthy_then(_head_exited),
        "starting_ray",
        ("start_ray_head", "restart_ray"),
        "new Ray head: workers must rejoin",
    ),
]


def _spec_drift(host: str) -> Callable[[Toy, Memory], None]:
    def mutate(toy: Toy, memory: Memory) -> None:
        replace_container(toy, host, labels={"sparkd.cluster": "sparks", LABEL_SPEC: "old"})

    return mutate


CASES += [
    Case(
        "head_spec_drift_rolls_out_in_order",
        healthy_then(_spec_drift("spark-a")),
        "starting_ray",
        ("restart_ray", "restart_ray"),
        "spec drift",
    ),
    Case(
        "worker_spec_drift_restarts_only_worker",
        healthy_then(_spec_drift("spark-b")),
        "starting_ray",
        ("restart_ray",),
        "spec drift",
        hosts=("spark-b",),
    ),
    Case(
        "worker_joining_within_timeout_waits",
        healthy_then(_worker_missing_from_ray(10)),
        "starting_ray",
        (),
        "Ray node on spark-b joining",
    ),
    Case(
        "worker_not_joined_after_timeout_restarts",
        healthy_then(_worker_missing_from_ray(300)),
        "starting_ray",
        ("restart_ray",),
        "not in Ray",
        hosts=("spark-b",),
    ),
]


@rule(
    "worker_on_wrong_ip_restarts_worker",
    "starting_ray",
    ("restart_ray",),
    "10.1.230.181, not a configured data IP",
    hosts=("spark-b",),
)
def _wrong_ip(toy: Toy, memory: Memory) -> None:
    toy.ray_nodes = [n for n in toy.ray_nodes if n.ip != "192.168.200.13"]
    toy.ray_nodes.append(RayNode(node_id="node09", ip="10.1.230.181", alive=True, gpus=1.0))


@rule(
    "node_registered_without_its_gpu_is_restarted",
    "starting_ray",
    ("restart_ray",),
    "Ray node on 192.168.200.13 registered with 0 GPUs",
)
def _gpus_short(toy: Toy, memory: Memory) -> None:
    toy.ray_nodes = [
        n.model_copy(update={"gpus": 0.0}) if not n.is_head else n for n in toy.ray_nodes
    ]


@rule(
    "ray_ready_serve_missing_starts_model",
    "starting_model",
    ("start_model",),
    "vllm serve is not running",
)
def _serve_never_started(toy: Toy, memory: Memory) -> Memory:
    serve_gone(toy)
    return Memory()


@rule(
    "serve_exited_starts_model_with_log",
    "starting_model",
    ("start_model",),
    "vllm serve exited (last log: RuntimeError: NCCL error",
)
def _serve_exited(toy: Toy, memory: Memory) -> None:
    serve_gone(toy)
    toy.log_tail = ("RuntimeError: NCCL error: unhandled system error",)


@rule(
    "serve_spec_drift_restarts_model",
    "starting_model",
    ("restart_model",),
    "spec drift: serving 0ld5pec",
)
def _serve_drift(toy: Toy, memory: Memory) -> None:
    toy.serve_spec = "0ld5pec"


@rule(
    "worker_rejoined_restarts_model",
    "starting_model",
    ("restart_model",),
    "Ray nodes changed since launch (a node rejoined with a new id)",
)
def _worker_rejoined(toy: Toy, memory: Memory) -> None:
    worker_ip = "192.168.200.13"
    toy.ray_nodes = [n for n in toy.ray_nodes if n.ip != worker_ip]
    toy.ray_nodes.append(RayNode(node_id="node77", ip=worker_ip, alive=True, gpus=1.0))


CASES += [
    Case(
        "load_progressing_is_left_alone",
        loading(progress_age=30, elapsed=360),
        "loading",
        (),
        "left alone while it progresses",
    ),
    Case(
        "load_progressing_slowly_past_stall_window_is_left_alone",
        loading(progress_age=599, elapsed=3000),
        "loading",
        (),
        "loading weights",
    ),
    Case(
        "load_stalled_restarts_model",
        loading(progress_age=601, elapsed=900),
        "starting_model",
        ("restart_model",),
        "load stalled: no progress for 10m01s",
    ),
    Case(
        "load_past_timeout_restarts_even_if_progressing",
        loading(progress_age=5, elapsed=3601),
        "starting_model",
        ("restart_model",),
        "load not finished after 1h00m (load_timeout 1h00m)",
    ),
    Case(
        "load_failed_in_log_restarts_model",
        loading(progress_age=5, elapsed=120, stage="failed"),
        "starting_model",
        ("restart_model",),
        "load failed: RuntimeError: Engine core initialization failed",
    ),
    Case(
        "first_probe_failure_is_degraded",
        probe_failing("http_error", 0),
        "degraded",
        (),
        "probe http_error; failure 1 of 3",
    ),
    Case(
        "third_probe_failure_restarts_model",
        probe_failing("empty", 2),
        "degraded",
        ("restart_model",),
        "3 consecutive failed probes (last: probe empty)",
    ),
    Case(
        "garbled_counts",
        probe_failing("garbled", 2),
        "degraded",
        ("restart_model",),
        "probe garbled",
    ),
    Case(
        "not_run_never_counts",
        probe_failing("not_run", 2),
        "degraded",
        (),
        "probe could not run",
    ),
    Case(
        "busy_timeout_never_counts",
        probe_failing("timeout", 2, busy=True),
        "degraded",
        (),
        "degraded: overloaded: probe timed out",
    ),
    Case(
        "hung_timeout_counts",
        probe_failing("timeout", 2, busy=False),
        "degraded",
        ("restart_model",),
        "probe timeout",
    ),
]


@rule("endpoint_gone_after_ready_counts_probe", "degraded", (), "probe refused; failure 1 of 3")
def _endpoint_gone_after_ready(toy: Toy, memory: Memory) -> None:
    toy.ready = False
    toy.probe_at = toy.now
    toy.probe_style = "refused"


@rule(
    "foreign_gpu_process_blocks",
    "blocked",
    (),
    "foreign GPU process pid 48213 (/usr/bin/python3, 96073 MiB) on spark-a",
)
def _foreign_gpu(toy: Toy, memory: Memory) -> None:
    toy.gpu["spark-a"].append(GpuProcess(pid=48213, name="/usr/bin/python3", used_memory_mib=96073))


@rule(
    "foreign_gpu_process_killed_when_allowed",
    "cleaning",
    ("kill_gpu_process",),
    "1 foreign GPU process(es) to kill",
)
def _foreign_gpu_killable(toy: Toy, memory: Memory) -> None:
    _foreign_gpu(toy, memory)
    with_policy(toy, allow_kill_foreign_gpu=True)


@rule("graphics_process_is_harmless", "healthy", (), "probe")
def _harmless_gpu(toy: Toy, memory: Memory) -> None:
    toy.gpu["spark-a"].append(GpuProcess(pid=2558, name="/usr/lib/xorg/Xorg", used_memory_mib=18))


@rule(
    "missing_image_blocks", "blocked", (), "image hellohal2064/vllm-qwen3.5-gb10 missing on spark-b"
)
def _image_missing(toy: Toy, memory: Memory) -> Memory:
    toy.containers["spark-b"].clear()
    toy.images["spark-b"] = ["hellohal2064/vllm-glm47-gb10:latest"]
    return memory


@rule("budget_spent_latches_blocked", "blocked", (), "budget spent: restart_model")
def _budget_spent(toy: Toy, memory: Memory) -> Memory:
    toy.probe_style = "http_error"
    key = "restart_model:spark-a:/models/Qwen3.5-122B-A10B-FP8"
    attempts = tuple(Attempt(key=key, at=toy.now - 600 * i, ok=True) for i in range(1, 4))
    return memory.model_copy(update={"consecutive_failures": 2, "attempts": attempts})


@rule("backoff_withholds_repeat", "degraded", (), "backing off restart_model")
def _backing_off(toy: Toy, memory: Memory) -> Memory:
    toy.probe_style = "http_error"
    key = "restart_model:spark-a:/models/Qwen3.5-122B-A10B-FP8"
    attempts = (Attempt(key=key, at=toy.now - 10, ok=True),)
    return memory.model_copy(update={"consecutive_failures": 2, "attempts": attempts})


@rule("stale_unit_enabled_again_is_stopped", "cleaning", ("stop_unit",), "1 stale unit(s) to stop")
def _stale_unit_back(toy: Toy, memory: Memory) -> None:
    from tests.toy import Unit

    toy.units["spark-a"]["vllm-cluster.service"] = Unit(active=False, enabled=True)


@rule("inactive_disabled_unit_is_left_alone", "healthy", (), "probe")
def _stale_unit_inactive_disabled(toy: Toy, memory: Memory) -> None:
    from tests.toy import Unit

    toy.units["spark-a"]["vllm-cluster.service"] = Unit(active=False, enabled=False)


@rule("paused_plans_nothing", "paused", (), "paused by alice: maintenance")
def _paused(toy: Toy, memory: Memory) -> Memory:
    _head_exited(toy, memory)
    return memory.model_copy(
        update={"paused": Pause(reason="maintenance", by="alice", since=toy.now, until=None)}
    )


@rule(
    "expired_pause_acts",
    "starting_ray",
    ("start_ray_head", "restart_ray"),
    "Ray head container exited",
)
def _pause_expired(toy: Toy, memory: Memory) -> Memory:
    _head_exited(toy, memory)
    return memory.model_copy(
        update={"paused": Pause(reason="x", by="bob", since=toy.now - 100, until=toy.now - 1)}
    )


# An image without `ray` through its entrypoint shell (tests/fixtures/docker-real/no-ray.jsonl).
NO_RAY = "entrypoint.sh: exec: line 0: ray: not found"
EXITED_127 = f"Ray head container exited 127: {NO_RAY}"


def _head_exited_127(toy: Toy, memory: Memory) -> None:
    replace_container(
        toy, "spark-a", state="exited", status="Exited (127) 2 seconds ago", exit_code=127,
        last_line=NO_RAY,
    )  # fmt: skip
    toy.ray_nodes = []
    serve_gone(toy)


@rule(
    "head_exited_says_its_exit_code_and_last_line",
    "starting_ray",
    ("start_ray_head", "restart_ray"),
    EXITED_127,
)
def _head_exited_once(toy: Toy, memory: Memory) -> Memory:
    _head_exited_127(toy, memory)
    # Started before for another reason (it was missing): this exit is the first of its kind.
    key = "start_ray_head:spark-a:sparkd-sparks-ray-head"
    started = Attempt(key=key, at=toy.now - 600, ok=True, reason="Ray head container missing")
    return memory.model_copy(update={"attempts": (started,)})


@rule("head_exited_the_same_way_twice_is_blocked", "blocked", (), f"{NO_RAY}; a restart cannot")
def _head_exited_twice(toy: Toy, memory: Memory) -> Memory:
    _head_exited_127(toy, memory)
    key = "start_ray_head:spark-a:sparkd-sparks-ray-head"
    started = Attempt(key=key, at=toy.now - 3, ok=True, reason=EXITED_127)
    return memory.model_copy(update={"attempts": (started,)})


@rule(
    "head_exited_the_same_way_after_lasting_health_starts_again",
    "starting_ray",
    ("start_ray_head", "restart_ray"),
    EXITED_127,
)
def _head_exited_after_health(toy: Toy, memory: Memory) -> Memory:
    _head_exited_127(toy, memory)
    key = "start_ray_head:spark-a:sparkd-sparks-ray-head"
    started = Attempt(key=key, at=toy.now - 3600, ok=True, reason=EXITED_127)
    return memory.model_copy(update={"attempts": (started,), "backoff_reset_at": toy.now - 60})


@rule("blocked_latch_plans_nothing", "blocked", (), "latched; `sparkd resume sparks` to retry")
def _latched(toy: Toy, memory: Memory) -> Memory:
    _head_exited(toy, memory)
    return memory.model_copy(update={"blocked": Blocked(reason="budget spent: ...", since=1.0)})


CASES += [
    Case(
        "dry_run_plans_nothing",
        healthy_then(_head_exited),
        "starting_ray",
        (),
        "dry-run: ",
        kwargs={"dry_run": True},
    ),
]


@rule("other_model_on_port_blocks", "blocked", (), "already serves /models/GLM-4.7-Flash")
def _other_model_on_port(toy: Toy, memory: Memory) -> Memory:
    serve_gone(toy)
    toy._endpoint = lambda: ModelEndpoint(  # type: ignore[method-assign]
        status="up", health_status=200, models=("/models/GLM-4.7-Flash",)
    )
    return Memory()


@rule(
    "reboot_is_named_in_reason",
    "cleaning",
    ("remove_container", "start_ray_worker"),
    "spark-b rebooted (boot id changed)",
)
def _rebooted_note(toy: Toy, memory: Memory) -> Memory:
    toy.reboot("spark-b")
    return memory.model_copy(update={"boot_ids": {"spark-b": "boot-spark-b-1"}})


def run(case: Case) -> Plan:
    toy, memory = case.setup()
    return plan(toy.cluster, toy.observe(), memory, toy.now, **case.kwargs)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule(case: Case) -> None:
    result = run(case)
    assert result.phase == case.phase, result.reason
    assert tuple(a.kind for a in result.actions) == case.kinds, result.reason
    assert case.reason in result.reason
    if case.hosts is not None:
        assert {a.host for a in result.actions} <= set(case.hosts)
    assert result.converged == (case.phase == "healthy" and not case.kinds)
    for action in result.actions:
        assert action.reason


def test_case_names_are_unique() -> None:
    assert len({c.name for c in CASES}) == len(CASES)


def test_paused_and_dry_run_show_what_they_withhold() -> None:
    paused = run(next(c for c in CASES if c.name == "paused_plans_nothing"))
    assert [a.kind for a in paused.withheld] == ["start_ray_head", "restart_ray"]
    dry = run(next(c for c in CASES if c.name == "dry_run_plans_nothing"))
    assert [a.kind for a in dry.withheld] == ["start_ray_head", "restart_ray"]


def test_budget_latch_is_carried_for_remember() -> None:
    result = run(next(c for c in CASES if c.name == "budget_spent_latches_blocked"))
    assert result.latch is not None and result.latch.startswith("budget spent")


def test_four_different_units_are_not_one_budget() -> None:
    toy, memory = seed()
    cluster: ClusterSpec = toy.cluster
    result = plan(cluster, toy.observe(), memory, toy.now)
    keys = [a.key for a in result.actions if a.kind == "stop_unit"]
    assert len(set(keys)) == 4


def test_a_respawning_foreign_process_is_one_fight_not_a_new_pid_each_time() -> None:
    from sparkd.model.plan import ActionOutcome

    toy, memory = healthy()
    with_policy(toy, allow_kill_foreign_gpu=True, backoff_initial=1.0, backoff_max=1.0)
    kills = 0
    result = None
    for pid in range(50_000, 50_010):
        toy.gpu["spark-a"] = [GpuProcess(pid=pid, name="/usr/bin/python3", used_memory_mib=9)]
        toy.advance(5)
        result = plan(toy.cluster, toy.observe(), memory, toy.now)
        outcomes = []
        for action in result.actions:
            assert action.kind == "kill_gpu_process" and action.target == str(pid)
            kills += 1
            outcomes.append(
                ActionOutcome(action=action, result="ok", started_at=toy.now, finished_at=toy.now)
            )
        memory = remember(memory, toy.observe(), outcomes, toy.now, result)
        if result.phase == "blocked":
            break
    assert result is not None and result.phase == "blocked"
    assert kills == toy.cluster.policy.budget
    assert "kill_gpu_process" in result.reason

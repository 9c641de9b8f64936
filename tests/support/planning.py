"""What the planner's named cases and property tests share: generated situations over the
example set, a host's reading changed in a snapshot, the kinds of a plan's actions, a sound
fabric port, a healthy toy with the memory of having served it, a load that stalls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.remembering.remember import remember
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import Fabric, Observed, RayNode, RayState
from sparkd.model.plan import MODEL_STARTS, RAY_STARTS, Action, Plan
from sparkd.model.spec import HostSpec
from tests.examples import EXAMPLE_SET
from tests.toy import Toy, reference_cluster

COMMON = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STARTS = RAY_STARTS | MODEL_STARTS
BASES = [e for e in EXAMPLE_SET if e.name != "seed-morning"]


def host(observed: Observed, name: str, **update: Any) -> Observed:
    hosts = tuple(h.model_copy(update=update) if h.name == name else h for h in observed.hosts)
    return observed.model_copy(update={"hosts": hosts})


def kinds(result: Plan, host_name: str | None = None) -> set[str]:
    return {a.kind for a in result.actions if host_name is None or a.host == host_name}


@st.composite
def situations(draw: st.DrawFn) -> tuple[Toy, Memory, float]:
    example = draw(st.sampled_from(BASES))
    toy, memory = example.build()
    return toy, memory, toy.now + draw(st.floats(0, 120))


# A situation and one host of its cluster: where a property puts its fault.
Placed = tuple[Toy, Memory, float, str]


@st.composite
def situations_at_a_host(draw: st.DrawFn) -> Placed:
    toy, memory, now = draw(situations())
    return toy, memory, now, draw(st.sampled_from([h.name for h in toy.cluster.hosts]))


# The port tests/fixtures/fabric/healthy.txt shows: what a host's data link reads when sound.
SOUND = Fabric(
    mtu=9000,
    carrier_changes=2,
    rdma_device="rocep1s0f0",
    port=1,
    port_state="ACTIVE",
    phys_state="LinkUp",
    rate_gbps=200.0,
    gid_index=3,
)


# A planner case's world and memory, built when the case runs.
Setup = Callable[[], tuple[Toy, Memory]]


def served(toy: Toy, ready_for: float = 100, probed_ago: float = 60) -> Memory:
    """The memory of having launched the toy's model on its live nodes, ready `ready_for`
    seconds, last probed `probed_ago` seconds ago."""
    nodes = tuple(sorted(n.node_id for n in toy.ray_nodes if n.alive))
    return Memory(
        launched_at=toy.serve_started,
        launch_nodes=nodes,
        model_ready_at=toy.now - ready_for,
        last_probe_at=toy.now - probed_ago,
    )


def short_of_gpus_unnamed(toy: Toy, memory: Memory) -> Observed:
    """`ray status` alone (no node IPs): one GPU short, and nothing can name the missing node."""
    nodes = tuple(RayNode(node_id=n, ip="", alive=True) for n in memory.launch_nodes)
    return toy.observe().model_copy(
        update={"ray": RayState(nodes=nodes, gpus_total=1.0, ips_known=False)}
    )


def healthy() -> tuple[Toy, Memory]:
    toy = Toy.healthy()
    return toy, served(toy)


def loading(progress_age: float, elapsed: float, stage: str = "weights") -> Setup:
    def setup() -> tuple[Toy, Memory]:
        toy = Toy.healthy()
        toy.apply(Action(kind="restart_model", host="spark-a", target="m", reason=""))
        toy.load_seconds = 10 * elapsed + 10_000
        memory = Memory(launched_at=toy.serve_started)
        # sparkd watched the load until it last advanced, `progress_age` ago; then it froze.
        toy.advance(elapsed - progress_age)
        seen = toy.observe()
        memory = remember(memory, seen, (), toy.now, plan(toy.cluster, seen, memory, toy.now))
        toy.load_stalled_at = toy.now
        toy.advance(progress_age)
        if stage == "failed":
            toy.log_tail = (
                "RuntimeError: Engine core initialization failed. See root cause above. "
                "Failed core proc(s): {}",
            )
        toy.load_failed = stage == "failed"
        return toy, memory

    return setup


CLEANUPS = frozenset({"stop_unit", "remove_container", "kill_gpu_process"})


def needs_a_human(result: Plan) -> bool:
    """`blocked`, or cleaning first (a cleanup needs neither the disk nor the GPU)."""
    cleaning = result.phase == "cleaning" and bool(kinds(result) & CLEANUPS)
    return result.phase == "blocked" or cleaning


def cluster_of(count: int) -> ClusterSpec:
    """The reference cluster with `count` hosts, one GPU and one tensor-parallel rank each."""
    base = reference_cluster()
    hosts = [
        HostSpec(
            name=f"spark-{chr(ord('a') + i)}",
            address=f"10.1.230.{180 + i}",
            role="head" if i == 0 else "worker",
            data_ip=f"192.168.200.{12 + i}",
            interface=base.hosts[0].interface,
        )
        for i in range(count)
    ]
    return base.model_copy(
        update={
            "hosts": tuple(hosts),
            "ray": base.ray.model_copy(update={"expected_gpus": count}),
            "model": base.model.model_copy(update={"tensor_parallel_size": count}),
        }
    )


def looks(
    toy: Toy,
    memory: Memory,
    count: int,
    seconds: float = 60.0,
    make: Callable[[Toy], Observed] = lambda toy: toy.observe(),
) -> tuple[list[Plan], Memory]:
    """`count` cycles of the planner over the toy, `seconds` apart (what `make` observes each
    time, a probe with each), memory learnt as it goes."""
    plans = []
    for _ in range(count):
        toy.advance(seconds)
        seen = make(toy)
        made = plan(toy.cluster, seen, memory, toy.now)
        plans.append(made)
        memory = remember(memory, seen, [], toy.now, made)
    return plans, memory


def restarts(plans: list[Plan]) -> list[str]:
    """The reasons of every model restart the plans hold."""
    return [a.reason for p in plans for a in p.actions if a.kind == "restart_model"]

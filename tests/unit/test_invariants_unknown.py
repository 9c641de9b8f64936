"""Invariant 3: unknown never acts.

Replacing any single fact of a snapshot by "unknown" (its read failed) never adds a destructive
action that the known-good fact would not, and the reason names what is unknown. Docker that is
down or hung is its own finding: the host is up, what needs Docker waits, the model is probed.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import head_extras, host_facts, unreadable
from sparkd.model.memory import Memory
from sparkd.model.observed import HostFacts, Interface, ModelEndpoint, Observed, RayState
from sparkd.model.probe import ProbeResult, ProbeVerdict
from tests.examples import EXAMPLE_SET
from tests.toy import Toy

COMMON = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# What the real tools print when the read fails (iproute2 for a renamed or vanished device, the
# docker CLI with its daemon down: both rc 1).
IFACE_GONE = 'iface failed (rc 1): Device "enp1s0f0np0" does not exist.'
DOCKER_DOWN = (
    "docker failed (rc 1): Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
    "Is the docker daemon running?"
)
DOCKER_HUNG = "docker failed (timed out)"


def known_good(toy: Toy) -> Observed:
    """The example as observed, with each host's data link read and healthy."""
    seen = toy.observe()
    hosts = tuple(
        h
        if h.error is not None
        else h.model_copy(
            update={
                "interface": Interface(
                    name=toy.cluster.host(h.name).interface,
                    up=True,
                    addresses=(toy.cluster.host(h.name).ip,),
                )
            }
        )
        for h in seen.hosts
    )
    return seen.model_copy(update={"hosts": hosts})


def _host(observed: Observed, name: str, **update: object) -> Observed:
    hosts = tuple(h.model_copy(update=update) if h.name == name else h for h in observed.hosts)
    return observed.model_copy(update={"hosts": hosts})


def _docker(detail: str) -> Callable[[Observed, str, bool], Observed]:
    def unknown(observed: Observed, name: str, head: bool) -> Observed:
        found = observed.host(name)
        gpu = tuple(
            p.model_copy(update={"owner_unknown": True, "container": None})
            for p in (found.gpu_processes if found is not None else ())
        )
        changed = _host(
            observed, name, containers=(), gpu_processes=gpu, docker_error=detail, images=None
        )
        if head:
            ray = RayState(error=f"unknown: Docker not answering ({detail})")
            changed = changed.model_copy(update={"serve": None, "ray": ray})
        return changed

    return unknown


def _probe_not_run(observed: Observed, name: str, head: bool) -> Observed:
    verdict = ProbeVerdict(outcome="not_run", healthy=None, detail="channel failed")
    return observed.model_copy(
        update={"probe": ProbeResult(at=observed.observed_at, verdict=verdict)}
    )


UNKNOWNS: dict[str, Callable[[Observed, str, bool], Observed]] = {
    "interface": lambda o, n, h: _host(o, n, interface=None, interface_error=IFACE_GONE),
    "units": lambda o, n, h: _host(o, n, units=(), units_error="units failed (timed out)"),
    "gpu": lambda o, n, h: _host(o, n, gpu_processes=(), gpu_error="gpu_apps failed (rc 15)"),
    "images": lambda o, n, h: _host(o, n, images=None, image_id=None),
    "disk": lambda o, n, h: _host(o, n, disk_free_bytes=None),
    "boot_id": lambda o, n, h: _host(o, n, boot_id=None),
    "docker_down": _docker(DOCKER_DOWN),
    "docker_hung": _docker(DOCKER_HUNG),
    "ray": lambda o, n, h: o.model_copy(update={"ray": RayState(error="`ray` timed out")}),
    "serve_age": lambda o, n, h: o.model_copy(
        update={"serve": o.serve.model_copy(update={"elapsed_seconds": None}) if o.serve else None}
    ),
    "serve_spec": lambda o, n, h: o.model_copy(
        update={"serve": o.serve.model_copy(update={"spec_hash": None}) if o.serve else None}
    ),
    "serve_progress": lambda o, n, h: o.model_copy(
        update={"serve": o.serve.model_copy(update={"progress": None}) if o.serve else None}
    ),
    "serve_cpu": lambda o, n, h: o.model_copy(
        update={"serve": o.serve.model_copy(update={"cpu_seconds": None}) if o.serve else None}
    ),
    "ray_ips": lambda o, n, h: o.model_copy(
        update={
            "ray": o.ray.model_copy(
                update={
                    "ips_known": False,
                    "nodes": tuple(x.model_copy(update={"ip": ""}) for x in o.ray.nodes),
                }
            )
            if o.ray is not None
            else None
        }
    ),
    "endpoint": lambda o, n, h: o.model_copy(
        update={"endpoint": ModelEndpoint(status="error", detail="/health read failed")}
    ),
    "probe": _probe_not_run,
}
# What the reason must say when this fact is unknown on a reachable host.
NAMED = {"interface": "does not exist", "docker_down": "Docker", "docker_hung": "Docker"}


def _case(name: str) -> tuple[Toy, Memory]:
    return next(e for e in EXAMPLE_SET if e.name == name).build()


@COMMON
@given(
    st.sampled_from([e.name for e in EXAMPLE_SET]),
    st.sampled_from(sorted(UNKNOWNS)),
    st.sampled_from(["spark-a", "spark-b"]),
    st.floats(0.0, 120.0),
)
def test_a_single_unknown_never_adds_an_action(
    example: str, fact: str, host: str, later: float
) -> None:
    toy, memory = _case(example)
    good = known_good(toy)
    now = toy.now + later
    head = toy.cluster.head.name == host
    found = good.host(host)
    if found is None or not found.reachable:
        return
    unknown = UNKNOWNS[fact](good, host, head)
    known_plan = plan(toy.cluster, good, memory, now)
    unknown_plan = plan(toy.cluster, unknown, memory, now)
    acted = {(a.kind, a.host, a.target) for a in unknown_plan.actions}
    would = {(a.kind, a.host, a.target) for a in known_plan.actions}
    assert acted <= would, (fact, unknown_plan.reason, known_plan.reason)
    if fact in NAMED:
        assert NAMED[fact] in unknown_plan.reason, unknown_plan.reason
        assert unknown_plan.phase != "healthy", unknown_plan.reason


def test_a_renamed_data_interface_is_not_a_healthy_link() -> None:
    toy, memory = _case("healthy-reasoning-only")
    unknown = UNKNOWNS["interface"](known_good(toy), "spark-b", False)
    result = plan(toy.cluster, unknown, memory, toy.now)
    assert result.phase == "degraded"
    assert f"spark-b: waiting for data link: its state is unknown ({IFACE_GONE})" in result.reason
    assert result.actions == ()


def test_docker_down_on_the_head_keeps_probing_the_model() -> None:
    toy, memory = _case("healthy-reasoning-only")
    unknown = UNKNOWNS["docker_down"](known_good(toy), "spark-a", True)
    result = plan(toy.cluster, unknown, memory, toy.now)
    assert result.phase == "degraded"
    assert "spark-a (head) is up but Docker is not answering" in result.reason
    assert "unreachable" not in result.reason
    assert "probe reasoning_only" in result.reason
    assert result.learned.model_ready
    assert result.actions == ()


def test_docker_down_holds_the_restart_a_failing_model_needs() -> None:
    toy, memory = _case("three-failed-probes")
    unknown = UNKNOWNS["docker_hung"](known_good(toy), "spark-a", True)
    result = plan(toy.cluster, unknown, memory, toy.now)
    assert result.actions == ()
    assert "3 consecutive failed probes" in result.reason
    assert "holding back: Docker on spark-a not answering" in result.reason


def _sections(text: dict[str, tuple[str, int]]) -> dict[str, parsers.Section]:
    return {name: parsers.Section(body, rc) for name, (body, rc) in text.items()}


DOCKER_CLI_DOWN = (
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
    "Is the docker daemon running?"
)


def test_docker_down_reads_as_its_own_finding_not_an_unreachable_host() -> None:
    cluster = Toy.healthy().cluster
    sections = _sections(
        {
            "now": ("1796000000.0", 0),
            "boot_id": ("b0", 0),
            "containers": (DOCKER_CLI_DOWN, 1),
            "running": (DOCKER_CLI_DOWN, 1),
            "gpu_apps": ("4100, python3, 1024", 0),
            "iface": ('Device "enp1s0f0np0" does not exist.', 1),
        }
    )
    assert unreadable(sections) is None
    found: HostFacts = host_facts(cluster, cluster.head, sections, 1796000000.0)
    assert found.reachable
    assert found.docker_error is not None and DOCKER_CLI_DOWN in found.docker_error
    assert all(p.owner_unknown for p in found.gpu_processes)
    assert found.interface is None
    assert found.interface_error == IFACE_GONE
    extras = head_extras(cluster, sections, 1796000000.0)
    assert extras.serve is None
    assert extras.ray.error is not None and "Docker not answering" in extras.ray.error


def test_docker_hung_reads_as_its_own_finding() -> None:
    cluster = Toy.healthy().cluster
    sections = _sections(
        {"now": ("1796000000.0", 0), "boot_id": ("b0", 0), "containers": ("", 124)}
    )
    assert unreadable(sections) is None
    found = host_facts(cluster, cluster.workers[0], sections, 1796000000.0)
    assert found.docker_error == DOCKER_HUNG


def test_another_failed_container_listing_still_makes_the_host_unreadable() -> None:
    sections = _sections(
        {"boot_id": ("b0", 0), "containers": ("permission denied while trying to connect", 1)}
    )
    error = unreadable(sections)
    assert error is not None and error.kind == "exit_nonzero"

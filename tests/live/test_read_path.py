"""sparkd's read path end to end: fact scripts over real SSH, parsed into a snapshot, planned."""

from __future__ import annotations

from sparkd.core.deciding.planner import plan
from sparkd.model.memory import Memory
from sparkd.model.snapshot import dump_snapshot, load_snapshot
from sparkd.shell.catalogue.reads import DASHBOARD_PATHS, dashboard_reads
from sparkd.shell.observe import observe
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.daemon import mutations
from tests.support.live import Live, cluster_of

STALE_UNITS = (
    "vllm-cluster.service",
    "vllm-proxy.service",
    "vllm-embeddings.service",
    "vllm-reranker.service",
)


async def test_seed_morning_plans_the_cleanup_then_ray(seed_world: World, pool: SshPool) -> None:
    cluster = cluster_of(seed_world)
    observed = await observe(cluster, pool)
    result = plan(cluster, observed, Memory(), observed.observed_at)

    # Observing changed nothing on any host: the world's own log says so.
    assert mutations(seed_world) == []
    assert result.phase == "cleaning"
    assert [(a.kind, a.host, a.target) for a in result.actions] == [
        *(("stop_unit", "spark-a", unit) for unit in STALE_UNITS),
        ("remove_container", "spark-a", "glm-flash"),
        ("remove_container", "spark-b", "glm-flash"),
        ("start_ray_head", "spark-a", "sparkd-sparks-ray-head"),
        ("start_ray_worker", "spark-b", "sparkd-sparks-ray-worker"),
    ]


async def test_healthy_world_is_converged(healthy: Live, pool: SshPool) -> None:
    cluster = healthy.cluster
    observed = await observe(cluster, pool)
    result = plan(cluster, observed, Memory(), observed.observed_at)

    assert observed.probe is not None
    assert observed.probe.outcome == "reasoning_only"
    assert observed.probe.verdict.completion_tokens == 50
    assert result.converged, result.reason
    assert result.phase == "healthy"
    assert result.actions == ()


async def test_a_snapshot_replays_to_the_same_plan(healthy: Live, pool: SshPool) -> None:
    cluster = healthy.cluster
    observed = await observe(cluster, pool)
    memory = Memory()
    made = plan(cluster, observed, memory, observed.observed_at)

    document = load_snapshot(dump_snapshot(observed, memory))

    assert document.observed() == observed
    replayed = plan(cluster, document.observed(), document.memory, document.observed_at)
    assert replayed == made


async def test_one_fact_script_per_host_per_cycle(healthy: Live, pool: SshPool) -> None:
    """One fact script per host; the head also runs Ray's dashboard reads, each one of the fixed
    GETs the forced command admits (the key has no port forward to the dashboard)."""
    log = healthy.world.command_log
    before = len(log)
    observed = await observe(healthy.cluster, pool)
    during = log[before:]

    # The endpoint checks and the probe ran too, over direct-tcpip channels: not execs.
    assert observed.endpoint is not None and observed.endpoint.status == "up"
    assert observed.probe is not None and observed.probe.outcome == "reasoning_only"
    for host in ("spark-a", "spark-b"):
        execs = [r for r in during if r.host == host and r.source == "ssh"]
        tools = [r for r in during if r.host == host and r.source == "tool"]
        gets = [r for r in execs if "one GET from Ray" in r.command]
        scripts = [r for r in execs if r not in gets]
        assert len(scripts) == 1, scripts
        assert len(tools) >= 5  # the one script really ran every tool
        fixed = {r.command for r in dashboard_reads(healthy.cluster)}
        assert {r.command for r in gets} <= fixed, gets  # nothing but the fixed GETs
        if host == "spark-b":
            assert gets == []  # only the head has a dashboard
        else:
            assert 1 <= len(gets) <= len(DASHBOARD_PATHS), gets


async def test_no_ray_call_on_the_head_the_dashboard_answers(healthy: Live, pool: SshPool) -> None:
    """Each real `ray` call costs the head 0.6-3 s of a core: the dashboard serves the same."""
    import time

    world = healthy.world
    since = time.time()
    observed = await observe(healthy.cluster, pool, ray_status=False)
    assert observed.ray is not None and observed.ray.up and observed.ray.ips_known
    assert {n.ip for n in observed.ray.nodes} == {h.state.data_ip for h in world.hosts.values()}
    assert observed.ray.gpus_total == 2.0 and observed.ray.gpus_usable is None
    # While Ray settles, the cluster status is read too: when a listed node's GPU is usable.
    observed = await observe(healthy.cluster, pool, ray_status=True)
    assert observed.ray is not None and observed.ray.gpus_usable == 2.0
    calls = [
        r.command
        for r in world.commands("spark-a")
        if r.at >= since and r.command.split()[:1] == ["ray"]
    ]
    assert calls == [], calls


async def test_a_known_ray_reading_spares_the_head_every_ray_call(
    healthy: Live, pool: SshPool
) -> None:
    import time

    world = healthy.world
    first = await observe(healthy.cluster, pool, ray_status=False)
    assert first.ray is not None and first.ray.up and not first.ray.reused
    since = time.time()
    again = await observe(healthy.cluster, pool, known_ray=first.ray)
    assert again.ray is not None and again.ray.reused
    assert again.ray.alive_node_ids == first.ray.alive_node_ids
    # Everything else is read as always; only `ray` is not called.
    assert again.serve is not None and again.serve.running
    called = [r.command for r in world.commands("spark-a") if r.at >= since]
    assert called and not [c for c in called if c.split()[:1] == ["ray"]], called


async def test_ray_status_only_when_the_dashboard_is_silent(healthy: Live, pool: SshPool) -> None:
    import time

    world = healthy.world
    # Nothing listens on this port of the head: the channel is refused.
    cluster = cluster_of(world, ray={"dashboard_port": world.dashboard_port + 1})
    since = time.time()
    observed = await observe(cluster, pool)
    assert observed.ray is not None and observed.ray.up
    assert not observed.ray.ips_known  # read from `ray status`, which names no IPs
    assert observed.ray.gpus_total == 2.0
    calls = [
        r.command
        for r in world.commands("spark-a")
        if r.at >= since and r.command.split()[:1] == ["ray"]
    ]
    assert calls == ["ray status"], calls


async def test_a_look_runs_one_docker_ps_and_one_nvidia_smi_when_the_containers_hold_the_gpu(
    healthy: Live, pool: SshPool
) -> None:
    import time

    world = healthy.world
    since = time.time()
    observed = await observe(healthy.cluster, pool, ray_status=False)
    for host, facts in zip(("spark-a", "spark-b"), observed.hosts, strict=True):
        tools = [r.command for r in world.commands(host) if r.at >= since and r.source == "tool"]
        # The running names come from the one `docker ps -a`; every GPU process is in a
        # container's `top`, so nothing is judged and nvidia-smi is not asked again.
        assert [c for c in tools if c.startswith("docker ps")] == [
            "docker ps -a --no-trunc --size=false --format {{.State}} {{.Names}} {{json .}}"
        ], tools
        assert sum(c.startswith("nvidia-smi") for c in tools) == 1, tools
        running = [c.name for c in facts.containers if c.running]
        assert sorted(c.split()[2] for c in tools if c.startswith("docker top")) == sorted(running)
        assert facts.gpu_processes and all(p.container for p in facts.gpu_processes), facts


async def test_a_gpu_process_no_container_holds_is_read_twice_before_it_is_judged(
    healthy: Live, pool: SshPool
) -> None:
    import time

    world = healthy.world
    await world.fault("stray-gpu", "spark-b", "4096")
    since = time.time()
    observed = await observe(healthy.cluster, pool, ray_status=False)
    tools = [r.command for r in world.commands("spark-b") if r.at >= since and r.source == "tool"]
    assert sum(c.startswith("nvidia-smi") for c in tools) == 2, tools
    worker = next(h for h in observed.hosts if h.name == "spark-b")
    foreign = [p for p in worker.gpu_processes if p.container is None]
    assert [p.used_memory_mib for p in foreign] == [4096], worker.gpu_processes

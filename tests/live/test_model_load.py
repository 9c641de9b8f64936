"""A model launched as sparkd launches it, watched while it loads: the serve process's age, spec
hash and load progress come from the head, the probe reads `refused` until it serves, and the
API key reaches vLLM without ever showing up in a snapshot."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sparkd.core.spec import key_fingerprint, model_spec_hash, serve_log_path
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import Observed
from sparkd.model.snapshot import dump_snapshot
from sparkd.shell import catalogue
from sparkd.shell.observe import observe, probe_once
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.live import cluster_of, fast_timing, live_world, observe_until

MODEL_LOAD = 1.2  # long enough for several observations to see the shards progress
API_KEY = "sk-sparkd-test-4f9a1c"
LIMIT = 5.0
SHARDS_PER_LOOK = 10  # of the simulated checkpoint's 39: at least four readings of the weights


@pytest.fixture
async def loading_world(tmp_path: Path) -> AsyncIterator[World]:
    timing = fast_timing(model_load=MODEL_LOAD)
    async with live_world(tmp_path / "world", "seed-morning", timing=timing) as world:
        yield world


def ray_ready(observed: Observed) -> bool:
    # Listed ALIVE is not enough: `ray status` counts a node's GPU a few seconds later, and a
    # launch before that waits for its placement group, as vLLM's does; sparkd's planner waits.
    ray = observed.ray
    return ray is not None and ray.gpus_total == 2 and ray.gpus_usable == 2


async def launch(cluster: ClusterSpec, pool: SshPool) -> None:
    """Ray on both hosts, then `vllm serve`, with the commands sparkd's actions run."""
    for host in cluster.hosts:
        start = catalogue.actions.start_ray(cluster, host, LIMIT)
        await pool.connection(host, cluster.ssh).run(start.command, timeout=LIMIT)
    await observe_until(cluster, pool, ray_ready, probe_due=lambda _: False)
    serve = catalogue.actions.start_model(cluster, LIMIT, API_KEY)
    head = pool.connection(cluster.head, cluster.ssh)
    await head.run(serve.command, timeout=LIMIT, input=serve.stdin)


async def test_loading_is_observed_until_the_model_serves(
    loading_world: World, pool: SshPool, tmp_path: Path
) -> None:
    world = loading_world
    key_file = tmp_path / "api_key"
    key_file.write_text(API_KEY + "\n")
    key_file.chmod(0o600)
    cluster = cluster_of(world, model={"api_key_file": key_file}, probe={"timeout": 0.5})
    # The loader takes at most SHARDS_PER_LOOK shards per look that reads it loading, so the
    # looks see the weights at several points however slowly they run beside other work.
    gate = world.host(cluster.head.name).faults.load_gate = asyncio.Semaphore(0)
    await launch(cluster, pool)

    loading: list[Observed] = []

    def ready(observed: Observed) -> bool:
        progress = observed.serve.progress if observed.serve is not None else None
        if progress is not None and progress.stage == "weights":
            loading.append(observed)
            for _ in range(SHARDS_PER_LOOK):
                gate.release()
        # A look reads the endpoint before it probes: the first look to get an answer may have
        # found the port refusing a moment earlier. Served is a look that saw both.
        endpoint = observed.endpoint
        answered = observed.probe is not None and observed.probe.outcome == "reasoning_only"
        return answered and endpoint is not None and endpoint.serves(cluster.model.served_name)

    # Probe every cycle, whatever the endpoint says, to see what a probe reads while loading.
    # The load moves at the looks' pace (the gate), so the wait is the looks', not the load's.
    served = await observe_until(cluster, pool, ready, within=60, probe_due=lambda _: True)

    percents: list[float] = []
    ages: list[float] = []
    for observed in [*loading, served]:
        serve = observed.serve
        assert serve is not None and serve.running
        # Launched with the current key: the planner sees no drift.
        assert observed.api_key_fingerprint == key_fingerprint(API_KEY)
        assert serve.spec_hash == model_spec_hash(cluster, key_fingerprint(API_KEY))
        assert serve.elapsed_seconds is not None
        ages.append(serve.elapsed_seconds)
        if observed is served:
            break
        assert serve.progress is not None and serve.progress.percent is not None
        percents.append(serve.progress.percent)
        if serve.progress.percent >= 100:
            # Read before the probe, within one look: the server may be listening by the time
            # it asks (and slow to answer on a loaded machine), so the probe may read anything.
            continue
        assert observed.endpoint is not None and observed.endpoint.status == "refused"
        assert observed.probe is not None and observed.probe.outcome == "refused"
    # Weights percent rising over at least three readings, the process ageing throughout. A
    # reading may catch "100% Completed" before the silent stages that follow it (as real vLLM
    # prints it): still loading, refused, never ready.
    assert len(set(percents)) >= 3 and percents == sorted(percents) and percents[-1] <= 100
    assert ages == sorted(ages) and ages[-1] >= 1
    assert served.endpoint is not None and served.endpoint.serves(cluster.model.served_name)
    # The log is read before the model is asked, within one look: the look that first finds
    # it serving may have read the log a moment before the server started. The next says so.
    after = await observe(cluster, pool)
    assert after.serve is not None
    assert after.serve.progress is not None and after.serve.progress.stage == "ready"

    # The key reached vLLM (it refuses a client without it) and never a command line.
    keyless = cluster.model_copy(
        update={"model": cluster.model.model_copy(update={"api_key_file": None})}
    )
    assert (await probe_once(keyless, pool)).outcome == "http_error"
    assert not any(API_KEY in record.command for record in world.command_log)

    # Whatever prints the key into the serve log, the snapshot shows it redacted.
    leaks = [
        f"(APIServer pid=1) INFO non-default args: {{'api_key': ['{API_KEY}']}}",
        f"(APIServer pid=1) DEBUG request headers: Authorization: Bearer {API_KEY}",
    ]
    append = f"printf '%s\\n' {shlex.join(leaks)} >> {shlex.quote(serve_log_path(cluster))}"
    await pool.connection(cluster.head, cluster.ssh).run(append, timeout=LIMIT)
    observed = await observe(cluster, pool)
    assert observed.serve is not None
    tail = "\n".join(observed.serve.log_tail)
    assert "'api_key': ['***']" in tail and "Bearer ***" in tail
    assert API_KEY not in dump_snapshot(observed, Memory())

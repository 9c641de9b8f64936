"""The sanity probe through the head's SSH connection, against the world's vLLM in every way it
can answer: each outcome must come out of the real wire format."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sparkd.model.cluster import ClusterSpec
from sparkd.model.probe import ProbeOutcome, ProbeResult
from sparkd.shell.observe import observe, probe_once
from sparkd.shell.ssh import SshPool
from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim.vllm_schema import FieldNaming
from sparkd_sim.world import World
from tests.support.live import Live, cluster_of, live_world, observe_until, serving
from tests.support.worlds import both_servers

# Long enough for a healthy answer here (tens of milliseconds), far shorter than a busy one.
PROBE_TIMEOUT = 0.5


def probing(cluster: ClusterSpec, *, stream: bool) -> ClusterSpec:
    probe = cluster.probe.model_copy(update={"timeout": PROBE_TIMEOUT, "stream": stream})
    return cluster.model_copy(update={"probe": probe})


async def both_ways(cluster: ClusterSpec, pool: SshPool) -> tuple[ProbeResult, ProbeResult]:
    """One plain and one streaming probe."""
    plain = await probe_once(probing(cluster, stream=False), pool)
    streamed = await probe_once(probing(cluster, stream=True), pool)
    return plain, streamed


@pytest.mark.parametrize(
    ("style", "outcome", "healthy_verdict"),
    [
        ("reasoning_only", "reasoning_only", True),
        ("answer", "answer", True),
        ("empty", "empty", False),
        ("malformed", "malformed", False),
        ("http_500", "http_error", False),
        ("garbled", "garbled", False),
        ("no_answer", "no_answer", False),
    ],
)
@both_servers
async def test_each_answer_style_is_classified(
    healthy: Live, pool: SshPool, style: str, outcome: ProbeOutcome, healthy_verdict: bool
) -> None:
    await healthy.world.fault("answer-style", "spark-a", style)
    for result in await both_ways(healthy.cluster, pool):
        assert result.outcome == outcome, result.verdict
        assert result.verdict.healthy is healthy_verdict
        if outcome != "http_error":
            assert result.http_status == 200
        assert result.latency_seconds is not None and result.latency_seconds < PROBE_TIMEOUT


@pytest.fixture(params=["reasoning", "both", "reasoning_content"])
async def named_world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    naming: FieldNaming = request.param
    async with live_world(
        tmp_path / "world", "healthy", spec_labels=sparkd_spec_labels, answer_naming=naming
    ) as world:
        yield world


async def test_reasoning_is_read_under_every_field_naming(
    named_world: World, pool: SshPool
) -> None:
    cluster = cluster_of(named_world)
    await observe_until(cluster, pool, serving(cluster), probe_due=lambda _: False)
    for result in await both_ways(cluster, pool):
        assert result.outcome == "reasoning_only", result.verdict
        assert result.verdict.completion_tokens == 50


async def test_a_hung_engine_times_out_with_flat_tokens(healthy: Live, pool: SshPool) -> None:
    await healthy.world.fault("hang-engine", "spark-a")
    cluster = probing(healthy.cluster, stream=False)
    observed = await observe(cluster, pool, probe_due=lambda _: True)

    # vLLM's /health only asks the engine client, which never notices a hung engine.
    assert observed.endpoint is not None and observed.endpoint.serves(cluster.model.served_name)
    assert observed.probe is not None
    assert observed.probe.outcome == "timeout"
    assert observed.probe.tokens_advanced is False
    assert not observed.probe.busy


async def test_a_busy_server_times_out_with_tokens_rising(healthy: Live, pool: SshPool) -> None:
    await healthy.world.fault("answer-style", "spark-a", "busy")
    result = await probe_once(probing(healthy.cluster, stream=False), pool)
    assert result.outcome == "timeout"
    assert result.tokens_advanced is True
    assert result.busy


async def test_a_hung_engine_is_not_busy_with_its_own_stuck_probes(
    healthy: Live, pool: SshPool
) -> None:
    # Each timed-out probe stays in the hung engine's running count; none of them is work.
    await healthy.world.fault("hang-engine", "spark-a")
    cluster = probing(healthy.cluster, stream=False)
    for _ in range(3):
        result = await probe_once(cluster, pool)
        assert result.outcome == "timeout"
        assert not result.busy, result.verdict.detail


async def test_a_slow_model_alone_is_not_busy(healthy: Live, pool: SshPool) -> None:
    # Tokens flow, but only the probe's own: a model this slow on its own is failing, not busy.
    await healthy.world.fault("answer-style", "spark-a", "slow")
    result = await probe_once(probing(healthy.cluster, stream=True), pool)
    assert result.outcome == "timeout"
    assert result.tokens_advanced is False
    assert not result.busy
    assert "only the probe's request" in result.verdict.detail

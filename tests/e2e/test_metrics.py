"""GET /metrics of a daemon managing the simulated world: values agree with /status and events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from sparkd import __version__
from sparkd.cli.api import render_status
from sparkd.model.observed import HOST_ERROR_KINDS
from sparkd.model.plan import PHASES
from sparkd.model.probe import HEALTHY_OUTCOMES, PROBE_OUTCOMES
from sparkd.runtime.daemon import Daemon
from sparkd.web.serve import serve_api
from sparkd_sim.timing import FAST_FACTOR
from sparkd_sim.world import World
from tests.ops.tools import tool
from tests.support.daemon import FAST_EXECUTOR, daemon_on, eventually, world_settings
from tests.support.http import OPENMETRICS, Samples, fetch, parse, series, value


async def consistent(url: str) -> tuple[dict[str, Any], Samples]:
    """/status and /metrics from between the same two cycles."""
    for _ in range(50):
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/status") as r:
                before = (await r.json())["clusters"][0]
            async with s.get(f"{url}/metrics") as r:
                samples = parse(await r.text())
            async with s.get(f"{url}/status") as r:
                after = (await r.json())["clusters"][0]
        if before["cycles"] == after["cycles"] and before["in_flight"] is None:
            return after, samples
        await asyncio.sleep(0.05)
    raise AssertionError("the daemon never held still between two reads")


@pytest.fixture
async def seed_daemon(seed_world: World, tmp_path: Path) -> AsyncIterator[Daemon]:
    # `healthy_reset` at its shipped ratio (600 s of a 30 s interval): the remediation budget
    # the test reads is that of the incident just repaired, not one that sustained health has
    # already reset (the tests' 5 s reset passed before the read on a loaded machine).
    reset = {"policy": {"healthy_reset": 600.0 * FAST_FACTOR}}
    async with daemon_on(seed_world, tmp_path / "state", **reset) as daemon:
        yield daemon


@pytest.fixture
async def healthy_daemon(healthy_world: World, tmp_path: Path) -> AsyncIterator[Daemon]:
    async with daemon_on(healthy_world, tmp_path / "state") as daemon:
        yield daemon


async def phase_is(daemon: Daemon, wanted: str) -> bool:
    _, samples = await fetch(f"{daemon.url}/metrics")
    return value(parse(samples), "sparkd_cluster_phase", cluster="sparks", phase=wanted) == 1


async def test_metrics_agree_with_status_through_recovery(seed_daemon: Daemon) -> None:
    url = seed_daemon.url
    # Before the first cycle finishes, every probe outcome is already exported at 0.
    _, text = await fetch(f"{url}/metrics")
    early = parse(text)
    outcomes = series(early, "sparkd_probes_total")
    assert {dict(k)["outcome"] for k in outcomes} == set(PROBE_OUTCOMES)

    async def healthy() -> bool:
        status, _ = await consistent(url)
        return status["phase"] == "healthy" and status["probes"]["window"] >= 2

    await eventually(healthy, within=40)
    status, samples = await consistent(url)
    snapshot = status["snapshot"]
    phases = series(samples, "sparkd_cluster_phase")
    assert {dict(k)["phase"]: v for k, v in phases.items()} == {
        p: (1.0 if p == status["phase"] else 0.0) for p in PHASES
    }
    assert value(samples, "sparkd_cluster_converged", cluster="sparks") == 1
    assert value(samples, "sparkd_cluster_paused", cluster="sparks") == 0
    assert value(samples, "sparkd_cluster_blocked", cluster="sparks") == 0
    assert value(samples, "sparkd_ray_gpus", cluster="sparks") == snapshot["ray"]["gpus_total"]
    assert value(samples, "sparkd_ray_gpus_desired", cluster="sparks") == 2
    alive = [n for n in snapshot["ray"]["nodes"] if n["alive"]]
    assert value(samples, "sparkd_ray_nodes_alive", cluster="sparks") == len(alive) == 2
    for host in snapshot["hosts"]:
        up = value(samples, "sparkd_host_up", cluster="sparks", host=host["name"])
        assert up == (1 if host["error"] is None else 0)
    assert value(samples, "sparkd_model_ready", cluster="sparks") == 1
    assert value(samples, "sparkd_model_load_progress_ratio", cluster="sparks") == 1
    last = snapshot["memory"]["last_probe"]
    assert value(samples, "sparkd_probe_last_duration_seconds", cluster="sparks") == pytest.approx(
        last["latency_seconds"]
    )
    assert (
        value(samples, "sparkd_probe_last_completion_tokens", cluster="sparks")
        == (last["verdict"]["completion_tokens"])
    )
    assert (
        value(samples, "sparkd_probe_reasoning_only_ratio", cluster="sparks")
        == (status["probes"]["reasoning_only_ratio"])
    )
    assert (
        value(samples, "sparkd_probe_last_success_timestamp_seconds", cluster="sparks")
        == (status["probes"]["last_success_at"])
    )
    healthy_probes = value(samples, "sparkd_probes_total", cluster="sparks", outcome="answer")
    reasoning = value(samples, "sparkd_probes_total", cluster="sparks", outcome="reasoning_only")
    assert healthy_probes is not None and reasoning is not None
    assert healthy_probes + reasoning == status["probes"]["window"]
    # Every probe that got as far as asking is timed: not a refused connection, nor a channel
    # the SSH connection would not open (a `not_run` whose connection broke mid-probe is). A
    # probe that timed out on a loaded machine before the window filled is timed too.
    by_outcome = {dict(k)["outcome"]: v for k, v in series(samples, "sparkd_probes_total").items()}
    asked = sum(v for outcome, v in by_outcome.items() if outcome not in ("refused", "not_run"))
    timed = value(samples, "sparkd_probe_duration_seconds_count", cluster="sparks")
    assert timed is not None and asked <= timed <= asked + by_outcome["not_run"]
    tokens = value(samples, "sparkd_probe_completion_tokens_total", cluster="sparks")
    assert tokens == reasoning * last["verdict"]["completion_tokens"]
    # Every remediation the daemon reports is counted, by kind and result.
    done: dict[tuple[str, str], int] = {}
    for action in status["recent_actions"]:
        key = (action["kind"], action["result"])
        done[key] = done.get(key, 0) + 1
    counted = {
        (dict(k)["action"], dict(k)["result"]): v
        for k, v in series(samples, "sparkd_remediations_total").items()
        if v
    }
    assert counted == done
    assert done[("stop_unit", "ok")] == 4
    budget = value(
        samples, "sparkd_remediation_budget_remaining", cluster="sparks", action="stop_unit"
    )
    assert budget == 3 - 1  # each unit was stopped once, within the budget window
    assert (
        value(samples, "sparkd_reconcile_cycles_total", cluster="sparks", result="ok")
        == (status["cycles"])
    )
    assert (
        value(samples, "sparkd_reconcile_duration_seconds_count", cluster="sparks")
        == (status["cycles"])
    )
    assert (
        value(samples, "sparkd_last_reconcile_timestamp_seconds", cluster="sparks")
        == (status["last_cycle_at"])
    )
    assert value(samples, "sparkd_build_info", version=__version__, revision="unknown") == 1
    assert (value(samples, "process_cpu_seconds_total") or 0) > 0
    assert any(name == "python_info" for name, _ in samples)


async def test_content_negotiation(healthy_daemon: Daemon) -> None:
    url = f"{healthy_daemon.url}/metrics"
    plain_type, plain = await fetch(url)
    assert plain_type.startswith("text/plain; version=0.0.4")
    assert "# TYPE sparkd_probes_total counter" in plain
    om_type, om = await fetch(url, OPENMETRICS)
    assert om_type.startswith("application/openmetrics-text; version=1.0.0")
    assert om.endswith("# EOF\n")
    assert "_created" not in om


def delta(first: Samples, second: Samples, name: str, **labels: str) -> float:
    """How much the cluster's counter `name` grew from one scrape to the other."""
    before = value(first, name, cluster="sparks", **labels)
    after = value(second, name, cluster="sparks", **labels)
    assert before is not None and after is not None, name
    return after - before


async def test_events_are_counted_and_the_ratio_follows_the_answers(
    healthy_world: World, healthy_daemon: Daemon
) -> None:
    url = healthy_daemon.url

    async def probed(outcome: str, at_least: float) -> bool:
        _, text = await fetch(f"{url}/metrics")
        got = value(parse(text), "sparkd_probes_total", cluster="sparks", outcome=outcome)
        return (got or 0) >= at_least

    await eventually(lambda: probed("reasoning_only", 2), within=20)
    await healthy_world.fault("answer-style", "spark-a", "answer")
    await eventually(lambda: probed("answer", 2), within=20)
    status, samples = await consistent(url)
    answers = value(samples, "sparkd_probes_total", cluster="sparks", outcome="answer")
    reasoning = value(samples, "sparkd_probes_total", cluster="sparks", outcome="reasoning_only")
    assert answers is not None and reasoning is not None
    ratio = value(samples, "sparkd_probe_reasoning_only_ratio", cluster="sparks")
    assert ratio == pytest.approx(reasoning / (answers + reasoning))
    assert ratio == status["probes"]["reasoning_only_ratio"] and 0 < ratio < 1

    # A failing model: counted by outcome and as a failure; the last success stays put and
    # the ratio, over healthy answers only, does not move.
    await healthy_world.fault("answer-style", "spark-a", "http_500")
    await eventually(lambda: probed("http_error", 1), within=20)
    _, first = await consistent(url)
    failures = value(first, "sparkd_probe_failures_total", cluster="sparks")
    assert failures is not None and failures >= 1
    # More probes may land between the reads (each `consistent` waits out a cycle or a restart):
    # compare what both reads counted, not an exact next value.
    errors = value(first, "sparkd_probes_total", cluster="sparks", outcome="http_error") or 0
    await eventually(lambda: probed("http_error", errors + 1), within=20)
    _, second = await consistent(url)
    failed = delta(first, second, "sparkd_probe_failures_total")
    unhealthy = sum(
        delta(first, second, "sparkd_probes_total", outcome=o)
        for o in PROBE_OUTCOMES
        if o not in HEALTHY_OUTCOMES
    )
    # Each http_error counts as one failure; nothing counts twice.
    assert 1 <= delta(first, second, "sparkd_probes_total", outcome="http_error") <= failed
    assert failed <= unhealthy
    last_ok = "sparkd_probe_last_success_timestamp_seconds"
    assert value(second, last_ok, cluster="sparks") == value(first, last_ok, cluster="sparks")
    assert value(second, "sparkd_probe_reasoning_only_ratio", cluster="sparks") == ratio
    await healthy_world.fault("heal", "spark-a")

    # An unreachable worker: host_up drops and its SSH errors are counted by kind.
    await healthy_world.fault("unreachable", "spark-b")

    async def worker_down() -> bool:
        _, text = await fetch(f"{url}/metrics")
        return value(parse(text), "sparkd_host_up", cluster="sparks", host="spark-b") == 0

    await eventually(worker_down, within=20)
    _, samples = await consistent(url)
    errors = {
        dict(k)["reason"]: v
        for k, v in series(samples, "sparkd_ssh_errors_total").items()
        if dict(k)["host"] == "spark-b"
    }
    assert set(errors) == set(HOST_ERROR_KINDS)
    assert sum(errors.values()) >= 1
    assert value(samples, "sparkd_host_up", cluster="sparks", host="spark-a") == 1
    assert value(samples, "sparkd_host_reboots_total", cluster="sparks", host="spark-b") == 0

    # Back, rebooted: counted once, for that host only.
    await healthy_world.fault("heal", "spark-b")
    await healthy_world.fault("reboot", "spark-b")

    async def rebooted() -> bool:
        _, text = await fetch(f"{url}/metrics")
        got = value(parse(text), "sparkd_host_reboots_total", cluster="sparks", host="spark-b")
        return got == 1

    await eventually(rebooted, within=30)
    _, text = await fetch(f"{url}/metrics")
    assert value(parse(text), "sparkd_host_reboots_total", cluster="sparks", host="spark-a") == 0


async def test_status_command_shows_the_ratio_and_the_last_latency(
    healthy_world: World, healthy_daemon: Daemon
) -> None:
    url = healthy_daemon.url

    async def mixed() -> bool:
        status, _ = await consistent(url)
        return status["probes"]["window"] >= 2

    await eventually(mixed, within=20)
    await healthy_world.fault("answer-style", "spark-a", "answer")

    async def answered() -> bool:
        status, _ = await consistent(url)
        return 0 < (status["probes"]["reasoning_only_ratio"] or 0) < 1

    await eventually(answered, within=20)
    async with aiohttp.ClientSession() as s, s.get(f"{url}/status") as r:
        body = await r.json()
    cluster = body["clusters"][0]
    header, row = render_status(body).splitlines()
    assert header.split()[:7] == [
        "CLUSTER", "PHASE", "GPUS", "MODEL", "PROBE", "REASONING-ONLY", "REASON",
    ]  # fmt: skip
    probes = cluster["probes"]
    latency = cluster["snapshot"]["memory"]["last_probe"]["latency_seconds"]
    assert f"answer {latency:.2f}s" in row
    assert f"{100 * probes['reasoning_only_ratio']:.0f}% of {probes['window']}" in row
    assert row.split()[:2] == ["sparks", cluster["phase"]]


async def test_load_progress_and_eta_while_loading(seed_world: World, tmp_path: Path) -> None:
    await seed_world.fault("slow-load", "spark-a")
    daemon = Daemon(
        world_settings(seed_world, tmp_path / "state"),
        seed_world.config_path,
        executor_timing=FAST_EXECUTOR,
        api=serve_api,
    )
    await daemon.start()
    try:
        # The reads that showed the load: a later pair may come after it ended (it lasts a
        # few looks, and `consistent` may wait out more than one on a loaded box).
        seen: list[tuple[dict[str, Any], Samples]] = []

        async def loading_with_progress() -> bool:
            status, samples = await consistent(daemon.url)
            progress = ((status["snapshot"] or {}).get("serve") or {}).get("progress") or {}
            if status["phase"] == "loading" and 0 < (progress.get("percent") or 0) < 100:
                seen.append((status, samples))
            return bool(seen)

        await eventually(loading_with_progress, within=30, poll=0.02)
        status, samples = seen[0]
        serve = status["snapshot"]["serve"]
        fraction = serve["progress"]["percent"] / 100
        launched = status["snapshot"]["memory"]["launched_at"]
        elapsed = max(serve["elapsed_seconds"], status["snapshot"]["observed_at"] - launched)
        assert elapsed > 0
        assert value(samples, "sparkd_model_ready", cluster="sparks") == 0
        assert value(samples, "sparkd_model_load_progress_ratio", cluster="sparks") == fraction
        assert value(samples, "sparkd_model_loading_seconds", cluster="sparks") == elapsed
        eta = value(samples, "sparkd_model_load_eta_seconds", cluster="sparks")
        assert eta == pytest.approx(elapsed * (1 - fraction) / fraction)
        assert value(samples, "sparkd_cluster_converged", cluster="sparks") == 0

        await eventually(lambda: phase_is(daemon, "healthy"), within=60)
        _, text = await fetch(f"{daemon.url}/metrics")
        samples = parse(text)
        assert value(samples, "sparkd_model_loading_seconds", cluster="sparks") == 0
        assert value(samples, "sparkd_model_load_eta_seconds", cluster="sparks") is None
    finally:
        await daemon.stop()


async def test_dashboard_and_rules_name_only_exported_or_recorded_metrics(
    healthy_daemon: Daemon,
) -> None:
    import yaml

    from tests.ops.tools import RULES, expressions, metric_names

    _, text = await fetch(f"{healthy_daemon.url}/metrics")
    exported: set[str] = set()
    for family in text_string_to_metric_families(text):
        exported.add(family.name)  # families without samples yet (the ETA outside a load)
        if family.type == "counter":
            # A counter whose labels have not happened yet (an XID) still declares its family.
            exported.add(f"{family.name}_total")
        exported.update(sample.name for sample in family.samples)
    # What an HA instance adds (only with [ha]): built, never started, so no etcd is contacted.
    from sparkd.ha.config import HaSpec
    from sparkd.ha.metrics import HaCollector
    from sparkd.ha.ownership import Ownership

    ha = Ownership(HaSpec(etcd_endpoints=("http://127.0.0.1:9",)), ["sparks"])
    for family in HaCollector(ha).collect():
        exported.add(family.name)
        exported.update(sample.name for sample in family.samples)
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    assert "sparkd_model_load_eta_seconds" in exported
    for expr in expressions() + [r["expr"] for r in rules]:
        unknown = metric_names(expr) - exported - recorded
        assert not unknown, (expr, unknown)


async def test_a_renamed_model_that_serves_is_ready(seed_world: World, tmp_path: Path) -> None:
    # `--served-model-name` renames what /v1/models lists; the model is still the one configured.
    settings = world_settings(
        seed_world,
        tmp_path / "state",
        model={"extra_args": ("--served-model-name", "qwen-reasoner")},
    )
    daemon = Daemon(settings, seed_world.config_path, executor_timing=FAST_EXECUTOR, api=serve_api)
    await daemon.start()
    try:
        url = daemon.url

        async def healthy() -> bool:
            status, _ = await consistent(url)
            return status["phase"] == "healthy" and status["probes"]["window"] >= 1

        await eventually(healthy, within=40)
        status, samples = await consistent(url)
        listed = status["snapshot"]["endpoint"]["models"]
        assert listed == ["qwen-reasoner"]
        assert value(samples, "sparkd_model_ready", cluster="sparks") == 1
        assert value(samples, "sparkd_model_load_progress_ratio", cluster="sparks") == 1
    finally:
        await daemon.stop()


async def test_both_exposition_formats_parse_and_pass_promtool(healthy_daemon: Daemon) -> None:
    url = f"{healthy_daemon.url}/metrics"

    async def probed() -> bool:
        _, text = await fetch(url)
        return value(parse(text), "sparkd_probe_last_completion_tokens", cluster="sparks") == 50

    await eventually(probed, within=20)
    _, om = await fetch(url, OPENMETRICS)
    # prometheus_client's own OpenMetrics parser refuses clashing names and bad exposition.
    families = list(openmetrics_families(om))
    names = [f.name for f in families]
    assert len(names) == len(set(names))
    assert {"sparkd_probe_completion_tokens", "sparkd_probe_last_completion_tokens"} <= set(names)
    # promtool reads the Prometheus text format only (it calls OpenMetrics' `info` unknown).
    _, plain = await fetch(url)
    checked = await asyncio.create_subprocess_exec(
        tool("promtool"),
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await checked.communicate(plain.encode())
    # Lint findings (exit 3) are problems too: the scrape must be clean, not merely valid.
    assert checked.returncode == 0, out.decode()

"""Real Prometheus scraping a `sparkd run` that manages the simulated world, with the shipped
rules loaded (their `for:` scaled from minutes to seconds, see tests/ops/tools.py), and a real
Alertmanager receiving what fires."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from sparkd_sim.world import World
from tests.e2e.conftest import eventually, free_port, write_fast_config
from tests.e2e.test_process import sparkd, start_daemon, status
from tests.ops.test_dashboard import dashboard
from tests.ops.tools import ALERTMANAGER_CONFIG, RULES, scaled_rules, tool

WEBHOOK_BASE = "https://alerts.example.invalid"


async def spawn(*argv: str, log: Path) -> asyncio.subprocess.Process:
    handle = log.open("ab")
    return await asyncio.create_subprocess_exec(*argv, stdout=handle, stderr=handle)


async def end(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def get_json(url: str, **params: str) -> Any:
    try:
        async with aiohttp.ClientSession() as s, s.get(url, params=params) as r:
            return await r.json(content_type=None)
    except aiohttp.ClientError:
        return None


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    async def query(self, expr: str) -> list[dict[str, Any]]:
        body = await get_json(f"{self.url}/api/v1/query", query=expr)
        assert body is not None and body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def scalar(self, expr: str) -> float | None:
        result = await self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None

    async def alerts(self) -> list[dict[str, Any]]:
        body = await get_json(f"{self.url}/api/v1/alerts")
        return [] if body is None else list(body["data"]["alerts"])


@contextlib.asynccontextmanager
async def monitored(
    world: World, tmp_path: Path, *, alertmanager: int | None = None, budget: int | None = None
) -> AsyncIterator[tuple[int, Prometheus, Path]]:
    """A `sparkd run` on the world, and Prometheus scraping it every second."""
    prometheus = tool("prometheus")
    port = free_port()
    token = tmp_path / "token"
    token.write_text("test-token\n")
    config = write_fast_config(world, tmp_path / "sparkd.toml", tmp_path / "state", port, token)
    if budget is not None:
        text = re.sub(
            r"^(\s*)budget = .*$", rf"\1budget = {budget}", config.read_text(), flags=re.M
        )
        config.write_text(text)
    rules = tmp_path / "sparkd.rules.yml"
    rules.write_text(scaled_rules(RULES.read_text()))
    prom_config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "sparkd", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        ],
    }
    if alertmanager is not None:
        prom_config["alerting"] = {
            "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager}"]}]}]
        }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
    prom_port = free_port()
    daemon = await start_daemon(config, tmp_path / "daemon.log")
    prom = await spawn(
        prometheus,
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        log=tmp_path / "prometheus.log",
    )
    try:
        yield port, Prometheus(f"http://127.0.0.1:{prom_port}"), config
    finally:
        await end(prom)
        await end(daemon)


async def test_prometheus_scrapes_records_and_runs_every_dashboard_query(
    seed_world: World, tmp_path: Path
) -> None:
    async with monitored(seed_world, tmp_path) as (port, prom, _):

        async def settled() -> bool:
            healthy = await get_json(f"{prom.url}/api/v1/query", query=(
                'sparkd_cluster_phase{job="sparkd",phase="healthy"} == 1'
            ))  # fmt: skip
            if not healthy or not healthy.get("data", {}).get("result"):
                return False
            ratio = await prom.scalar("cluster:sparkd_probe_reasoning_only:ratio_rate15m")
            failures = await prom.scalar("cluster:sparkd_probe_failures_per_probes:ratio_rate15m")
            return ratio == 1.0 and failures == 0.0

        await eventually(settled, within=60, poll=0.5)
        targets = await get_json(f"{prom.url}/api/v1/targets")
        [target] = targets["data"]["activeTargets"]
        assert (target["health"], target["lastError"]) == ("up", "")

        for panel in dashboard()["panels"]:
            for target in panel["targets"]:
                expr = (
                    target["expr"]
                    .replace("$__rate_interval", "1m")
                    .replace('"$job"', '"sparkd"')
                    .replace('"$cluster"', '".*"')
                )
                assert "$" not in expr, expr
                await prom.query(expr)  # fails the test on any error
        for name in ("sparkd_cluster_phase", "sparkd_probes_total", "sparkd_ray_gpus"):
            assert await prom.query(f'{name}{{job="sparkd"}}'), name

        # Prometheus holds what the daemon says: phase, GPUs, the last probe.
        async def agree() -> bool:
            body = (await status(port))["clusters"][0]
            snapshot = body["snapshot"]
            last = snapshot["memory"]["last_probe"]
            values = {
                "phase": await prom.query('sparkd_cluster_phase{job="sparkd"} == 1'),
                "gpus": await prom.scalar('sparkd_ray_gpus{job="sparkd"}'),
                "desired": await prom.scalar('sparkd_ray_gpus_desired{job="sparkd"}'),
                "latency": await prom.scalar('sparkd_probe_last_duration_seconds{job="sparkd"}'),
                "tokens": await prom.scalar('sparkd_probe_last_completion_tokens{job="sparkd"}'),
            }
            after = (await status(port))["clusters"][0]
            if after["cycles"] != body["cycles"] or len(values["phase"]) != 1:
                return False
            return (
                values["phase"][0]["metric"]["phase"] == body["phase"]
                and values["gpus"] == snapshot["ray"]["gpus_total"]
                and values["desired"] == 2
                and values["latency"] == pytest.approx(last["latency_seconds"])
                and values["tokens"] == last["verdict"]["completion_tokens"]
            )

        await eventually(agree, within=30, poll=0.3)
        assert not [a for a in await prom.alerts() if a["state"] == "firing"]


async def webhook(log: list[dict[str, Any]]) -> tuple[aiohttp.web.AppRunner, int]:
    from aiohttp import web

    async def receive(request: web.Request) -> web.Response:
        log.append({"path": request.path, **json.loads(await request.text())})
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/{tail:.*}", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def test_blocked_fires_reaches_alertmanager_and_resolves_after_resume(
    seed_world: World, tmp_path: Path
) -> None:
    alertmanager = tool("alertmanager")
    notifications: list[dict[str, Any]] = []
    hook, hook_port = await webhook(notifications)
    am_config = tmp_path / "alertmanager.yml"
    shipped = ALERTMANAGER_CONFIG.read_text()
    assert WEBHOOK_BASE in shipped
    am_config.write_text(shipped.replace(WEBHOOK_BASE, f"http://127.0.0.1:{hook_port}"))
    am_port = free_port()
    am = await spawn(
        alertmanager,
        f"--config.file={am_config}",
        f"--storage.path={tmp_path / 'am'}",
        f"--web.listen-address=127.0.0.1:{am_port}",
        "--cluster.listen-address=",
        log=tmp_path / "alertmanager.log",
    )
    am_url = f"http://127.0.0.1:{am_port}"
    try:
        async with monitored(seed_world, tmp_path, alertmanager=am_port, budget=1) as (
            port,
            prom,
            config,
        ):

            async def phase(wanted: str) -> bool:
                clusters = (await status(port)).get("clusters") or []
                return bool(clusters) and clusters[0]["phase"] == wanted

            await eventually(lambda: phase("healthy"), within=60, poll=0.3)
            # The model fails every probe: one restart, then the budget is spent.
            await seed_world.fault("answer-style", "spark-a", "http_500")
            await eventually(lambda: phase("blocked"), within=60, poll=0.3)

            async def firing() -> bool:
                return any(
                    a["labels"]["alertname"] == "SparkdClusterBlocked" and a["state"] == "firing"
                    for a in await prom.alerts()
                )

            await eventually(firing, within=30, poll=0.5)

            async def in_alertmanager() -> list[dict[str, Any]]:
                found = await get_json(f"{am_url}/api/v2/alerts", active="true")
                return [
                    a
                    for a in found or []
                    if a["labels"]["alertname"] == "SparkdClusterBlocked"
                    and a["status"]["state"] == "active"
                ]

            async def listed() -> bool:
                return bool(await in_alertmanager())

            await eventually(listed, within=30, poll=0.5)
            [alert] = await in_alertmanager()
            assert alert["labels"]["cluster"] == "sparks"
            assert alert["labels"]["severity"] == "critical"
            assert [r["name"] for r in alert["receivers"]] == ["sparkd-page"]
            assert alert["annotations"]["runbook_url"] == "docs/runbook.md#sparkdclusterblocked"

            # Routed by severity: the page receiver's webhook is called (after group_wait).
            def paged() -> bool:
                return any(
                    n["path"] == "/sparkd/page"
                    and n["status"] == "firing"
                    and n["commonLabels"].get("alertname") == "SparkdClusterBlocked"
                    for n in notifications
                )

            await eventually(paged, within=30, poll=0.5)

            # A human fixes the model and resumes: sparkd recovers, the alert resolves.
            await seed_world.fault("heal", "spark-a")
            code, _, err = await sparkd("resume", "sparks", "--config", str(config))
            assert code == 0, err
            await eventually(lambda: phase("healthy"), within=60, poll=0.3)

            async def resolved() -> bool:
                return (
                    not any(
                        a["labels"]["alertname"] == "SparkdClusterBlocked"
                        for a in await prom.alerts()
                    )
                    and not await in_alertmanager()
                )

            await eventually(resolved, within=60, poll=0.5)
    finally:
        await end(am)
        await hook.cleanup()

"""Take a cycle's reading of a cluster: one fact script per host, HTTP to the model, maybe a probe.

All hosts are observed concurrently; each is bounded by its own command timeout, so a slow or
dead host never delays the others beyond that. Failures become classified values here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import (
    HeadExtras,
    head_extras,
    host_facts,
    unreadable,
    withhold_foreign_tail,
)
from sparkd.core.spec import key_fingerprint
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import HostFacts, ModelEndpoint, Observed, RayState
from sparkd.model.probe import CheckResult, ProbeResult
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue, model_http, ray_http
from sparkd.shell.secrets import REDACTOR, SecretFileError, read_secret
from sparkd.shell.ssh import HostConnection, SshFailure, SshPool


@dataclass(frozen=True)
class HostReading:
    facts: HostFacts
    extras: HeadExtras | None


# Scheduling and redaction on a busy event loop, beyond the timeouts themselves.
OBSERVE_SLACK = 5.0


def observe_timeout(cluster: ClusterSpec) -> float:
    """The longest one `observe` can take within its own timeouts: every host's fact script at
    once (each bounded by command_timeout, connecting included), then the endpoint's reads
    (command_timeout), then a probe (its timeout, and /metrics before and after). A look that
    takes this long is slow, not stuck."""
    return (
        2 * cluster.ssh.command_timeout
        + cluster.probe.timeout
        + 2 * model_http.ENGINE_LOAD_TIMEOUT
        + OBSERVE_SLACK
    )


def tool_timeout(cluster: ClusterSpec) -> float:
    return catalogue.remote.tool_timeout(cluster)


def opener(conn: HostConnection, cluster: ClusterSpec) -> model_http.Opener:
    return channel(conn, cluster.model_host, cluster.model.port)


def channel(conn: HostConnection, host: str, port: int) -> model_http.Opener:
    async def open_channel() -> model_http.Streams:
        try:
            return await conn.open_connection(host, port)
        except SshFailure as failure:
            if failure.kind == "refused":
                raise model_http.ChannelRefused(failure.error.detail) from None
            raise model_http.ChannelUnavailable(f"{failure.kind}: {failure.error.detail}") from None

    return open_channel


def runner(conn: HostConnection) -> ray_http.Runner:
    """The dashboard's reads, run on `conn`'s host as commands of their own."""

    async def run(remote: catalogue.remote.Remote, seconds: float) -> ray_http.Ran:
        try:
            result = await conn.run(remote.command, timeout=seconds, input=remote.stdin)
        except SshFailure as failure:
            if failure.kind != "exit_nonzero" or failure.result is None:
                return ray_http.Ran(None, f"{failure.kind}: {failure.error.detail}")
            result = failure.result
        return ray_http.Ran(result.exit_status, result.stdout)

    return run


async def read_host(
    cluster: ClusterSpec,
    host: HostSpec,
    conn: HostConnection,
    observed_at: float,
    secrets: tuple[str, ...],
    ray_status: bool = False,
    known_ray: RayState | None = None,
    prepare: bool = False,
    ray_token: str | None = None,
) -> HostReading:
    """`ray_token`: `ray.auth_token_file`'s token, for the dashboard's reads."""
    t = tool_timeout(cluster)
    # With the dashboard, the head's Ray is read over HTTP beside the script, not by `ray`.
    over_http = host.role == "head" and cluster.ray.dashboard and known_ray is None
    script = catalogue.reads.fact_script(
        cluster,
        host,
        t,
        ray_status,
        read_ray=known_ray is None and not over_http,
        prepare=prepare,
    )
    dashboard: asyncio.Task[RayState | ray_http.DashboardSilent] | None = None
    if over_http:
        dashboard = asyncio.create_task(
            ray_http.read_ray(runner(conn), cluster.ray.dashboard_port, ray_status, t, ray_token)
        )
    try:
        sections = await _sections(conn, script, cluster.ssh.command_timeout)
        ray = await dashboard if dashboard is not None else None
    finally:
        if dashboard is not None:
            dashboard.cancel()
    if isinstance(sections, HostFacts):
        return HostReading(sections.model_copy(update={"name": host.name}), None)
    error = unreadable(sections)
    if error is not None:
        return HostReading(HostFacts(name=host.name, error=error), None)
    refused = str(ray) if isinstance(ray, ray_http.DashboardRefused) else None
    if isinstance(ray, ray_http.DashboardSilent):
        # Off, starting or failing: `ray status` reads the GCS without it (in the container,
        # with its env: Ray's token too). Its share of the command timeout, so the look stays
        # within one script's time. A refusal is a configuration problem: said in the reading.
        fallback = catalogue.reads.ray_cli(cluster, t)
        more = await _sections(conn, fallback, max(t, cluster.ssh.command_timeout - t))
        if not isinstance(more, HostFacts):
            sections = {**sections, **more}
        ray = None
    extras = (
        head_extras(cluster, sections, observed_at, secrets, known_ray, ray)
        if host.role == "head"
        else None
    )
    if extras is not None and refused is not None:
        said = extras.ray.model_copy(update={"dashboard_refused": refused})
        extras = HeadExtras(ray=said, serve=extras.serve)
    return HostReading(host_facts(cluster, host, sections, observed_at), extras)


async def _sections(
    conn: HostConnection, script: catalogue.remote.Remote, seconds: float
) -> dict[str, parsers.Section] | HostFacts:
    """The script's sections, or the host's failure (a HostFacts with its error)."""
    try:
        result = await conn.run(script.command, timeout=seconds)
        output = result.stdout
    except SshFailure as failure:
        if failure.kind != "exit_nonzero" or failure.result is None:
            return HostFacts(name="", error=failure.error)
        output = failure.result.stdout  # sections carry their own exit codes
    return parsers.parse_sections(output)


async def observe(
    cluster: ClusterSpec,
    pool: SshPool,
    *,
    probe_due: Callable[[ModelEndpoint], bool] = lambda endpoint: endpoint.status == "up",
    wall_clock: Callable[[], float] = time.time,
    ray_status: bool = True,
    known_ray: RayState | None = None,
    checks_due: bool = False,
    prepare: bool = False,
) -> Observed:
    """`ray_status`: read `ray status` beside the node list (a converged cluster can do
    without: one `ray` call a cycle). `known_ray`: Ray's last reading, reused instead of a `ray`
    call (none at all this cycle)."""
    observed_at = wall_clock()
    key_problem: str | None = None
    try:
        api_key = await asyncio.to_thread(read_secret, cluster.model.api_key_file)
    except SecretFileError as exc:
        # Without its key every request would fail as 401 and count against the model:
        # nothing is sent instead (`not_run` never counts), and the reason is in the snapshot.
        api_key, key_problem = None, f"API key unreadable: {exc}"
    ray_token, token_problem = await _ray_token(cluster)
    # Every secret the process knows (the current and the previous key, the control token).
    secrets = REDACTOR.secrets()
    conns = {h.name: pool.connection(h, cluster.ssh) for h in cluster.hosts}
    readings = await asyncio.gather(
        *(
            read_host(
                cluster,
                h,
                conns[h.name],
                observed_at,
                secrets,
                ray_status,
                known_ray,
                prepare,
                ray_token,
            )
            for h in cluster.hosts
        )
    )
    head = cluster.head
    head_reading = next(r for r, h in zip(readings, cluster.hosts, strict=True) if h is head)
    endpoint: ModelEndpoint | None = None
    probe: ProbeResult | None = None
    checks: tuple[CheckResult, ...] | None = None
    extras = head_reading.extras
    fingerprint = key_fingerprint(api_key) if api_key else None
    if extras is not None:
        serve = (
            withhold_foreign_tail(cluster, extras.serve, fingerprint)
            if extras.serve is not None
            else None
        )
        ray = extras.ray
        if ray.dashboard_refused is not None and token_problem is not None:
            ray = ray.model_copy(
                update={"dashboard_refused": f"{ray.dashboard_refused}; {token_problem}"}
            )
        extras = HeadExtras(ray=ray, serve=serve)
    if key_problem is not None and head_reading.facts.reachable:
        endpoint = ModelEndpoint(status="not_run", detail=key_problem)
    elif head_reading.facts.reachable and extras is not None:
        open_channel = opener(conns[head.name], cluster)
        endpoint, load = await model_http.read_endpoint(
            open_channel, cluster, api_key, cluster.ssh.command_timeout
        )
        if probe_due(endpoint):
            # The load /metrics just gave is the probe's "before": read once per cycle.
            probe = await model_http.probe(
                open_channel, cluster, api_key, wall_clock=wall_clock, load_before=load
            )
            # A rollout's acceptance checks go once its probes answer
            # (core.deciding.rollout.checks_due).
            if checks_due and probe.verdict.healthy is True:
                checks = await model_http.run_checks(open_channel, cluster, api_key)
    observed = Observed(
        cluster=cluster.name,
        observed_at=observed_at,
        hosts=tuple(r.facts for r in readings),
        ray=extras.ray if extras is not None else None,
        serve=extras.serve if extras is not None else None,
        endpoint=endpoint,
        probe=probe,
        api_key_fingerprint=fingerprint,
        checks=checks,
    )
    return redacted(observed)


async def _ray_token(cluster: ClusterSpec) -> tuple[str | None, str | None]:
    """Ray's token for the dashboard's reads, or why it could not be read (then the reads go
    without it, and the dashboard's refusal says why)."""
    try:
        return await asyncio.to_thread(read_secret, cluster.ray.auth_token_file), None
    except SecretFileError as exc:
        return None, f"ray.auth_token_file unreadable: {exc}"


def redacted(observed: Observed) -> Observed:
    """The observation with every secret the process knows removed from every string: plan
    reasons, snapshots, `/status` and the memory are made from it."""
    if not REDACTOR.secrets():
        return observed
    document = observed.model_dump(mode="json")
    clean = REDACTOR.redact_json(document)
    return observed if clean == document else Observed.model_validate(clean)


async def probe_once(cluster: ClusterSpec, pool: SshPool) -> ProbeResult:
    """One probe through the head, for `sparkd probe`."""
    conn = pool.connection(cluster.head, cluster.ssh)
    api_key = await asyncio.to_thread(read_secret, cluster.model.api_key_file)
    return await model_http.probe(opener(conn, cluster), cluster, api_key)

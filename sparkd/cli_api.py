"""The subcommands that talk to the running daemon's API: status, pause, resume, reconcile,
rollout."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import sys
import urllib.parse
from typing import Any

import aiohttp

from sparkd.settings import ConfigError, Settings, config_path, load_settings, parse_duration
from sparkd.shell.secrets import SecretFileError, read_secret

BAR = 20


def _settings(args: argparse.Namespace) -> Settings | None:
    try:
        return load_settings(config_path(args.config))
    except ConfigError:
        return None


def _url(args: argparse.Namespace, settings: Settings | None) -> str:
    if args.url:
        return str(args.url).rstrip("/")
    listen = settings.daemon.listen if settings is not None else "127.0.0.1:9810"
    host, _, port = listen.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def main(args: argparse.Namespace) -> int:
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    settings = _settings(args)
    url = _url(args, settings)
    timeout = aiohttp.ClientTimeout(total=15)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if args.command == "status":
                async with session.get(f"{url}/status") as response:
                    body = await response.json()
                if args.json:
                    print(json.dumps(body, indent=2))
                else:
                    print(render_status(body))
                return 0
            if args.command == "rollout" and args.rollout_command == "status":
                async with session.get(f"{url}/status") as response:
                    body = await response.json()
                return print_rollouts(body, args.cluster, args.json)
            return await _control(session, url, args, settings)
    except (aiohttp.ClientError, TimeoutError) as exc:
        print(f"sparkd {args.command}: cannot reach the daemon at {url}: {exc}", file=sys.stderr)
        return 69


async def _control(
    session: aiohttp.ClientSession, url: str, args: argparse.Namespace, settings: Settings | None
) -> int:
    headers = {}
    token_file = settings.daemon.control_token_file if settings is not None else None
    if token_file is not None:
        try:
            token = read_secret(token_file)
        except SecretFileError as exc:
            print(f"sparkd {args.command}: {exc}", file=sys.stderr)
            return 77
        headers["Authorization"] = f"Bearer {token}"
    body: dict[str, Any] = {"by": getpass.getuser()}
    if args.command == "pause":
        body["reason"] = args.reason
        if args.duration:
            try:
                body["for_seconds"] = parse_duration(args.duration)
            except ValueError as exc:
                print(f"sparkd pause: {exc}", file=sys.stderr)
                return 64
    name = urllib.parse.quote(args.cluster, safe="")
    verb = args.command
    if verb == "rollout":
        verb = f"rollout/{args.rollout_command}"
    async with session.post(
        f"{url}/clusters/{name}/{verb}", json=body, headers=headers
    ) as response:
        text = await response.text()
        if response.status != 200:
            print(f"sparkd {args.command}: HTTP {response.status}: {text}", file=sys.stderr)
            return 1
    with contextlib.suppress(ValueError):
        answer = json.loads(text)
        if isinstance(answer, dict) and answer.get("persisted") is False:
            print(f"sparkd {args.command}: {answer.get('warning')}", file=sys.stderr)
    print(f"{args.cluster}: {verb.replace('/', ' ')} done")
    return 0


def print_rollouts(body: dict[str, Any], cluster: str | None, as_json: bool) -> int:
    clusters = [c for c in body.get("clusters", []) if cluster in (None, c.get("cluster"))]
    if cluster is not None and not clusters:
        print(f"sparkd rollout status: no cluster named {cluster!r}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps({c["cluster"]: c.get("rollout") for c in clusters}, indent=2))
        return 0
    for entry in clusters:
        print("\n".join(rollout_lines(entry, always=True)))
    return 0


def rollout_lines(cluster: dict[str, Any], always: bool = False) -> list[str]:
    """`CLUSTER: desired X, running Y, last-good Z`, what differs, and the latest rollout; for
    `sparkd status`, only while the desired spec is not the last-good one (a rollout on, held,
    or failed)."""
    state = cluster.get("rollout") or {}
    latest = state.get("latest") or {}
    settled = state.get("desired") == (state.get("last_good") or {}).get("spec")
    if not always and (settled or not state.get("last_good")):
        return []
    good = (state.get("last_good") or {}).get("spec", "none")
    lines = [
        f"{cluster.get('cluster')}: desired {state.get('desired')}, running "
        f"{state.get('running') or '-'}, last-good {good}"
    ]
    lines.extend(f"  differs: {d}" for d in state.get("differs") or [])
    if latest:
        text = f"  rollout {latest.get('id')}: {latest.get('from')} -> {latest.get('to')}, "
        text += str(latest.get("result"))
        if latest.get("downtime_seconds") is not None:
            text += f", downtime {latest['downtime_seconds']:.0f}s"
        if latest.get("rolled_back"):
            text += f" ({latest['rolled_back']})"
        lines.append(text)
    return lines


def _bar(percent: float | None) -> str:
    if percent is None:
        return ""
    filled = round(BAR * max(0.0, min(100.0, percent)) / 100)
    return f"[{'#' * filled}{'.' * (BAR - filled)}] {percent:.0f}%"


def _ratio(cluster: dict[str, Any]) -> str:
    probes = cluster.get("probes") or {}
    ratio = probes.get("reasoning_only_ratio")
    if ratio is None:
        return "-"
    return f"{100 * ratio:.0f}% of {probes.get('window', 0)}"


def render_status(body: dict[str, Any]) -> str:
    rows = [("CLUSTER", "PHASE", "GPUS", "MODEL", "PROBE", "REASONING-ONLY", "REASON")]
    for cluster in body.get("clusters", []):
        snapshot = cluster.get("snapshot") or {}
        ray = snapshot.get("ray") or {}
        gpus = f"{ray.get('gpus_total', 0):g}" if ray and not ray.get("error") else "-"
        serve = snapshot.get("serve") or {}
        endpoint = snapshot.get("endpoint") or {}
        if cluster.get("phase") == "loading":
            progress = serve.get("progress") or {}
            model = _bar(progress.get("percent")) or progress.get("stage", "loading")
        elif endpoint.get("status") == "up":
            model = (
                "serving"
                if endpoint.get("health_status") == 200
                else f"HTTP {endpoint.get('health_status')}"
            )
        else:
            model = "running" if serve.get("running") else "down"
        # The probe of this cycle, else the latest one: probes run less often than cycles.
        probe = snapshot.get("probe") or (snapshot.get("memory") or {}).get("last_probe") or {}
        verdict = probe.get("verdict") or {}
        latency = probe.get("latency_seconds")
        probe_text = verdict.get("outcome", "-")
        if latency is not None:
            probe_text += f" {latency:.2f}s"
        phase = cluster.get("phase") or "-"
        if cluster.get("paused"):
            phase += " (paused)"
        triage = [str(t) for t in cluster.get("triage") or []]
        if triage:
            phase += f" [{','.join(triage)}]"
        rows.append(
            (
                cluster["cluster"],
                phase,
                gpus,
                model,
                probe_text,
                _ratio(cluster),
                cluster.get("reason", ""),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(6)]
    lines = []
    for row in rows:
        cells = [str(c).ljust(w) for c, w in zip(row[:6], widths, strict=True)]
        lines.append("  ".join([*cells, str(row[6])]))
    for cluster in body.get("clusters", []):
        lines.extend(rollout_lines(cluster))
    lines.extend(_ha_lines(body.get("ha")))
    return "\n".join(lines)


def _ha_lines(ha: Any) -> list[str]:
    """`ha: <instance> (etcd ...)` and one line per cluster: owner, standby or no etcd."""
    if not isinstance(ha, dict):
        return []
    lines = [f"ha: instance {ha.get('instance')}, etcd {ha.get('etcd')} ({ha.get('endpoint')})"]
    for name, claim in (ha.get("clusters") or {}).items():
        role = claim.get("role", "-")
        if role == "owner":
            detail = f" (token {claim.get('token')})"
        elif claim.get("holder"):
            detail = f" (owner: {claim.get('holder')})"
        else:
            detail = ""
        lines.append(f"  {name}: {role}{detail}")
    return lines

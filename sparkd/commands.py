"""Argument parsing and the subcommands that need no daemon."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from sparkd import __version__
from sparkd.core.planner import plan
from sparkd.model.plan import Plan
from sparkd.model.snapshot import load_snapshot
from sparkd.settings import EX_CONFIG, ConfigError, Settings, config_path, load_settings

EX_USAGE = 64
EX_DATAERR = 65


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkd", description="Keeps a multi-node vLLM-on-Ray deployment alive over SSH."
    )
    parser.add_argument("--version", action="version", version=f"sparkd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check-config", help="validate the config file")
    _config_flag(check)

    planner = sub.add_parser("plan", help="print the plan for a saved snapshot")
    _config_flag(planner)
    planner.add_argument(
        "--from-snapshot",
        metavar="FILE",
        type=Path,
        required=True,
        help="a saved snapshot document (docs/snapshot.md)",
    )
    planner.add_argument("--json", action="store_true", help="print the plan as JSON")
    planner.add_argument("--dry-run", action="store_true", help="plan as `run --dry-run` would")

    return parser


def _config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="config file (default: $SPARKD_CONFIG or /etc/sparkd/sparkd.toml)",
    )


def dispatch(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if args.command == "check-config":
        return check_config(args.config)
    if args.command == "plan":
        return plan_from_snapshot(args.config, args.from_snapshot, args.json, args.dry_run)
    raise AssertionError(args.command)


def _settings(explicit: str | None) -> Settings | int:
    path = config_path(explicit)
    try:
        return load_settings(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EX_CONFIG


def check_config(explicit: str | None) -> int:
    settings = _settings(explicit)
    if isinstance(settings, int):
        return settings
    for cluster in settings.clusters:
        workers = ", ".join(f"{w.name}={w.ip}" for w in cluster.workers) or "none"
        print(
            f"{cluster.name}: head {cluster.head.name}={cluster.head.ip}, workers {workers}; "
            f"{cluster.ray.expected_gpus} GPUs; model {cluster.model.id} on port "
            f"{cluster.model.port} (tp={cluster.model.tensor_parallel_size}, "
            f"pp={cluster.model.pipeline_parallel_size}); image {cluster.ray.image}"
        )
    return 0


def plan_from_snapshot(explicit: str | None, snapshot: Path, as_json: bool, dry_run: bool) -> int:
    settings = _settings(explicit)
    if isinstance(settings, int):
        return settings
    try:
        document = load_snapshot(snapshot.read_bytes())
    except OSError as exc:
        print(f"{snapshot}: {exc.strerror}", file=sys.stderr)
        return EX_DATAERR
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            loc = ".".join(str(p) for p in error["loc"])
            print(f"{snapshot}: {loc}: {error['msg']}", file=sys.stderr)
        return EX_DATAERR
    cluster = settings.cluster(document.cluster)
    if cluster is None:
        known = ", ".join(c.name for c in settings.clusters)
        print(
            f"{snapshot}: cluster {document.cluster!r} is not in the config ({known})",
            file=sys.stderr,
        )
        return EX_DATAERR
    result = plan(
        cluster, document.observed(), document.memory, document.observed_at, dry_run=dry_run
    )
    if as_json:
        print(json.dumps([result.public()], indent=2))
    else:
        print(render_plan(result))
    return 0


def render_plan(result: Plan) -> str:
    state = "converged" if result.converged else "not converged"
    lines = [f"{result.cluster}: {result.phase} ({state}): {result.reason}"]
    for number, action in enumerate(result.actions, 1):
        lines.append(f"  {number}. {action.kind} {action.target} on {action.host}: {action.reason}")
    for action in result.withheld:
        lines.append(f"  -  {action.kind} {action.target} on {action.host} (withheld)")
    if not result.actions and not result.withheld:
        lines.append("  nothing to do")
    return "\n".join(lines)

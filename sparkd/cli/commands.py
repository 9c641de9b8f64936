"""Argument parsing and the subcommands that need no daemon."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from importlib.metadata import entry_points
from pathlib import Path

from pydantic import ValidationError

from sparkd import __version__
from sparkd.cli import api
from sparkd.cli.output import render_plan
from sparkd.config_file import config_path
from sparkd.model.exits import EX_CONFIG, EX_DATAERR, EX_USAGE
from sparkd.settings import ConfigError, Settings, load_settings
from sparkd.shell.cron import cron_trigger


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkd", description="Keeps a multi-node vLLM-on-Ray deployment alive over SSH."
    )
    parser.add_argument("--version", action="version", version=f"sparkd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _config_command(sub, "check-config", "validate the config file")

    planner = _config_command(sub, "plan", "observe the hosts (or replay a snapshot) and plan")
    planner.add_argument(
        "--from-snapshot",
        metavar="FILE",
        type=Path,
        help="replay a saved snapshot document (docs/snapshot.md) instead of observing",
    )
    planner.add_argument(
        "--save-snapshot", metavar="FILE", type=Path, help="write what was observed to FILE"
    )
    planner.add_argument("--json", action="store_true", help="print the plan as JSON")
    planner.add_argument("--dry-run", action="store_true", help="plan as `run --dry-run` would")
    planner.add_argument(
        "--probe",
        action="store_true",
        help="also send one sanity completion (by default plan only reads, and puts no load "
        "on the model)",
    )

    probe = _config_command(sub, "probe", "send one sanity completion and classify it")
    probe.add_argument("--cluster", help="the cluster to probe (default: the first)")
    probe.add_argument("--json", action="store_true")

    once = _config_command(sub, "once", "one cycle: observe, plan, act; exit 0 when converged")
    once.add_argument("--dry-run", action="store_true", help="observe and plan, change nothing")
    once.add_argument("--json", action="store_true")

    run = _config_command(sub, "run", "run the daemon")
    run.add_argument("--dry-run", action="store_true", help="observe and plan, change nothing")

    api.add_commands(sub)

    commands = _config_command(sub, "commands", "every remote command sparkd may run")
    commands.add_argument("--sudoers", metavar="USER", help="print a sudoers snippet for USER")
    commands.add_argument(
        "--forced-command",
        action="store_true",
        help="print each host's authorized_keys forced-command wrapper and the line installing "
        "it (regenerate whenever the config changes)",
    )
    commands.add_argument(
        "--host", metavar="NAME", help="with --forced-command: only this host's wrapper"
    )
    commands.add_argument(
        "--last-good",
        action="store_true",
        help="also admit (list) the commands of the last-good spec the state dir remembers, "
        "which a rollback launches: only one this box's configs ran, its hash checked, and "
        "never one wider than the config in extra_docker_args, mounts, env names or image",
    )

    known = sub.add_parser("known-hosts", help="the hosts' SSH keys, checked out of band")
    known_sub = known.add_subparsers(dest="known_hosts_command", required=True, metavar="ACTION")
    scan = _config_command(
        known_sub,
        "scan",
        "print each host key's SHA256 fingerprint; write known_hosts_file with --accept",
    )
    scan.add_argument(
        "--accept",
        action="store_true",
        help="write the scanned keys to known_hosts_file (only after checking the fingerprints)",
    )

    init = sub.add_parser(
        "init",
        help="read a running deployment over SSH and print a commented config for it",
        description="Reads the hosts' running deployment with read-only commands and prints a "
        "commented config draft (docs/init.md). Host keys must already be in --known-hosts.",
    )
    init.add_argument("--ssh-user", required=True, metavar="USER")
    init.add_argument("--key", required=True, metavar="FILE", help="the SSH private key")
    init.add_argument("--known-hosts", required=True, metavar="FILE")
    init.add_argument("--name", default="sparks", help="the cluster's name (default: sparks)")
    init.add_argument("hosts", nargs="+", metavar="HOST[:PORT]", help="SSH addresses")

    ha = sub.add_parser("ha", help="controller HA on etcd: operator steps")
    ha_sub = ha.add_subparsers(dest="ha_command", required=True, metavar="ACTION")
    refence = _config_command(
        ha_sub,
        "refence",
        "after etcd was rebuilt: give the cluster's hosts the current owner's token",
    )
    refence.add_argument("cluster", metavar="CLUSTER")
    refence.add_argument(
        "--force",
        action="store_true",
        help="write the current owner's token over any record, a newer one of the same etcd too "
        "(a token planted above every etcd revision locks every owner out); only once no "
        "former owner can still act",
    )

    # The simulator is its own distribution (sparkd-sim); these two are its entry points.
    for name, what in PLUGIN_COMMANDS.items():
        served = sub.add_parser(name, help=f"{what} (needs sparkd-sim)", add_help=False)
        served.add_argument("plugin_args", nargs=argparse.REMAINDER)
    return parser


_config_command = api.config_command


PLUGIN_COMMANDS = {
    "sim": "run the simulated Spark cluster",
    "demo": "the simulated cluster and the daemon, recovering",
}
PLUGIN_GROUP = "sparkd.commands"


def plugin(name: str, argv: Sequence[str]) -> int:
    """`sparkd sim` and `sparkd demo`, served by whatever distribution registers them in the
    `sparkd.commands` entry-point group (sparkd-sim does): the daemon never imports the simulator,
    and its wheel and image hold none."""
    found = entry_points(group=PLUGIN_GROUP, name=name)
    if not found:
        print(f"sparkd {name}: the simulator is not installed (pip install sparkd-sim, or in a "
              "checkout: make demo)", file=sys.stderr)  # fmt: skip
        return EX_USAGE
    command: Callable[[Sequence[str]], int] = next(iter(found)).load()
    return command(argv)


def dispatch(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv[:1] and argv[0] in PLUGIN_COMMANDS:
        # The plugin parses its own options (argparse's REMAINDER would take none of them).
        return plugin(argv[0], argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        return check_config(args.config)
    if args.command == "plan" and args.from_snapshot is not None:
        if args.probe:
            print("sparkd plan: --probe observes the hosts; it cannot replay a snapshot",
                  file=sys.stderr)  # fmt: skip
            return EX_USAGE
        return plan_from_snapshot(args.config, args.from_snapshot, args.json, args.dry_run)
    if args.command == "known-hosts":
        return known_hosts_scan(args.config, args.accept)
    if args.command == "init":
        from sparkd.cli.init import init

        return init(args)
    if args.command == "ha":
        return ha_refence(args.config, args.cluster, args.force)
    if args.command in api.COMMANDS:
        return api.main(args)
    from sparkd.cli import live

    settings = _settings(args.config)
    if isinstance(settings, int):
        return settings
    return live.main(args, settings, Path(config_path(args.config)))


# C0 and C1 controls, DEL, and the bidirectional overrides and isolates: a terminal acts on them.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every character a terminal would act on written as its escape (`\\x1b`)."""
    return _CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _settings(explicit: str | None) -> Settings | int:
    path = Path(config_path(explicit))
    try:
        return load_settings(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(printable(problem), file=sys.stderr)
        return EX_CONFIG


def known_hosts_scan(explicit: str | None, accept: bool) -> int:
    settings = _settings(explicit)
    if isinstance(settings, int):
        return settings
    import asyncio

    from sparkd.shell import known_hosts

    return asyncio.run(known_hosts.scan(settings.clusters, accept, sys.stdout, sys.stderr))


def ha_refence(explicit: str | None, cluster: str, force: bool = False) -> int:
    settings = _settings(explicit)
    if isinstance(settings, int):
        return settings
    import asyncio

    from sparkd.ha.refence import refence

    return asyncio.run(
        refence(
            settings.ha, settings.cluster(cluster), cluster, sys.stdout, sys.stderr, force=force
        )
    )


def check_config(explicit: str | None) -> int:
    settings = _settings(explicit)
    if isinstance(settings, int):
        return settings
    from sparkd.preflight import problems, warnings

    found = problems(settings)
    if found:
        for problem in found:
            print(printable(problem), file=sys.stderr)
        return EX_CONFIG
    for warning in warnings(settings):
        print(printable(f"warning: {warning}"), file=sys.stderr)
    for cluster in settings.clusters:
        workers = ", ".join(f"{w.name}={w.ip}" for w in cluster.workers) or "none"
        model = cluster.model
        served = f" served as {model.served_name}" if model.served_name != model.id else ""
        print(printable(
            f"{cluster.name}: head {cluster.head.name}={cluster.head.ip}, workers {workers}; "
            f"{cluster.ray.expected_gpus} GPUs; model {model.id}{served} on port "
            f"{cluster.model.port} (tp={cluster.model.tensor_parallel_size}, "
            f"pp={cluster.model.pipeline_parallel_size}); image {cluster.ray.image}"
        ))  # fmt: skip
        for spec in cluster.maintenance:
            trigger = cron_trigger(spec)
            first = trigger.get_next_fire_time(None, datetime.now(trigger.timezone))
            opens = first.isoformat(timespec="minutes") if first is not None else "never"
            print(printable(
                f"  maintenance {spec.cron!r} ({trigger.timezone}) for {spec.duration:g}s: "
                f"{spec.reason}; next {opens}"
            ))  # fmt: skip
    ha = settings.ha
    if ha is not None:
        print(
            printable(
                f"ha: instance {ha.instance}; etcd {', '.join(ha.etcd_endpoints)}; lease "
                f"{ha.lease_ttl}s, renew {ha.renew_interval:g}s, request timeout "
                f"{ha.request_timeout:g}s, margin {ha.margin:g}s; prefix {ha.prefix}"
            )
        )
    return 0


def plan_from_snapshot(explicit: str | None, snapshot: Path, as_json: bool, dry_run: bool) -> int:
    # The planner only here: `probe` and `check-config` start without it.
    from sparkd.core.deciding.planner import plan
    from sparkd.model.snapshot import load_snapshot

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

"""The subcommands that talk to the hosts: plan, probe, once, run, commands."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkd.cli.output import render_plan
from sparkd.core.text import printable
from sparkd.model.cluster import ClusterSpec
from sparkd.model.exits import EX_CONFIG, EX_DATAERR, EX_TEMPFAIL, EX_USAGE
from sparkd.model.observed import ModelEndpoint
from sparkd.model.plan import Plan
from sparkd.model.probe import ProbeResult
from sparkd.runtime import logs
from sparkd.runtime.state import LockHeld, StateDir
from sparkd.settings import Settings
from sparkd.shell import catalogue, forced, power, secrets
from sparkd.shell.observe import observe, probe_once
from sparkd.shell.ssh import SshPool


def main(args: argparse.Namespace, settings: Settings, config: Path) -> int:
    command: str = args.command
    secrets.prime(
        [c.model.api_key_file for c in settings.clusters]
        + [c.ray.auth_token_file for c in settings.clusters]
        + [settings.daemon.control_token_file]
    )
    if command == "plan":
        return asyncio.run(
            live_plan(settings, args.json, args.dry_run, args.save_snapshot, probe=args.probe)
        )
    if command == "probe":
        return asyncio.run(probe(settings, args.cluster, args.json))
    if command == "once":
        logs.configure(settings.daemon.log_format, stream=sys.stderr)
        return asyncio.run(once(settings, args.dry_run, args.json))
    if command == "run":
        logs.configure(settings.daemon.log_format)
        return run(settings, config, args.dry_run)
    if command == "commands" and args.forced_command:
        return print_forced_commands(settings, args.host, args.last_good)
    if command == "commands":
        if args.host is not None:
            print("sparkd commands: --host goes with --forced-command", file=sys.stderr)
            return EX_USAGE
        return print_commands(settings, args.sudoers, args.last_good)
    raise AssertionError(command)


async def live_plan(
    settings: Settings, as_json: bool, dry_run: bool, save: Path | None, *, probe: bool = False
) -> int:
    """Observe and plan, acting on nothing. Reading /health, /v1/models and /metrics puts no load
    on the model; a completion does, so one is sent only when asked for (`--probe`)."""
    # The planner only here: `probe` starts without it.
    from sparkd.core.deciding.planner import plan as make_plan
    from sparkd.model.snapshot import dump_snapshot

    state = StateDir(settings.daemon.state_dir)
    pool = SshPool()

    def probe_due(endpoint: ModelEndpoint) -> bool:
        return probe and endpoint.status == "up"

    try:
        observed = await asyncio.gather(
            *(observe(c, pool, probe_due=probe_due) for c in settings.clusters)
        )
    finally:
        await pool.close()
    plans: list[Plan] = []
    documents: list[str] = []
    for cluster, seen in zip(settings.clusters, observed, strict=True):
        memory = state.peek_memory(cluster.name)
        plans.append(make_plan(cluster, seen, memory, seen.observed_at, dry_run=dry_run))
        documents.append(dump_snapshot(seen, memory))
    if save is not None:
        # One document per cluster; with several clusters they go to FILE, FILE.1, ...
        for index, document in enumerate(documents):
            target = save if index == 0 else save.with_name(f"{save.name}.{index}")
            write_private(target, (document + "\n").encode())
    if as_json:
        print(json.dumps([p.public() for p in plans], indent=2))
    else:
        print("\n".join(render_plan(p) for p in plans))
    return 0


def write_private(path: Path, data: bytes) -> None:
    """0600 whatever the umask (a snapshot holds what the hosts showed), an older file included."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _cluster(settings: Settings, name: str | None) -> ClusterSpec | None:
    if name is None:
        return settings.clusters[0]
    return settings.cluster(name)


def probe_json(result: ProbeResult) -> dict[str, Any]:
    verdict = result.verdict
    return {
        "outcome": verdict.outcome,
        "healthy": verdict.healthy,
        "latency_seconds": result.latency_seconds,
        "ttft_seconds": result.ttft_seconds,
        "completion_tokens": verdict.completion_tokens,
        "finish_reason": verdict.finish_reason,
        "detail": verdict.detail,
    }


async def probe(settings: Settings, name: str | None, as_json: bool) -> int:
    cluster = _cluster(settings, name)
    if cluster is None:
        print(f"no cluster named {name!r}", file=sys.stderr)
        return EX_USAGE
    pool = SshPool()
    try:
        result = await probe_once(cluster, pool)
    except secrets.SecretFileError as exc:
        print(f"sparkd probe: model.api_key_file: {exc}", file=sys.stderr)
        return EX_CONFIG
    finally:
        await pool.close()
    if as_json:
        print(json.dumps(probe_json(result), indent=2))
    else:
        verdict = result.verdict
        latency = f" in {result.latency_seconds:.2f}s" if result.latency_seconds else ""
        tokens = verdict.completion_tokens
        health = {True: "healthy", False: "unhealthy", None: "unknown"}[verdict.healthy]
        print(f"{cluster.name}: {verdict.outcome} ({health}){latency}, {tokens} completion tokens")
        if verdict.detail:
            print(f"  {verdict.detail}")
    return 0 if result.verdict.healthy else 1


async def once(settings: Settings, dry_run: bool, as_json: bool) -> int:
    # The controller and the daemon's pieces only here and in `run`: `plan` and `probe` start
    # without the web stack, the scheduler and the metrics.
    from sparkd.runtime.controller import Controller
    from sparkd.runtime.startup import StartupError, held_state_dir
    from sparkd.runtime.status_json import outcome_json

    if settings.ha is not None and not dry_run:
        # Only the instance owning a cluster acts on it; a one-off cycle owns nothing.
        print("sparkd once: with [ha], only the owning instance acts; use --dry-run, or "
              "`sparkd reconcile CLUSTER` against the owner", file=sys.stderr)  # fmt: skip
        return EX_TEMPFAIL
    state = StateDir(settings.daemon.state_dir)
    try:
        with held_state_dir(state):
            pool = SshPool()
            try:
                controllers = [
                    Controller(c, pool, state, dry_run=dry_run) for c in settings.clusters
                ]
                plans = await asyncio.gather(*(c.cycle() for c in controllers))
            finally:
                await pool.close()
    except LockHeld as exc:
        print(f"sparkd once: {exc}; the daemon is acting, not starting a second controller",
              file=sys.stderr)  # fmt: skip
        return EX_TEMPFAIL
    except StartupError as exc:
        print(f"sparkd once: {exc.line}", file=sys.stderr)
        return exc.code
    if as_json:
        out = [
            {**p.public(), "outcomes": [outcome_json(o) for o in c.view.recent]}
            for p, c in zip(plans, controllers, strict=True)
        ]
        print(json.dumps(out, indent=2))
    else:
        for p, c in zip(plans, controllers, strict=True):
            print(render_plan(p))
            for outcome in reversed(c.view.recent):
                print(f"  -> {outcome.action.kind} {outcome.action.target}: {outcome.result}"
                      f" {outcome.detail}")  # fmt: skip
    return 0 if all(p.converged for p in plans) else 1


def run(settings: Settings, config: Path, dry_run: bool) -> int:
    """A config that fails only when used (a busy port, an unusable state dir) ends the run
    with one line and EX_CONFIG or EX_CANTCREAT, also sent to systemd as STATUS."""
    from sparkd.runtime.daemon import Daemon
    from sparkd.runtime.notify import Notifier
    from sparkd.runtime.startup import StartupError, held_state_dir

    # The composition root: the daemon gets its HTTP API from the layer above it.
    from sparkd.web.serve import serve_api

    notifier = Notifier()
    state = StateDir(settings.daemon.state_dir)
    try:
        with held_state_dir(state):
            daemon = Daemon(settings, config, dry_run=dry_run, notifier=notifier, api=serve_api)
            asyncio.run(daemon.serve_forever())
    except LockHeld as exc:
        print(f"sparkd run: {exc}", file=sys.stderr)
        return EX_TEMPFAIL
    except StartupError as exc:
        print(f"sparkd run: {exc.line}", file=sys.stderr)
        notifier.status(exc.line)
        return exc.code
    return 0


def print_commands(settings: Settings, sudoers: str | None, admit: bool = False) -> int:
    """Every command for review; with `sudoers`, the sudoers snippet alone, so the whole output
    can go to `visudo -f` as its header says. With `admit` (`--last-good`), the last-good
    spec's commands too (LastGood)."""
    privileged: set[str] = set()
    notes: list[str] = []
    goods = {c.name: last_good_spec(settings, c, admit) for c in settings.clusters}
    if sudoers is None and _refused(goods):
        return EX_DATAERR
    for cluster in settings.clusters:
        if sudoers is None:
            print(f"# cluster {cluster.name}")
            for line in goods[cluster.name].notes:
                print(printable(f"# {line}"))
            seen: set[tuple[str, str]] = set()
            also = goods[cluster.name].spec
            for spec in (cluster,) if also is None else (cluster, also):
                for host, remote in catalogue.catalogue(spec, spec.ssh.command_timeout):
                    if spec is not cluster and (host.name, remote.command) in seen:
                        continue
                    seen.add((host.name, remote.command))
                    kind = "changes" if remote.mutating else "reads"
                    of = "" if spec is cluster else ", of the last-good spec a rollback launches"
                    print(f"## {remote.name} on {host.name} ({kind}{of})")
                    print(remote.command.rstrip("\n"))
                    print()
            for host in cluster.hosts if cluster.power.enabled else ():
                # Run on this box, as an argv (shown quoted), never over SSH or through a shell.
                print(f"## power_cycle of {host.name} on the ops box (changes)")
                print(shlex.join(power.power_argv(cluster.power, host.name)))
                print()
        rules, refused = catalogue.kinds.sudoers_rules(cluster)
        privileged.update(rules)
        for unit in refused:
            note = f"# {unit}: sudoers cannot match this name exactly; not allowed, stop it by hand"
            if sudoers is None:
                print(note)
            notes.append(note)
    if sudoers is None:
        return 0
    print("# sudoers snippet (visudo -f /etc/sudoers.d/sparkd; sudo 1.9.10 or later for the")
    print("# ^...$ argument pattern); set ssh.sudo = true. See docs/security.md.")
    for note in notes:
        print(note)
    print(f"{sudoers} ALL=(root) NOPASSWD: " + ", \\\n    ".join(sorted(privileged)))
    return 0


def print_forced_commands(settings: Settings, only: str | None, admit: bool = False) -> int:
    """Each host's wrapper program, its header holding the authorized_keys line; with `only`,
    exactly one program, ready to be saved as the wrapper. With `admit` (`--last-good`), the
    last-good spec's commands pass too (LastGood)."""
    hosts = [(c, h) for c in settings.clusters for h in c.hosts if only in (None, h.name)]
    if not hosts:
        known = ", ".join(h.name for c in settings.clusters for h in c.hosts)
        print(f"sparkd commands: no host {only!r} in the config ({known})", file=sys.stderr)
        return EX_USAGE
    goods = {c.name: last_good_spec(settings, c, admit) for c in settings.clusters}
    if _refused(goods):
        return EX_DATAERR
    for number, (cluster, host) in enumerate(hosts):
        if only is None:
            if number:
                print()
            print(f"# ===== {cluster.name}/{host.name}: the wrapper for this host follows")
        key = forced.public_key(cluster.ssh)
        good = goods[cluster.name]
        ha = settings.ha
        unfenced = ha is not None and not ha.host_fencing
        fenced = ha is not None
        text = forced.wrapper(
            cluster, host, key, fenced=fenced, also=good.spec, unfenced=unfenced,
            notes=tuple(printable(n) for n in good.notes),
        )  # fmt: skip
        print(text, end="")
    return 0


@dataclass(frozen=True)
class LastGood:
    """The last-good spec the state dir remembers, when it is not the desired one: a rollback
    launches it (core.deciding.rollout.acting_spec), so its commands pass the wrapper only if `spec`
    is set: asked for (`--last-good`), its hash checked, one this box's configs ran, and no wider
    than the config in a security-relevant field (core.deciding.known_specs.SECURITY_FIELDS)."""

    spec: ClusterSpec | None = None
    # Comment lines for the wrapper's header and `sparkd commands`: what it differs by, and
    # whether its commands are admitted.
    notes: tuple[str, ...] = ()
    # Why `--last-good` cannot admit it.
    refused: tuple[str, ...] = ()


def _refused(goods: dict[str, LastGood]) -> bool:
    found = False
    for name, good in sorted(goods.items()):
        for line in good.refused:
            print(printable(f"sparkd commands: {name}: {line}"), file=sys.stderr)
            found = True
    return found


def last_good_spec(settings: Settings, cluster: ClusterSpec, admit: bool = False) -> LastGood:
    from sparkd.core import spec
    from sparkd.core.deciding import known_specs, rollout
    from sparkd.runtime.spec_history import SpecHistory

    state = StateDir(settings.daemon.state_dir)
    good = state.peek_memory(cluster.name).last_good
    if good is None or good.hash == spec.identity(cluster):
        return LastGood()
    head = f"last-good spec {good.hash} (a rollback launches it)"
    if known_specs.hash_of(cluster, known_specs.KnownSpec(good.ray, good.model)) != good.hash:
        why = f"{head}: its sections in the state dir do not make its hash; not admitted"
        return LastGood(notes=(why,), refused=(why,) if admit else ())
    history = SpecHistory(state).known(cluster.name, seed=good)
    ours = known_specs.trusted(cluster, history).get(good.hash)
    if ours is None:
        why = f"{head}: no config on this box ran it (not in its spec history); not admitted"
        return LastGood(notes=(why,), refused=(why,) if admit else ())
    # What a rollback launches: the history's sections (core.deciding.known_specs.vet).
    good = good.model_copy(update={"ray": ours.ray, "model": ours.model})
    differs = [f"  {line}" for line in rollout.differs(cluster, good)]
    notes = [f"{head} differs from the config (LAST-GOOD -> CONFIG) by:", *differs]
    wider = known_specs.security_differences(cluster, ours)
    if wider:
        notes.append("it is wider than the config in a security-relevant field, never admitted:")
        notes += [f"  {line}" for line in wider]
        refused = tuple(f"{head} is wider than the config: {line}" for line in wider)
        return LastGood(notes=tuple(notes), refused=refused if admit else ())
    if not admit:
        notes.append(
            "its commands are NOT admitted (a rollback to it is refused on the hosts); "
            "regenerate with --last-good to admit them"
        )
        return LastGood(notes=tuple(notes))
    notes.append("its commands are admitted (--last-good)")
    return LastGood(spec=spec.spec_of(cluster, good), notes=tuple(notes))

"""`sparkd sim`: run a simulated world in the foreground, or inject a fault into a running one.

sparkd sim --scenario seed-morning [--hosts N] [--clusters N] [--dir PATH] [--realistic]
           [--scale F] [--first-address IP]
sparkd sim fault NAME HOST [ARG] [--dir PATH]
sparkd sim power cycle HOST [--dir PATH]

With `--scenario healthy` the world is printed once its models are launched; with `spec_labels`
(see `main`) what it starts carries sparkd's own spec hashes for the config it prints, so a
daemon pointed at that config finds nothing to change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from pathlib import Path

from sparkd_sim import power
from sparkd_sim.contract import SpecLabels
from sparkd_sim.control import send_fault
from sparkd_sim.timing import Timing
from sparkd_sim.world import SCENARIOS, World

FAULTS = (
    "reboot", "unreachable", "blackhole", "path-lost", "heal", "crash-model", "hang-engine",
    "oom-capture",
    "wrong-ip", "stray-gpu", "kill-container", "slow-load", "stall-load", "answer-style",
    "hang-tool", "crash-loop", "chatty-stall", "noisy-load", "repull-image", "hang-container",
    "docker-down", "docker-hung", "rename-iface", "hand-restart-serve",
    "full-disk", "lost-gpu", "orphan-engine", "hang-capture", "pull-image",
    "xid-79", "xid-13", "xid-45", "nv-no-memory-wedge", "aer-fatal", "memory-pressure",
    "gid-moved", "mtu-mismatch", "rate-degraded", "link-flap", "rail-down",
    "late-delivery",
    "missing-weights", "hang-under-load", "vanish-weights", "long-prompt",
)  # fmt: skip


def default_dir() -> Path:
    """Where `sparkd sim` keeps its world unless told otherwise (so `fault` finds it)."""
    return Path(tempfile.gettempdir()) / f"sparkd-sim-{os.getuid()}"


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkd sim", description="Run a simulated Spark world.")
    parser.add_argument("--scenario", choices=SCENARIOS, default="seed-morning")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--clusters", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=None, help="world directory")
    parser.add_argument(
        "--realistic", action="store_true", help="measured Ray/vLLM timing (default: fast)"
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every duration")
    parser.add_argument(
        "--first-address",
        default="127.0.0.2",
        help="the first host's loopback address (worlds running at once need ranges of their own)",
    )
    parser.add_argument(
        "--noisy-logs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="model loads print vLLM's and Ray's harmless error-like warnings, as real ones do",
    )
    return parser


def _fault_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkd sim fault", description="Inject a fault into a running simulated world."
    )
    parser.add_argument("fault", choices=FAULTS)
    parser.add_argument("host")
    parser.add_argument("arg", nargs="?", default=None)
    parser.add_argument("--dir", type=Path, default=None, help="world directory")
    return parser


def main(argv: list[str], *, spec_labels: SpecLabels | None = None) -> int:
    """Entry point for `sparkd sim ARGS` (`argv` with or without the leading "sim").
    `spec_labels` computes, from the config the world writes, the `sparkd.spec` values the
    `healthy` scenario stamps (the simulator knows no sparkd: its caller passes sparkd's own
    hashes, and then a daemon pointed at the printed config finds no drift)."""
    if argv[:1] == ["sim"]:
        argv = argv[1:]
    try:
        if argv[:1] == ["fault"]:
            return _fault(_fault_parser().parse_args(argv[1:]))
        if argv[:1] == ["power"]:
            return power.main(argv[1:])
        run_args = _run_parser().parse_args(argv)
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return asyncio.run(_run(run_args, spec_labels))
    except ValueError as exc:
        print(f"sparkd sim: {exc}", file=sys.stderr)
        return 2


def _fault(args: argparse.Namespace) -> int:
    directory: Path = args.dir or default_dir()
    socket = directory / "control.sock"
    try:
        answer = asyncio.run(send_fault(socket, args.fault, args.host, args.arg))
    except (FileNotFoundError, ConnectionRefusedError):
        print(f"sparkd sim: no running world at {directory}", file=sys.stderr)
        return 1
    stream = sys.stdout if answer.get("ok") else sys.stderr
    print(answer.get("message", ""), file=stream)
    return 0 if answer.get("ok") else 1


def world_from(args: argparse.Namespace, spec_labels: SpecLabels | None = None) -> World:
    """The world `sparkd sim ARGS` runs."""
    timing = Timing.realistic() if args.realistic else Timing.fast()
    if args.scale != 1.0:
        timing = timing.scaled(args.scale)
    return World(
        args.dir or default_dir(),
        hosts=args.hosts,
        clusters=args.clusters,
        scenario=args.scenario,
        timing=timing,
        noisy_load_logs=args.noisy_logs,
        first_address=args.first_address,
        spec_labels=spec_labels,
    )


async def _run(args: argparse.Namespace, spec_labels: SpecLabels | None) -> int:
    world = world_from(args, spec_labels)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with world:
        await world.brought_up()
        print(f"simulated world '{args.scenario}' in {world.directory}")
        for host in world.hosts.values():
            print(
                f"  {host.name:<10} {host.cluster:<10} ssh {world.user}@{host.address} -p "
                f"{host.port}  ({host.state.role})"
            )
        print(f"client key:  {world.client_key_path}")
        print(f"known_hosts: {world.known_hosts_path}")
        print(f"config:      {world.config_path}")
        print(f"faults:      sparkd sim fault NAME HOST [ARG] --dir {world.directory}")
        print("Ctrl-C stops the world.", flush=True)
        await stop.wait()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(sig)
    print("world stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

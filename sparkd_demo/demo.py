"""`sparkd demo`: the simulated cluster in its seed-morning state, and the daemon recovering it.

Shows the recovery as it happens (phase changes, each action and its result, load progress),
reaches `healthy` with the probe's verdict, then keeps running with the HTTP API up. With
`--fault NAME` it injects one fault once healthy and shows the detection and the recovery.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sparkd.model.cluster import ClusterSpec
from sparkd.model.plan import ActionOutcome
from sparkd.runtime import logs
from sparkd.runtime.controller import Controller
from sparkd.runtime.daemon import Daemon
from sparkd.settings import Settings, load_settings
from sparkd.shell.execute import ExecutorTiming
from sparkd.web.serve import serve_api
from sparkd_sim.timing import Timing
from sparkd_sim.world import World

# What to inject for each demo fault: (world fault, role of the host), and when the demo plays
# the part of the fix that a restart brings on real hardware (the sim keeps faults until healed).
FAULTS: dict[str, tuple[str, str]] = {
    "reboot-head": ("reboot", "head"),
    "reboot-worker": ("reboot", "worker"),
    "crash-model": ("crash-model", "head"),
    "hang-engine": ("hang-engine", "head"),
    "oom-capture": ("oom-capture", "head"),
    "wrong-ip-worker": ("wrong-ip", "worker"),
    "stray-gpu-head": ("stray-gpu", "head"),
    "unreachable-worker": ("unreachable", "worker"),
    "blackhole-worker": ("blackhole", "worker"),
    "slow-load": ("slow-load", "head"),
    "xid-79": ("xid-79", "worker"),
    "nv-no-memory-wedge": ("nv-no-memory-wedge", "worker"),
    "aer-fatal": ("aer-fatal", "worker"),
    "memory-pressure": ("memory-pressure", "head"),
    "mtu-mismatch": ("mtu-mismatch", "worker"),
    # Not a world fault: a reload whose model.extra_args has a typo (core.deciding.rollout).
    "bad-args": ("reload", "head"),
}
BAD_ARG = "--enable-resoning"
# Faults that need a reload or a re-registration to show: what else happens right after.
FOLLOW_UP: dict[str, tuple[str, str | None]] = {
    "mtu-mismatch": ("crash-model", None),
    "oom-capture": ("crash-model", None),
    "slow-load": ("crash-model", None),
    "wrong-ip-worker": ("kill-container", "worker-container"),
}
# Healed when sparkd takes this remediation (a restart clears it on real hardware).
HEAL_ON_ACTION = {"hang-engine": "restart_model", "wrong-ip-worker": "restart_ray"}
# Healed after this many seconds: the network comes back by itself.
HEAL_AFTER = {"unreachable-worker": 6.0, "blackhole-worker": 6.0}
# Fixed after this many seconds by what only a human does (sparkd holds and says so): the
# reboot a lost GPU needs, the power cycle of a wedged host, memory freed.
HUMAN_FIX = {
    "xid-79": ("reboot", 6.0, "the operator reboots it"),
    "nv-no-memory-wedge": ("reboot", 2.0, "the operator power-cycles it"),
    "aer-fatal": ("reboot", 2.0, "the operator power-cycles it"),
    "memory-pressure": ("heal", 6.0, "the operator frees memory"),
    "mtu-mismatch": ("heal", 6.0, "the operator sets the MTU back to 9000"),
}
# The words of sparkd's that the operator acts on, where acting earlier would show nothing: a
# host is power-cycled once it has wedged and sparkd said so, not while the omen is all there
# is (the wedge comes seconds after the kernel's message). Waited for at most CUE_WAIT seconds.
HUMAN_CUE = {
    "nv-no-memory-wedge": "needs a power cycle",
    "aer-fatal": "needs a power cycle",
}
CUE_WAIT = 120.0
REALISTIC_LOAD = 750.0  # model init + weights + graph capture in Timing.realistic()


def free_port(preferred: int) -> int:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port


def demo_cluster(cluster: ClusterSpec, load_seconds: float) -> ClusterSpec:
    """Intervals short enough to watch, graces scaled to the short load."""
    return cluster.model_copy(
        update={
            "interval": 3.0,
            "recheck_interval": 0.5,
            "probe_interval": 2.0,
            "probe": cluster.probe.model_copy(update={"timeout": 1.5}),
            "ssh": cluster.ssh.model_copy(update={"connect_timeout": 2.0, "command_timeout": 6.0}),
            "ray": cluster.ray.model_copy(update={"join_timeout": 15.0}),
            "model": cluster.model.model_copy(
                update={"load_stall": max(5.0, load_seconds / 2), "load_timeout": load_seconds * 10}
            ),
            "policy": cluster.policy.model_copy(
                update={"backoff_initial": 1.0, "backoff_max": 10.0, "allow_kill_foreign_gpu": True}
            ),
        }
    )


@dataclass
class Narrator:
    """Prints what the daemon does, as it does it."""

    started: float
    last_phase: str | None = None
    last_reason: str | None = None
    last_percent: float | None = None
    healthy_seen: asyncio.Event | None = None
    # Where the demo waits after its fault: healthy again, or (bad-args) rolled back and serving.
    rolled_back: bool = False
    good_seen: asyncio.Event = field(default_factory=asyncio.Event)

    # Words the operator waits for (HUMAN_CUE) and the event set once the daemon said them.
    cue: tuple[str, asyncio.Event] | None = None

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", flush=True)
        if self.cue is not None and self.cue[0] in text:
            self.cue[1].set()

    def cycle(self, controller: Controller) -> None:
        plan = controller.view.plan
        snapshot = controller.view.snapshot
        if plan is None:
            return
        changed = plan.phase != self.last_phase
        # Outside a load (where the bar tells the story) a new reason is news too: the second
        # failed probe, the restart it leads to.
        if changed or (
            plan.phase not in ("loading", "healthy") and plan.reason != self.last_reason
        ):
            self.say(f"{controller.cluster.name}: {plan.phase}: {plan.reason}")
            self.last_phase = plan.phase
            self.last_reason = plan.reason
            if changed:
                self.last_percent = None
        if plan.phase == "loading" and snapshot is not None and snapshot.serve is not None:
            progress = snapshot.serve.progress
            percent = progress.percent if progress is not None else None
            stage = progress.stage if progress is not None else "starting"
            if percent != self.last_percent:
                filled = round(20 * (percent or 0) / 100)
                bar = "#" * filled + "." * (20 - filled)
                self.say(f"  loading [{bar}] {percent or 0:3.0f}% ({stage})")
                self.last_percent = percent
        if controller.memory.last_good is not None:
            self.good_seen.set()
        record = controller.memory.rollout
        held = record is not None and record.restored_at is not None and plan.phase == "degraded"
        done = held if self.rolled_back else plan.converged
        if done and self.healthy_seen is not None and snapshot is not None:
            probe = snapshot.probe
            if probe is not None:
                self.healthy_seen.set()

    def action(self, controller: Controller, outcome: ActionOutcome) -> None:
        a = outcome.action
        took = outcome.finished_at - outcome.started_at
        self.say(
            f"  {a.kind} {a.target} on {a.host}: {outcome.result} ({took:.2f}s) {outcome.detail}"
        )


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(run_demo(args))
    except KeyboardInterrupt:
        return 130


async def run_demo(args: argparse.Namespace) -> int:
    if args.fault is not None and args.fault not in FAULTS:
        print(f"sparkd demo: unknown fault {args.fault!r}; known: {', '.join(FAULTS)}",
              file=sys.stderr)  # fmt: skip
        return 64
    logs.configure("console", level=logging.WARNING)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="sparkd-demo-"))
    timing = Timing.realistic().scaled(args.load_seconds / REALISTIC_LOAD)
    async with World(directory, scenario="seed-morning", timing=timing) as world:
        loaded = load_settings(world.config_path)
        port = free_port(args.port)
        settings = Settings.model_construct(
            daemon=loaded.daemon.model_copy(
                update={"listen": f"127.0.0.1:{port}", "state_dir": directory / "state"}
            ),
            clusters=tuple(demo_cluster(c, args.load_seconds) for c in loaded.clusters),
        )
        narrator = Narrator(started=time.monotonic(), healthy_seen=asyncio.Event())
        cluster = settings.clusters[0]
        hosts = ", ".join(f"{h.name} ({h.role}) ssh {h.address}:{h.port}" for h in cluster.hosts)
        print(f"simulated hosts: {hosts}")
        print(f"world files: {directory}; API: http://127.0.0.1:{port}/status")
        print(f"scenario seed-morning: stale units and GLM containers after a reboot, no Ray; "
              f"model load ~{args.load_seconds:g}s")  # fmt: skip
        heal_on: dict[str, str] = {}

        def on_action(controller: Controller, outcome: ActionOutcome) -> None:
            narrator.action(controller, outcome)
            host = heal_on.get(outcome.action.kind)
            if host is not None:
                heal_on.clear()
                asyncio.get_running_loop().create_task(world.fault("heal", host))

        daemon = Daemon(
            settings,
            world.config_path,
            executor_timing=ExecutorTiming(poll=0.2, serve_appear=15.0, stop_grace=5.0),
            on_plan=narrator.cycle,
            api=serve_api,
        )
        daemon.on_action = on_action
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await daemon.start()
        try:
            if not await _until(narrator.healthy_seen, stop):
                return 130
            narrator.say("healthy: the probe's verdict is shown above (reasoning_only is healthy)")
            if args.fault is not None:
                if args.fault == "bad-args":
                    narrator.rolled_back = True
                    await _bad_args(daemon, settings, narrator)
                else:
                    await _inject(world, cluster, args.fault, narrator, heal_on)
                narrator.healthy_seen = asyncio.Event()
                narrator.last_phase = "healthy"
                if not await _until(narrator.healthy_seen, stop):
                    return 130
                narrator.say(f"recovered from {args.fault}")
            if args.exit_when_healthy:
                return 0
            narrator.say("still watching; Ctrl-C to stop")
            await stop.wait()
            return 0
        finally:
            await daemon.stop()


async def _until(event: asyncio.Event | None, stop: asyncio.Event) -> bool:
    assert event is not None
    waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
    return event.is_set()


async def _bad_args(daemon: Daemon, settings: Settings, narrator: Narrator) -> None:
    """A reload with a typo in `model.extra_args`, once the spec that serves is last-good:
    prepared, cut over, failed, rolled back, serving again."""
    await narrator.good_seen.wait()
    controller = next(iter(daemon.controllers.values()))
    good = controller.memory.last_good
    probes = controller.cluster.rollout.acceptance_probes
    narrator.say(f"last-good spec {good.hash if good else '?'} ({probes} healthy probes)")
    cluster = settings.clusters[0]
    model = cluster.model.model_copy(update={"extra_args": (*cluster.model.extra_args, BAD_ARG)})
    new = settings.model_copy(update={"clusters": (cluster.model_copy(update={"model": model}),)})
    narrator.say(f"reloading with a typo in model.extra_args: {BAD_ARG}")
    narrator.say(f"  reload: {await daemon.apply_settings(new)}")


async def _inject(
    world: World, cluster: ClusterSpec, name: str, narrator: Narrator, heal_on: dict[str, str]
) -> None:
    fault, role = FAULTS[name]
    host = cluster.head if role == "head" else cluster.workers[0]
    cued = asyncio.Event()
    if name in HUMAN_CUE:
        narrator.cue = (HUMAN_CUE[name], cued)
    narrator.say(f"injecting {name}: {await world.fault(fault, host.name)}")
    if name in HEAL_ON_ACTION:
        heal_on[HEAL_ON_ACTION[name]] = host.name
    follow = FOLLOW_UP.get(name)
    if follow is not None:
        extra, arg = follow
        target = cluster.head if extra == "crash-model" else host
        if arg == "worker-container":
            arg = f"sparkd-{cluster.name}-ray-worker"
        narrator.say(f"  then {extra}: {await world.fault(extra, target.name, arg)}")
    if name in HEAL_AFTER:
        await asyncio.sleep(HEAL_AFTER[name])
        narrator.say(f"  the network comes back: {await world.fault('heal', host.name)}")
    if name in HUMAN_FIX:
        fix, after, words = HUMAN_FIX[name]
        if name in HUMAN_CUE:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cued.wait(), CUE_WAIT)
            narrator.cue = None
        await asyncio.sleep(after)
        narrator.say(f"  {words}: {await world.fault(fix, host.name)}")

"""The daemon: controllers, the HTTP API, systemd notification, signals, the state-dir lock."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sparkd.model.plan import ActionOutcome
from sparkd.runtime import logs
from sparkd.runtime.acting import Acting, Alone, OnEtcd
from sparkd.runtime.controller import Controller
from sparkd.runtime.maintenance import MaintenanceScheduler
from sparkd.runtime.metrics import Metrics
from sparkd.runtime.notify import Notifier
from sparkd.runtime.startup import listen_error
from sparkd.runtime.state import StateDir
from sparkd.settings import (
    ConfigError,
    DaemonSettings,
    Settings,
    load_settings,
)
from sparkd.shell.execute import ExecutorTiming
from sparkd.shell.ssh import SshPool

if TYPE_CHECKING:
    from sparkd.ha.ownership import Ownership


# Daemon settings that take effect only at start: a reload reports a change and keeps the old.
RESTART_ONLY = ("listen", "state_dir")


def restart_only_changes(old: DaemonSettings, new: DaemonSettings) -> list[str]:
    """`daemon.X: OLD -> NEW` for each setting that a reload cannot apply."""
    return [
        f"daemon.{name}: {getattr(old, name)} -> {getattr(new, name)}"
        for name in RESTART_ONLY
        if getattr(old, name) != getattr(new, name)
    ]


# Binds the daemon's HTTP API and gives back its runner; OSError when the address is taken.
ApiServer = Callable[["Daemon"], Awaitable[web.AppRunner]]


class Daemon:
    def __init__(
        self,
        settings: Settings,
        config_path: Path,
        *,
        api: ApiServer,
        dry_run: bool = False,
        executor_timing: ExecutorTiming | None = None,
        notifier: Notifier | None = None,
        on_cycle: Callable[[Controller], None] = lambda c: None,
        on_action: Callable[[Controller, ActionOutcome], None] = lambda c, o: None,
        on_plan: Callable[[Controller], None] = lambda c: None,
    ) -> None:
        self.settings = settings
        self.config_path = config_path
        # The HTTP API, from the layer above (sparkd.web.serve.serve_api): started in its place
        # in the start-up order, cleaned up in reverse.
        self.api = api
        self.dry_run = dry_run
        self.executor_timing = executor_timing
        self.notifier = notifier or Notifier()
        self.on_cycle = on_cycle
        self.on_action = on_action
        self.on_plan = on_plan
        self.state = StateDir(settings.daemon.state_dir)
        self.pool = SshPool()
        self.controllers: dict[str, Controller] = {}
        self.metrics = Metrics(lambda: list(self.controllers.values()))
        self.maintenance = MaintenanceScheduler(self._wake)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.stopped = asyncio.Event()
        self.log = logs.get()
        self.runner: web.AppRunner | None = None
        self.started_at = time.time()
        self._reloads: set[asyncio.Task[None]] = set()
        self._reload_lock = asyncio.Lock()
        self._stopping = False
        # Who may act on each cluster: this box alone, or with [ha] the etcd lease's owner.
        self.acting: Acting = Alone(self.state)
        # What start set up, undone by stop in reverse (empty before start).
        self._teardown = contextlib.AsyncExitStack()

    def _controller(self, cluster_name: str) -> Controller:
        cluster = self.settings.cluster(cluster_name)
        assert cluster is not None
        self.metrics.track(cluster)
        self.maintenance.schedule(cluster)
        controller = Controller(
            cluster,
            self.pool,
            self.state,
            dry_run=self.dry_run,
            executor_timing=self.executor_timing,
            on_cycle=self._cycled,
            on_action=lambda controller, outcome: self.on_action(controller, outcome),
            on_plan=lambda controller: self.on_plan(controller),
            on_record=self.metrics.record,
            may_act=lambda: self.acting.may_act(cluster_name),
            fence=self.acting.track(cluster, self.pool),
            store=self.acting.store,
        )
        return controller

    @property
    def ha(self) -> Ownership | None:
        """Set only with an [ha] section: who owns which cluster, through etcd."""
        return self.acting.ha

    async def read_events(
        self, limit: int, cluster: str | None
    ) -> tuple[list[dict[str, Any]], int]:
        """The newest `limit` events (of one cluster or all) and the unreadable records met:
        the state dir's journal, or with [ha] etcd's, the same on every instance."""
        return await self.acting.read_events(limit, cluster)

    def memory_current(self, cluster_name: str) -> bool:
        return self.acting.memory_current(cluster_name)

    def _wake(self, cluster_name: str) -> None:
        controller = self.controllers.get(cluster_name)
        if controller is not None:
            controller.log.info("maintenance_edge")
            controller.wake.set()

    def _cycled(self, controller: Controller) -> None:
        plan = controller.view.plan
        if plan is not None:
            self.notifier.status(f"{controller.cluster.name}: {plan.phase}: {plan.reason}")
        self.on_cycle(controller)

    @property
    def url(self) -> str:
        """The API's base URL as bound (the configured port may be 0 in tests)."""
        assert self.runner is not None
        host, port = self.runner.addresses[0][:2]
        return f"http://{host}:{port}"

    def healthy(self) -> tuple[bool, str]:
        """Liveness, for the watchdog: every controller's loop makes progress. A cycle that
        failed is progress here (a restart would not mend it); /healthz reports it."""
        problems = []
        for name, controller in self.controllers.items():
            ok, why = self._alive(name, controller)
            if not ok:
                problems.append(f"{name}: {why}")
        return (not problems, "; ".join(problems) or "ok")

    def _alive(self, name: str, controller: Controller) -> tuple[bool, str]:
        """The controller's loop makes progress and its task still runs."""
        task = self.tasks.get(name)
        if task is not None and task.done():
            return False, "controller task ended"
        return controller.healthy(controller.monotonic())

    def health(self) -> dict[str, Any]:
        """/healthz: each cluster (progress, and its latest cycle not failing) and whether the
        state dir takes writes; the reason names whatever is at fault."""
        clusters: dict[str, dict[str, Any]] = {}
        problems = []
        for name, controller in self.controllers.items():
            ok, why = self._alive(name, controller)
            if ok and controller.view.last_error is not None:
                ok, why = False, f"cycle failed: {controller.view.last_error}"
            clusters[name] = {"ok": ok, "reason": why}
            role = self.acting.role(name)
            if role is not None:
                clusters[name]["ha"] = role
            if not ok:
                problems.append(f"{name}: {why}")
        state = self.state_dir_health()
        if not state["ok"]:
            problems.append(f"state dir {state['path']}: {state['error']}")
        health: dict[str, Any] = {
            "status": "unhealthy" if problems else "ok",
            "reason": "; ".join(problems) or "ok",
            "clusters": clusters,
            "state_dir": state,
        }
        ha = self.acting.status()
        if ha is not None:
            health["ha"] = ha
        return health

    def state_dir_health(self) -> dict[str, Any]:
        path = self.state.path
        errors = sorted({c.persist_error for c in self.controllers.values() if c.persist_error})
        free: int | None = None
        try:
            stat = os.statvfs(path)
            free = stat.f_bavail * stat.f_frsize
            if not os.access(path, os.W_OK | os.X_OK):
                errors.append("not writable by sparkd")
        except OSError as exc:
            errors.append(exc.strerror or str(exc))
        return {
            "path": str(path),
            "ok": not errors,
            "error": "; ".join(errors) or None,
            "free_bytes": free,
        }

    async def start(self) -> None:
        """Each step pushes its own undoing on a stack: a step that fails unwinds exactly what
        came before it, in reverse, and `stop` unwinds the whole of it the same way."""
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(self.pool.close)
            self.state.ensure()
            if self.settings.ha is not None:
                self.acting = OnEtcd(
                    self.settings.ha,
                    [c.name for c in self.settings.clusters],
                    self.state,
                    self.metrics,
                    self.controllers,
                )
            for cluster in self.settings.clusters:
                self.controllers[cluster.name] = self._controller(cluster.name)
            await self._serve_api(stack)
            self.maintenance.start()
            stack.push_async_callback(self.maintenance.stop)
            # After the API is bound: a daemon that cannot serve never contends. Stopped
            # after the actions in flight (below), so it hands over at once.
            self.acting.start(stack)
            self.acting.close_memory(stack)
            stack.push_async_callback(self._stop_controllers)
            for name, controller in self.controllers.items():
                self.tasks[name] = self._run(controller)
            self._teardown = stack.pop_all()
        daemon = self.settings.daemon
        self.log.info(
            "started",
            listen=daemon.listen,
            clusters=list(self.controllers),
            dry_run=self.dry_run,
            pid=os.getpid(),
        )
        self.notifier.ready(f"watching {len(self.controllers)} cluster(s)")

    async def _serve_api(self, stack: contextlib.AsyncExitStack) -> None:
        try:
            runner = await self.api(self)
        except OSError as exc:
            raise listen_error(self.settings.daemon.listen, exc) from None
        self.runner = runner
        stack.push_async_callback(self._close_api)

    async def _close_api(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            await runner.cleanup()

    async def _stop_controllers(self) -> None:
        """No new actions; the action in flight finishes or times out."""
        for controller in self.controllers.values():
            controller.stop()
        if self.tasks:
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def _run(self, controller: Controller) -> asyncio.Task[None]:
        return asyncio.create_task(
            self._supervise(controller), name=f"controller:{controller.cluster.name}"
        )

    async def _supervise(self, controller: Controller) -> None:
        """A controller whose loop raises is restarted; the others never notice."""
        while not controller.stopping:
            try:
                await controller.run()
            except Exception as exc:
                controller.view.last_error = f"{type(exc).__name__}: {exc}"
                controller.log.exception("controller_failed")
                await asyncio.sleep(controller.cluster.recheck_interval)

    async def watchdog(self) -> None:
        """Ping only while the loop runs and every controller makes progress."""
        interval = self.notifier.watchdog_interval()
        if interval is None:
            return
        while not self.stopped.is_set():
            ok, why = self.healthy()
            if ok:
                self.notifier.watchdog()
            else:
                self.log.warning("watchdog_withheld", reason=why)
            await asyncio.sleep(interval)

    def reload(self) -> None:
        """SIGHUP: load the config again; an invalid one is rejected and the old one kept."""
        if self._stopping:
            self.log.info("reload_ignored", reason="stopping")
            return
        task = asyncio.get_running_loop().create_task(self._reload())
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def _reload(self) -> None:
        async with self._reload_lock:  # one reload at a time: two SIGHUPs, one controller each
            await self._reload_locked()

    async def _reload_locked(self) -> None:
        """RELOADING=1 is always followed by READY=1 (systemd waits for it), whatever happens;
        its STATUS says what the reload did."""
        self.notifier.reloading()
        status = "reload failed: kept the running config"
        try:
            status = await self._apply_reload()
        except Exception:
            self.log.exception("reload_failed")
        finally:
            self.notifier.ready(status)

    async def _apply_reload(self) -> str:
        try:
            new = load_settings(self.config_path)
        except ConfigError as exc:
            self.log.error("reload_rejected", problems=exc.problems)
            first = exc.problems[0] if exc.problems else "invalid config"
            more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
            return f"reload rejected: kept the old config: {first}{more}"
        return await self.apply_settings(new)

    async def apply_settings(self, new: Settings) -> str:
        """Apply settings read and checked as a reload does; returns the reload's status."""
        old = self.settings.daemon
        pending = restart_only_changes(old, new.daemon)
        if pending:
            # The API stays where it is bound and the state where it is locked.
            kept = {name: getattr(old, name) for name in RESTART_ONLY}
            new = new.model_copy(update={"daemon": new.daemon.model_copy(update=kept)})
        if new.ha != self.settings.ha:
            # Who may act is settled once, at start: a reload never turns HA on or off.
            pending.append("ha: changed")
            new = new.model_copy(update={"ha": self.settings.ha})
        self.settings = new
        wanted = {c.name: c for c in new.clusters}
        changed = [
            name
            for name, controller in self.controllers.items()
            if wanted.get(name) != controller.cluster
        ]
        # A changed cluster's controller finishes its cycle (and the action in flight) first.
        for name in changed:
            self.controllers[name].stop()
        await asyncio.gather(*(self.tasks[n] for n in changed if n in self.tasks))
        for name in changed:
            self.controllers.pop(name)
            self.tasks.pop(name, None)
            self.maintenance.unschedule(name)
            if name not in wanted:
                self.acting.untrack(name)
        for cluster in new.clusters:
            if cluster.name not in self.controllers:
                controller = self._controller(cluster.name)
                self.controllers[cluster.name] = controller
                self.tasks[cluster.name] = self._run(controller)
        if pending:
            self.log.warning(
                "reloaded_except", needs_restart=pending, clusters=list(wanted), restarted=changed
            )
            return "reloaded except (needs a restart, old value kept): " + "; ".join(pending)
        self.log.info("reloaded", clusters=list(wanted), restarted=changed)
        return "reloaded"

    async def stop(self) -> None:
        """No new actions; the action in flight finishes or times out. Then the rest of what
        `start` set up, in reverse: HA handed over, the scheduler, the API, the SSH pool."""
        self._stopping = True
        # A reload in progress ends first, so its READY=1 comes before STOPPING=1.
        if self._reloads:
            await asyncio.gather(*self._reloads, return_exceptions=True)
        self.notifier.stopping()
        self.log.info("stopping")
        teardown, self._teardown = self._teardown, contextlib.AsyncExitStack()
        await teardown.aclose()
        self.stopped.set()

    async def serve_forever(self) -> None:
        loop = asyncio.get_running_loop()
        stop_requested = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop_requested.set)
        loop.add_signal_handler(signal.SIGINT, stop_requested.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        await self.start()
        dog = asyncio.create_task(self.watchdog())
        try:
            await stop_requested.wait()
        finally:
            await self.stop()
            dog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dog

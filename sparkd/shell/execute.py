"""Run a plan's actions in order, each bounded by its own timeout, checking what it promised.

Stops at the first failure. Every action re-checks its precondition on the host, so running the
same plan twice never creates a second container or a second serve process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import ENGINE_MARKERS, launch_output
from sparkd.core.spec import container_name, key_fingerprint, model_spec_hashes, ray_spec_hashes
from sparkd.core.text import redact as text_redact
from sparkd.model.cluster import ClusterSpec
from sparkd.model.plan import Action, ActionOutcome, ActionResult, Plan
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue
from sparkd.shell.deadline import bounded
from sparkd.shell.fencing import HostFence, HostRefused
from sparkd.shell.power import PowerFailed, power_argv, run_power
from sparkd.shell.secrets import read_secret, redact
from sparkd.shell.ssh import HostConnection, SshFailure, SshPool

POLL = 0.5
# The first recheck of a process just launched or signalled.
FIRST_LOOK = 0.05
SERVE_APPEAR = 30.0
STOP_GRACE = 20.0
# What one look of a poll saw (Executor._poll).
_Seen = TypeVar("_Seen")


class ActionFailed(Exception):
    """The action ran but its postcondition did not hold."""


@dataclass
class ExecutorTiming:
    """How long things may take; tests shrink these."""

    poll: float = POLL
    serve_appear: float = SERVE_APPEAR
    stop_grace: float = STOP_GRACE


@dataclass
class Executor:
    cluster: ClusterSpec
    pool: SshPool
    timing: ExecutorTiming = field(default_factory=ExecutorTiming)
    wall_clock: Callable[[], float] = time.time
    # Called as each action starts, so the daemon can show what is in flight.
    on_start: Callable[[Action], None] = lambda action: None
    on_finish: Callable[[ActionOutcome], None] = lambda outcome: None
    # With `[ha]`: every mutating command carries the owner's token (None: sent as built).
    fence: HostFence | None = None
    # Awaited before an action's first command: why it must not run (HA: its intent could not
    # be recorded in etcd), or None.
    ready: Callable[[Action], Awaitable[str | None]] | None = None

    def action_timeout(self, action: Action) -> float:
        base = self.cluster.ssh.command_timeout
        rule = catalogue.kinds.ACTIONS[action.kind].timeout
        if rule == "power":
            # The command's own timeout, and the moment it takes to kill what it left.
            return self.cluster.power.timeout + 5.0
        if rule == "ray_start":
            return base * 3
        if rule == "model_start":
            return base * 3 + self.timing.serve_appear + self.timing.stop_grace
        return base * 2 + self.timing.stop_grace

    async def run(
        self, plan: Plan, should_stop: Callable[[], bool] = lambda: False
    ) -> list[ActionOutcome]:
        """Actions in order; stops at the first failure, and starts nothing once stopping.
        Commands are built from the spec the plan acts on (a rollback launches the last-good
        one), by an executor for that spec alone: this one's stays as configured."""
        acting = self if plan.spec is None else dataclasses.replace(self, cluster=plan.spec)
        outcomes: list[ActionOutcome] = []
        for action in plan.actions:
            if should_stop():
                break
            outcome = await acting.run_one(action)
            self.on_finish(outcome)
            outcomes.append(outcome)
            if outcome.result != "ok":
                break
        return outcomes

    async def run_one(self, action: Action) -> ActionOutcome:
        self.on_start(action)
        started = self.wall_clock()
        result: ActionResult = "ok"
        detail = ""
        limit = self.action_timeout(action)
        why = await self.ready(action) if self.ready is not None else None
        if why is not None:
            return ActionOutcome(
                action=action, result="skipped", started_at=started,
                finished_at=self.wall_clock(), detail=why,
            )  # fmt: skip
        try:
            async with bounded(limit):
                detail = await self._dispatch(action)
        except TimeoutError:
            result, detail = "timeout", f"did not finish within {limit:g}s"
        except HostRefused as refused:
            # Nothing ran: no attempt to count against the budget.
            result, detail = "skipped", f"{refused.kind}: {refused.host}: {refused.detail}"
        except SshFailure as failure:
            result = "failed"
            detail = f"{failure.kind}: {failure.error.detail}"
            if failure.result is not None and failure.result.stderr.strip():
                detail += f": {failure.result.stderr.strip().splitlines()[-1][:200]}"
        except (ActionFailed, PowerFailed) as exc:
            result, detail = "failed", str(exc)
        except Exception as exc:  # a failed action is a value: recorded, budgeted, backed off
            result, detail = "failed", f"{type(exc).__name__}: {exc}"[:300]
        return ActionOutcome(
            action=action,
            result=result,
            started_at=started,
            finished_at=self.wall_clock(),
            detail=redact(detail),
        )

    # -- actions ------------------------------------------------------------------------

    def _conn(self, host: HostSpec) -> HostConnection:
        return self.pool.connection(host, self.cluster.ssh)

    async def _sh(self, host: HostSpec, remote: catalogue.remote.Remote) -> str:
        seconds = self.cluster.ssh.command_timeout
        sent = None
        if remote.mutating and self.fence is not None:
            remote, sent = self.fence.wrap(host, remote, seconds)
        try:
            result = await self._conn(host).run(remote.command, timeout=seconds, input=remote.stdin)
        except SshFailure as failure:
            if self.fence is not None and sent is not None:
                self.fence.check(host, failure, sent)
            raise
        return result.stdout

    def _dispatch(self, action: Action) -> Awaitable[str]:
        host = self.cluster.host(action.host)
        handler: Callable[[HostSpec, Action], Awaitable[str]]
        handler = getattr(self, catalogue.kinds.ACTIONS[action.kind].handler)
        return handler(host, action)

    def _built(self, host: HostSpec, action: Action, value: str) -> catalogue.remote.Remote:
        """The kind's one command (its row's builder) for `value`, the part that varies."""
        build = catalogue.kinds.ACTIONS[action.kind].build
        assert build is not None, action.kind
        (remote,) = build(self.cluster, host, value, self.cluster.ssh.command_timeout)
        return remote

    async def _stop_unit(self, host: HostSpec, action: Action) -> str:
        await self._sh(host, self._built(host, action, action.target))
        return f"{action.target} stopped and disabled"

    async def _remove_container(self, host: HostSpec, action: Action) -> str:
        await self._sh(host, self._built(host, action, action.target))
        return f"{action.target} removed"

    async def _read(self, host: HostSpec, remote: catalogue.remote.Remote) -> str | None:
        """A read whose non-zero exit means "there is none" (no container, no file)."""
        try:
            return await self._sh(host, remote)
        except SshFailure as failure:
            if failure.kind == "exit_nonzero":
                return None
            raise

    async def _container_spec(self, host: HostSpec) -> tuple[bool, str | None]:
        """Whether sparkd's container on `host` runs, and the spec label it carries."""
        name = container_name(self.cluster, host)
        out = await self._read(
            host, catalogue.reads.inspect_container(name, self.cluster.ssh.command_timeout)
        )
        running, _, spec = (out or "").strip().partition(" ")
        return running == "true", spec or None

    async def _start_ray(self, host: HostSpec, action: Action) -> str:
        if action.kind != "restart_ray":
            running, spec = await self._container_spec(host)
            if running and spec in ray_spec_hashes(self.cluster, host):
                return f"{action.target} already running with the desired spec"
        await self._sh(host, self._built(host, action, ""))
        # The postcondition is the container running; whether its node joined Ray is the
        # planner's to judge, by node id, on the next looks (no `ray` polling on the head, each
        # call of which costs it seconds of a core).
        running, spec = await self._container_spec(host)
        if not running:
            raise ActionFailed(f"{action.target} is not running after `docker run`")
        return f"{action.target} started"

    async def _serve_rows(self) -> Sequence[parsers.TopRow]:
        seconds = self.cluster.ssh.command_timeout
        out = await self._read(
            self.cluster.head, catalogue.reads.serve_processes(self.cluster, seconds)
        )
        return parsers.parse_docker_top(out) if out is not None else ()

    async def _spec_on_host(self) -> str | None:
        seconds = self.cluster.ssh.command_timeout
        out = await self._read(
            self.cluster.head, catalogue.reads.read_serve_spec(self.cluster, seconds)
        )
        return (out or "").strip() or None

    async def _stop_serve(self, pid: int) -> None:
        """TERM, then KILL, inside the container by its recorded PID (docker access is enough);
        only if that fails, by host PID (needs root or sudo on the host)."""
        head = self.cluster.head
        seconds = self.cluster.ssh.command_timeout
        for signal in ("TERM", "KILL"):
            await self._read(head, catalogue.actions.signal_serve(self.cluster, signal, seconds))
            if await self._gone(pid, self.timing.stop_grace):
                return
        await self._signal(head, pid, "KILL", seconds)
        if not await self._gone(pid, self.timing.stop_grace):
            raise ActionFailed(f"vllm serve pid {pid} survived SIGKILL")

    async def _signal(self, host: HostSpec, pid: int, signal: str, seconds: float) -> None:
        try:
            await self._sh(host, catalogue.actions.kill_process(self.cluster, pid, signal, seconds))
        except SshFailure as failure:
            stderr = failure.result.stderr.lower() if failure.result is not None else ""
            if failure.kind == "exit_nonzero" and "no such process" in stderr:
                return  # already gone
            if failure.kind == "exit_nonzero":
                raise ActionFailed(
                    f"kill -{signal} {pid} on {host.name} failed: "
                    f"{stderr.strip() or 'exit status nonzero'} (does the SSH user need sudo?)"
                ) from None
            raise

    async def _poll(
        self, look: Callable[[], Awaitable[_Seen]], done: Callable[[_Seen], bool], within: float
    ) -> tuple[bool, _Seen]:
        """`look` until `done` holds of what it saw, at most `within`: whether it held, and the
        last sight."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        # A launched or signalled process usually shows within a few milliseconds: look soon,
        # then back off to the poll period for the slow cases.
        pause = min(FIRST_LOOK, self.timing.poll)
        while True:
            seen = await look()
            if done(seen):
                return True, seen
            if loop.time() >= deadline:
                return False, seen
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.timing.poll)

    async def _serve_until(
        self, done: Callable[[parsers.TopRow | None], bool], within: float
    ) -> tuple[bool, parsers.TopRow | None]:
        """Watch the serve process (`docker top`) until `done` holds of it, at most `within`."""

        async def serve() -> parsers.TopRow | None:
            return parsers.find_serve(await self._serve_rows())

        return await self._poll(serve, done, within)

    async def _gone(self, pid: int, within: float) -> bool:
        gone, _ = await self._serve_until(lambda s: s is None or s.pid != pid, within)
        return gone

    async def _start_model(self, host: HostSpec, action: Action) -> str:
        # Before anything is stopped: without its key there must be no half-done restart.
        api_key = await asyncio.to_thread(read_secret, self.cluster.model.api_key_file)
        want = model_spec_hashes(self.cluster, key_fingerprint(api_key) if api_key else None)
        serve = parsers.find_serve(await self._serve_rows())
        if serve is not None:
            if action.kind == "start_model" and await self._spec_on_host() in want:
                return f"vllm serve already running (pid {serve.pid}) with the desired spec"
            await self._stop_serve(serve.pid)
        await self._engine_gone()
        seconds = self.cluster.ssh.command_timeout
        await self._sh(host, catalogue.actions.start_model(self.cluster, seconds, api_key))
        serve = await self._launched(api_key)
        return f"vllm serve launched (pid {serve.pid})"

    async def _launched(self, api_key: str | None) -> parsers.TopRow:
        """The launched serve once `docker top` shows it, within `serve_appear`. A launch that
        ran and ended before a look caught it (bad arguments, an import error: vLLM exits within
        a second or two) fails as soon as that shows, with its last line, not `serve_appear`
        later: the log is read before `top`, so a line the process wrote means it had started
        before a `top` that no longer lists it."""
        seconds = self.cluster.ssh.command_timeout
        tail = catalogue.reads.read_serve_log_tail(self.cluster, seconds)

        async def look() -> tuple[list[str], parsers.TopRow | None]:
            said = launch_output(await self._read(self.cluster.head, tail) or "")
            return said, parsers.find_serve(await self._serve_rows())

        _, (said, serve) = await self._poll(
            look, lambda seen: bool(seen[0]) or seen[1] is not None, self.timing.serve_appear
        )
        if serve is not None:
            return serve
        if said:
            last = text_redact(said[-1], [api_key] if api_key else ())
            raise ActionFailed(f"vllm serve exited right after launch: {last[:300]}")
        raise ActionFailed(
            f"vllm serve not running {self.timing.serve_appear:g}s after launch; see the serve log"
        )

    async def _engine_gone(self) -> None:
        """A launch while the stopped serve's engine still holds the GPUs fails for memory: wait
        for its EngineCore and Ray workers to exit (SIGTERM takes them in ~2.5 s). Ones that stay
        were orphaned; the planner then restarts Ray, which takes them with its containers."""

        async def engine() -> list[parsers.TopRow]:
            return [r for r in await self._serve_rows() if any(m in r.args for m in ENGINE_MARKERS)]

        gone, left = await self._poll(engine, lambda rows: not rows, self.timing.stop_grace)
        if not gone:
            pids = ", ".join(str(r.pid) for r in left)
            raise ActionFailed(
                f"vllm serve stopped, but its engine processes ({pids}) still hold the GPUs"
            )

    async def _prune_cache(self, host: HostSpec, action: Action) -> str:
        await self._sh(host, self._built(host, action, action.target))
        return f"compile cache entry {action.target} removed"

    async def _kill_gpu_process(self, host: HostSpec, action: Action) -> str:
        """Only a compute process `nvidia-smi` lists right now, by the name it was judged by;
        never PID 0, 1 or a negative PID (a process group, or everything)."""
        seconds = self.cluster.ssh.command_timeout
        pid = int(action.target) if action.target.isascii() and action.target.isdigit() else 0
        if pid <= 1:
            raise ActionFailed(f"refusing to signal pid {action.target!r}")
        if not await self._gpu_process_listed(host, pid, action.subject):
            return f"pid {pid} no longer holds a GPU; nothing signalled"
        await self._signal(host, pid, "TERM", seconds)
        await asyncio.sleep(min(self.timing.stop_grace, 5 * self.timing.poll))
        if not await self._gpu_process_listed(host, pid, action.subject):
            return f"pid {pid} ended on TERM"
        await self._signal(host, pid, "KILL", seconds)
        return f"pid {pid} signalled"

    async def _gpu_process_listed(self, host: HostSpec, pid: int, name: str) -> bool:
        out = await self._sh(host, catalogue.reads.gpu_apps(self.cluster.ssh.command_timeout))
        return any(
            p.pid == pid and (not name or p.name == name) for p in parsers.parse_compute_apps(out)
        )

    async def _power_cycle(self, host: HostSpec, action: Action) -> str:
        """The operator's power command for the host, on this box: the host answers nothing."""
        if self.fence is not None and self.fence.token() is None:
            # The PDU has no fence of its own: only the owner may cut a host's power.
            raise HostRefused("not owner", host.name, "this instance no longer owns the cluster")
        argv = power_argv(self.cluster.power, host.name)
        said = await run_power(argv, self.cluster.power.timeout)
        return f"{argv[0]} done for {host.name}: {said}"

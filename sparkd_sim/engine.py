"""The container engine of one simulated host: container lifecycle, PIDs, restart policies, events.

What a container's main command does (Ray, an idle GLM server) is decided by the world through
`MainRunner`; this module only keeps docker's bookkeeping straight.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sparkd_sim.state import Container, GpuProcess, HostState, SimProcess
from sparkd_sim.timing import Timing

log = logging.getLogger(__name__)

MainRunner = Callable[["HostEngine", Container], Awaitable[int]]
ExitHook = Callable[["HostEngine", Container], None]

# Images in this world are NVIDIA-based: docker shows the entrypoint in front of the command.
ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"


def normalize_image(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    return image if ":" in last or "@" in last else image + ":latest"


def graphics_processes() -> list[GpuProcess]:
    return [
        GpuProcess(pid=2558, name="/usr/lib/xorg/Xorg", used_mib=18, graphics=True),
        GpuProcess(pid=2702, name="/usr/bin/gnome-shell", used_mib=6, graphics=True),
    ]


class HostEngine:
    def __init__(
        self,
        state: HostState,
        main_runner: MainRunner,
        on_exit: ExitHook,
        timing: Timing | None = None,
    ) -> None:
        self.state = state
        self.timing = timing or Timing.fast()
        self._main_runner = main_runner
        self._on_exit = on_exit
        self._pids = itertools.count(3100)
        self._subscribers: list[asyncio.Queue[dict[str, Any]]] = []

    # -- PIDs and events ---------------------------------------------------------------------

    def new_pid(self) -> int:
        return next(self._pids)

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._subscribers.append(queue)
        return queue

    @property
    def subscribed(self) -> int:
        """How many `docker events` streams are open. One started over SSH is here only once
        its shell and client have run: a reader waits for it before making the event."""
        return len(self._subscribers)

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        with contextlib.suppress(ValueError):
            self._subscribers.remove(queue)

    def emit(self, action: str, container: Container, **extra: str) -> None:
        now = time.time()
        attributes = {**container.labels, "image": container.image, "name": container.name}
        attributes.update(extra)
        event: dict[str, Any] = {
            "status": action,
            "id": container.id,
            "from": container.image,
            "Type": "container",
            "Action": action,
            "Actor": {"ID": container.id, "Attributes": attributes},
            "scope": "local",
            "time": int(now),
            "timeNano": int(now * 1e9),
        }
        for queue in self._subscribers:
            queue.put_nowait(event)

    # -- lifecycle ---------------------------------------------------------------------------

    def add_process(
        self, container: Container, args: str, user: str = "root", cores: float = 0.0
    ) -> SimProcess:
        ppid = container.processes[0].pid if container.processes else 1
        proc = SimProcess(
            pid=self.new_pid(),
            args=args,
            user=user,
            ppid=ppid,
            cores=cores,
            cpu_scale=self.timing.cpu_scale,
        )
        container.processes.append(proc)
        return proc

    def start(self, container: Container) -> None:
        self._cancel_restart(container)
        container.status = "running"
        container.exit_code = 0
        container.oom_killed = False
        container.started_wall = time.time()
        container.stopped_by_user = False
        container.processes = []
        self.add_process(container, " ".join(container.command), cores=0.01)
        container.main_task = asyncio.ensure_future(self._run_main(container))
        self.emit("start", container)

    async def _run_main(self, container: Container) -> None:
        try:
            rc = await self._main_runner(self, container)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("main command of %s failed", container.name)
            rc = 1
        container.main_task = None
        self.stop_container(container, rc, by_user=False)

    def stop_container(
        self, container: Container, exit_code: int, *, by_user: bool, oom: bool = False
    ) -> None:
        """The container's main process ended (on its own, by a signal, or with the host).

        A user's stop/kill/rm ends a pending restart too; the process ending on its own under a
        restart policy leaves the container `restarting` until docker's backoff delay is over."""
        if container.restarting and by_user:
            self._cancel_restart(container)
            container.status = "exited"
            container.stopped_by_user = True
            self.emit("stop", container)
            return
        if not container.running:
            return
        restarts = not by_user and self._restarts_on_its_own(container, exit_code)
        container.status = "restarting" if restarts else "exited"
        container.exit_code = exit_code
        container.oom_killed = oom
        container.finished_wall = time.time()
        container.stopped_by_user = by_user
        task, container.main_task = container.main_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self._kill_real_processes(container)
        container.processes = []
        self.state.gpu_processes = [
            g for g in self.state.gpu_processes if g.container_id != container.id
        ]
        self._on_exit(self, container)
        if oom:
            self.emit("oom", container)
        if by_user:
            self.emit("kill", container, signal="15" if exit_code == 143 else "9")
        ran = max(0, int(container.finished_wall - container.started_wall))
        # (Docker 20.10's `die` carries no `execDuration`: later engines add it.)
        self.emit("die", container, exitCode=str(exit_code))
        if by_user and exit_code == 143:
            # Only `docker stop` (SIGTERM first) says `stop`; `kill` and `rm -f` end at `die`.
            self.emit("stop", container)
        if restarts:
            # Docker's restart manager: 100 ms, doubled after each quick exit, at most a
            # minute, back to 100 ms once the container ran for 10 s.
            t = self.timing
            if ran >= t.restart_reset or container.restart_delay == 0:
                container.restart_delay = t.restart_backoff
            else:
                container.restart_delay = min(container.restart_delay * 2, t.restart_backoff_max)
            container.restart_count += 1
            container.restart_task = asyncio.ensure_future(self._restart_later(container))

    @staticmethod
    def _restarts_on_its_own(container: Container, exit_code: int) -> bool:
        if container.restart in ("always", "unless-stopped"):
            return True
        return container.restart == "on-failure" and exit_code != 0

    async def _restart_later(self, container: Container) -> None:
        await asyncio.sleep(container.restart_delay)
        container.restart_task = None
        if container.id in self.state.containers and container.restarting:
            self.start(container)

    @staticmethod
    def _cancel_restart(container: Container) -> None:
        task, container.restart_task = container.restart_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def remove(self, container: Container) -> None:
        if container.restarting:
            self._cancel_restart(container)
            container.status = "exited"
        self.stop_container(container, 137, by_user=True)
        self.state.containers.pop(container.id, None)
        self.emit("destroy", container)

    def _kill_real_processes(self, container: Container) -> None:
        """Processes run through `docker exec` die with their container.

        Only PIDs this world recorded are signalled, and only if /proc still says they belong
        to this container (a PID may have been reused since)."""
        marker = f"SPARKD_SIM_CONTAINER={container.id}".encode()
        for pid in container.real_pids:
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    if marker not in fh.read().split(b"\0"):
                        continue
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        container.real_pids.clear()

    def shutdown(self) -> None:
        """Everything dies at once (host reboot or world stop); restart policies do not fire."""
        for container in list(self.state.containers.values()):
            if container.restarting:
                self._cancel_restart(container)
                container.status = "exited"
            if container.running:
                main, container.main_task = container.main_task, None
                if main is not None:
                    main.cancel()
                container.status = "exited"
                container.exit_code = 255
                container.finished_wall = time.time()
                self._kill_real_processes(container)
                container.processes = []
                self._on_exit(self, container)
                self.emit("die", container, exitCode="255")
        self.state.gpu_processes = []

    def boot(self) -> None:
        """Containers docker starts with the daemon: `always`, `unless-stopped` if not stopped."""
        self.state.gpu_processes = graphics_processes()
        for container in list(self.state.containers.values()):
            wanted = container.restart == "always" or (
                container.restart == "unless-stopped" and not container.stopped_by_user
            )
            if wanted and not container.up:
                container.restart_delay = 0.0
                self.start(container)

"""Real Ray inside the simulated containers (`World(ray="real")`), for the tier that checks sparkd
against what Ray 2.60 itself prints and does rather than against `RayWorld`'s model of it.

A Ray container's main command runs as PID 1 of a PID and mount namespace of its own (as in a
container), with a private /tmp/ray (Ray's session, where its CLI finds the cluster) and /dev/shm:
nothing it writes there outlives it, and killing that PID 1 ends everything in it. `docker exec
HEAD ray ...` runs the real CLI in the head's namespaces. Every node shares the machine's
network, so every port a node listens on is chosen free here (the GCS port by the world, in its
config), never Ray's fixed defaults: two worlds on one machine must not collide.

Needs root (namespaces, nsenter), util-linux's `unshare`/`nsenter`, and `ray` importable by the
interpreter running the world (the `realray` extra). Nothing here imports ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparkd_sim.engine import HostEngine
from sparkd_sim.protocol import Done
from sparkd_sim.serve_hooks import Held
from sparkd_sim.state import Container
from sparkd_sim.vllm_logs import placement_timeout

# Small: the object store only holds what the placement helper's driver puts there (nothing).
OBJECT_STORE_BYTES = 100_000_000
# What each namespace's private tmpfs may take (Ray's session logs, the object store's files).
TMP_SIZE = "512m"
SHM_SIZE = "256m"
# vLLM waits for its placement group far longer (1800 s); a short wait keeps a failing launch
# from holding the tier up, and sparkd judges a launch by its outcome, not by this delay.
PLACEMENT_TIMEOUT = 30.0
# How the helper marks a line vLLM logs as a warning while it goes on waiting.
WARNING = "warning: "
# The helper's line for a group not ready in time: the placement specs follow, as JSON.
TIMEOUT = "timeout "
HELPER = Path(__file__).with_name("bin") / "ray-placement"
# Each namespace mounts its own tmpfs here, so nothing in it is shared or left behind. Only Ray's
# own directory: the checkout and its venv may well live under /tmp (CI clones there).
PRIVATE_TMP = "/tmp/ray"  # noqa: S108
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Inside the namespace: private mounts first, then the container's command becomes PID 1.
_NAMESPACE_INIT = (
    "mkdir -p /tmp/ray && mount -t tmpfs -o size=$SPARKD_RAY_TMP tmpfs /tmp/ray && "
    "mount -t tmpfs -o size=$SPARKD_RAY_SHM tmpfs /dev/shm && "
    'cd / && exec "$@"'
)


def unavailable() -> str | None:
    """Why real Ray cannot run here, or None."""
    if importlib.util.find_spec("ray") is None:
        return "ray is not importable (install the `realray` extra: pip install -e '.[realray]')"
    if os.geteuid() != 0:
        return "real Ray namespaces need root (unshare --pid --mount, nsenter)"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is not installed"
    if _under_tmp(Path(sys.executable)) or _under_tmp(HELPER):
        return "the Ray interpreter must not live under /tmp/ray: each node gets a private one"
    return None


def _under_tmp(path: Path) -> bool:
    return path.resolve().is_relative_to(PRIVATE_TMP)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _kill_tree(pid: int) -> None:
    """`nsenter -p` forks the command into the namespace: its child must die with it."""
    for child in _children(pid):
        _kill_tree(child)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the world's process dies, however it dies; with
    `unshare --kill-child` that takes the namespace down too."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _namespace_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _hold_namespace(pid: int) -> tuple[str, int] | None:
    """The name of the PID namespace of `pid` and an open handle on it: an open
    /proc/PID/ns file keeps its namespace, and so its number, after its last process
    (namespaces(7), "The /proc/pid/ns/ directory")."""
    try:
        handle = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    return os.readlink(f"/proc/self/fd/{handle}"), handle


def _members_of(spaces: set[str]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _namespace_of(int(entry)) in spaces:
            found.append(int(entry))
    return found


async def _emptied(spaces: set[str], within: float = 10.0) -> None:
    """Until no process is left in `spaces`. The kernel kills every member with the
    namespace's PID 1, but a process that `nsenter` forked in is the child of one outside: it
    stays listed until that parent (or, once it is gone, the host's init) has reaped it."""
    deadline = time.monotonic() + within
    while members := _members_of(spaces):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {members} outlived their Ray namespace")
        await asyncio.sleep(0.01)


@dataclass
class Namespace:
    """One container's Ray: `unshare` (ours) and the namespace's PID 1 (its child)."""

    container_id: str
    process: asyncio.subprocess.Process
    init: int
    # Signals go through a pidfd: once PID 1 is reaped its number may belong to anyone.
    pidfd: int
    frozen: bool = False

    def members(self) -> list[int]:
        """Every process in the namespace, PID 1 first."""
        ns = _namespace_of(self.init)
        if ns is None:
            return []
        return [self.init, *(pid for pid in _members_of({ns}) if pid != self.init)]

    def kill(self) -> None:
        # The kernel ends every other process of a PID namespace with its PID 1.
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)


@dataclass
class RealRay:
    """The real-Ray namespaces of one world."""

    # (host address or override) -> (engine, container) of the Ray container registered there.
    locate: Callable[[str], tuple[HostEngine, Container] | None]
    gcs_port: int = field(default_factory=free_port)
    # The dashboard's port the config gives sparkd (Ray's 8265 could collide between worlds).
    dashboard_port: int = field(default_factory=free_port)
    # Every port given to a node and every PID namespace made, so a test can check that nothing
    # listens or runs there any more.
    ports: set[int] = field(default_factory=set)
    # A namespace's name (as /proc/PID/ns/pid gives it) -> an open handle on it, until close().
    # The kernel gives a freed namespace's number to the next namespace made on the machine:
    # only a held name is ours alone, and a look by name finds no stranger's processes.
    pid_namespaces: dict[str, int] = field(default_factory=dict)
    namespaces: dict[str, Namespace] = field(default_factory=dict)
    # Every `unshare` until it has exited: it exits only once its namespace is gone (the
    # kernel reaps every process of a PID namespace before its PID 1 becomes a zombie).
    _unshares: set[asyncio.subprocess.Process] = field(default_factory=set)
    # Every `nsenter` (the CLI, the placement helper) until it has exited.
    _processes: set[asyncio.subprocess.Process] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ports.update((self.gcs_port, self.dashboard_port))

    def _port(self) -> int:
        port = free_port()
        self.ports.add(port)
        return port

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        return {
            **extra,
            "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": PRIVATE_TMP,
            "LANG": "C.UTF-8",
            # Ray reports usage to a public server unless told not to; nothing may leave loopback.
            "RAY_USAGE_STATS_ENABLED": "0",
        }

    def start_args(self, args: list[str], node_ip: str | None) -> list[str]:
        """The container's `ray start` arguments, plus what the real command gets from its
        machine (`--gpus all`: one GPU per Spark) and free ports for everything Ray would
        otherwise bind at a fixed default."""
        out = []
        ips = [a.partition("=")[2] for a in args if a.startswith("--node-ip-address=")]
        address = ips[0] if ips else ""
        for arg in args:
            if node_ip is not None and arg.startswith("--node-ip-address="):
                arg = f"--node-ip-address={node_ip}"
            if arg == "--dashboard-host=127.0.0.1" and address:
                # A container's loopback is its host's: here every host shares the machine's,
                # and each host's own address stands for it.
                arg = f"--dashboard-host={address}"
            out.append(arg)
        out += [
            "--num-gpus=1",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={self._port()}",
            # 0 and 0: workers bind ports the kernel picks instead of 10002-19999.
            "--min-worker-port=0",
            "--max-worker-port=0",
        ]
        if "--head" in args:
            if not any(a.startswith("--dashboard-port=") for a in args):
                out.append(f"--dashboard-port={self._port()}")
            out.append(f"--ray-client-server-port={self._port()}")
        return out

    async def run(
        self, container: Container, args: list[str], node_ip: str | None, env: dict[str, str]
    ) -> int:
        """`ray start ...` as the container's main process; returns its exit status."""
        argv = ["ray", "start", *self.start_args(args, node_ip)]
        process = await asyncio.create_subprocess_exec(
            "unshare", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child",
            "/bin/sh", "-c", _NAMESPACE_INIT, "sh", *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**self._env(env), "SPARKD_RAY_TMP": TMP_SIZE, "SPARKD_RAY_SHM": SHM_SIZE},
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        self._unshares.add(process)
        namespace: Namespace | None = None
        try:
            namespace = await self._namespace(container.id, process)
            assert process.stdout is not None
            async for raw in process.stdout:
                container.log(_ANSI.sub("", raw.decode(errors="replace").rstrip("\n")))
            rc = await process.wait()
            self._unshares.discard(process)
            return 128 - rc if rc < 0 else rc
        finally:
            # Not `unshare` itself: it stays to wait for the namespace's end (see close()).
            if namespace is not None:
                namespace.kill()
                os.close(namespace.pidfd)
                if self.namespaces.get(container.id) is namespace:
                    del self.namespaces[container.id]
            elif process.returncode is None:
                for child in _children(process.pid):
                    _kill_tree(child)

    async def _namespace(self, container_id: str, process: asyncio.subprocess.Process) -> Namespace:
        """The namespace `process` (an `unshare --pid --fork`) made, once its PID 1 is there:
        recorded as the container's, and held (see `pid_namespaces`)."""
        init = await self._init_of(process)
        namespace = Namespace(container_id, process, init, os.pidfd_open(init))
        held = _hold_namespace(init)
        if held is not None:
            name, handle = held
            self.pid_namespaces[name] = handle
        self.namespaces[container_id] = namespace
        return namespace

    @staticmethod
    async def _init_of(process: asyncio.subprocess.Process) -> int:
        while True:
            children = _children(process.pid)
            if children:
                return children[0]
            if process.returncode is not None:
                raise RuntimeError(f"unshare exited with {process.returncode}")
            await asyncio.sleep(0.005)

    def kill(self, container_id: str) -> None:
        """The container died (docker rm -f/stop/kill, a reboot): so does its namespace."""
        namespace = self.namespaces.get(container_id)
        if namespace is not None:
            namespace.kill()

    def freeze(self, container_id: str) -> None:
        self._signal_all(container_id, signal.SIGSTOP, frozen=True)

    def thaw(self, container_id: str) -> None:
        self._signal_all(container_id, signal.SIGCONT, frozen=False)

    def frozen(self, container_id: str) -> bool:
        namespace = self.namespaces.get(container_id)
        return namespace is not None and namespace.frozen

    def _signal_all(self, container_id: str, sig: signal.Signals, *, frozen: bool) -> None:
        namespace = self.namespaces.get(container_id)
        if namespace is None or namespace.frozen == frozen:
            return
        namespace.frozen = frozen
        for pid in namespace.members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _enter(self, container_id: str) -> list[str] | None:
        namespace = self.namespaces.get(container_id)
        if namespace is None:
            return None
        return ["nsenter", "-t", str(namespace.init), "-p", "-m", "--"]

    async def cli(self, container: Container, args: list[str]) -> Done:
        """The real `ray` CLI inside the container's namespaces."""
        enter = self._enter(container.id)
        if enter is None:
            return Done(stderr="bash: ray: command not found\n", rc=127)
        process = await asyncio.create_subprocess_exec(
            *enter, str(Path(sys.executable).with_name("ray")), *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env({}),
        )  # fmt: skip
        self._processes.add(process)
        try:
            out, err = await process.communicate()
        finally:
            self._end(process)
        rc = process.returncode if process.returncode is not None else 1
        return Done(out.decode(errors="replace"), err.decode(errors="replace"), rc)

    def placement(self, head: Container) -> RealPlacement:
        return RealPlacement(self, head)

    def _end(self, process: asyncio.subprocess.Process) -> None:
        # Only while not yet reaped: a reaped PID may already belong to someone else.
        if process.returncode is None:
            _kill_tree(process.pid)
        else:
            self._processes.discard(process)

    async def close(self) -> None:
        """Kill every namespace and helper and wait until they are gone: nothing outlives the
        world."""
        for namespace in list(self.namespaces.values()):
            namespace.kill()
        entered = list(self._processes)
        for process in entered:
            self._end(process)
        unshares = list(self._unshares)
        for process in unshares:
            if process.returncode is None:
                for child in _children(process.pid):
                    _kill_tree(child)
        await asyncio.gather(*(p.wait() for p in entered + unshares), return_exceptions=True)
        try:
            await _emptied(set(self.pid_namespaces))
        finally:
            for handle in self.pid_namespaces.values():
                os.close(handle)
            self.pid_namespaces.clear()
        self.namespaces.clear()
        self._processes.clear()
        self._unshares.clear()


class RealPlacement:
    """vLLM's hold on the cluster's GPUs, for the simulated `vllm serve`: the `ray-placement`
    helper as a Ray driver in the head's namespaces."""

    def __init__(self, ray: RealRay, head: Container) -> None:
        self.ray = ray
        self.head = head
        self.process: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None

    async def acquire(self, gpus: int, say: Callable[[str], None]) -> Held | list[str]:
        enter = self.ray._enter(self.head.id)
        if enter is None:
            return ["RuntimeError: Failed to connect to Ray: no Ray instance is running"]
        self.process = process = await asyncio.create_subprocess_exec(
            *enter, sys.executable, str(HELPER), str(gpus), str(PLACEMENT_TIMEOUT),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=self.ray._env({}),
        )  # fmt: skip
        self.ray._processes.add(process)
        assert process.stdout is not None
        said: list[str] = []
        async for raw in process.stdout:
            line = _ANSI.sub("", raw.decode(errors="replace").rstrip("\n"))
            if line.startswith(WARNING):
                say(line.removeprefix(WARNING))
                continue
            if line.startswith(TIMEOUT):
                said.extend(placement_timeout(json.loads(line.removeprefix(TIMEOUT))))
                continue
            if not line.startswith("placed "):
                said.append(line)
                continue
            nodes = [self.ray.locate(ip) for ip in line.split()[1:]]
            lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._watch = asyncio.ensure_future(self._until_exit(process, lost))
            return Held([n for n in nodes if n is not None], lost)
        await process.wait()
        self.ray._end(process)
        return said or [f"RuntimeError: placement exited with {process.returncode}"]

    async def _until_exit(
        self, process: asyncio.subprocess.Process, lost: asyncio.Future[str]
    ) -> None:
        assert process.stdout is not None
        last = ""
        async for raw in process.stdout:
            line = _ANSI.sub("", raw.decode(errors="replace").rstrip("\n"))
            if line.startswith(("RayActorError", "ValueError")):
                last = line
        await process.wait()
        self.ray._end(process)
        if not lost.done():
            lost.set_result(last or f"Ray driver exited with {process.returncode}")

    def release(self) -> None:
        if self.process is not None:
            self.ray._end(self.process)

"""Where calls go: each fake-tool call to its fake (or real) tool, `vllm serve` to a model server,
`kill` to the process it names, and an SSH channel's port to the server listening for it."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import time
from collections import deque

from sparkd_sim import fake_fabric, fake_ip, fake_kernel, fake_nvidia_smi, fake_system
from sparkd_sim.consequences import Consequences
from sparkd_sim.fake_docker import FakeDocker
from sparkd_sim.hosts import HungCall, SimHost
from sparkd_sim.openssh import OpenSshHost
from sparkd_sim.protocol import Done, Exec, Reply, Stream, ToolCall, fail
from sparkd_sim.serve import ServeProcess
from sparkd_sim.serve_args import parse_serve
from sparkd_sim.serve_hooks import ModelServer
from sparkd_sim.state import Container, HostState, RayCluster
from sparkd_sim.vllm_behaviour import SERVED_KEPT
from sparkd_sim.vllm_server import SimVllmServer
from sparkd_sim.world_state import WorldState

# What the docker CLI prints (rc 1) when dockerd does not listen on its socket.
DOCKER_DOWN = (
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
    "Is the docker daemon running?"
)
# The names a program on a host dials its own loopback by.
LOOPBACK = ("127.0.0.1", "localhost")
# A socket bound and never listening: a connection to its port is refused at once, as to a
# host's port where nothing listens. Kept open for the life of the process, so no one else
# binds the port.
_refusing: socket.socket | None = None


def refusing_port() -> int:
    global _refusing  # one for the process, made on first use
    if _refusing is None:
        _refusing = socket.socket()
        _refusing.bind(("127.0.0.1", 0))
    port: int = _refusing.getsockname()[1]
    return port


class ToolRouting:
    """The fake tools' calls and the SSH channels, routed to what answers them."""

    def __init__(self, state: WorldState, consequences: Consequences) -> None:
        self.state = state
        self.consequences = consequences

    def dashboard_head(self, host: str) -> RayCluster | None:
        """The Ray head on `host` whose dashboard answers now."""
        now = time.monotonic()
        for cluster in self.state.ray.clusters:
            if cluster.head_host == host and cluster.dashboard and cluster.answers(now):
                return cluster
        return None

    def real_port(self, address: str, port: int) -> int | None:
        """Where a channel to `address:port` goes: a model server, or a head's dashboard while
        it answers; None is refused."""
        found = self.state.listening.get((address, port))
        if found is not None or self.state.real_ray is not None:
            real = self.state.real_ray is not None and port == self.state.real_ray.dashboard_port
            return found if found is not None else port if real else None
        for name, server in self.state.dashboards.items():
            head = self.dashboard_head(name) if server.address == address else None
            if head is not None and head.dashboard_port == port:
                return server.port
        return None

    # -- the fake tools --------------------------------------------------------------------------

    async def handle(self, call: ToolCall) -> Reply:
        host = self.state.hosts.get(call.host)
        if host is None:
            return fail(f"{call.tool}: unknown simulated host {call.host!r}", 125)
        if call.tool == "@ssh":
            # From the ForceCommand wrapper of a host behind a real sshd.
            self.state.record(host.name, "ssh", call.args[0] if call.args else "")
            return Done()
        container = host.state.containers.get(call.container) if call.container else None
        self.state.record(
            host.name, "tool", " ".join(call.argv), container.name if container else None,
            _session_of(call.pid),
        )  # fmt: skip
        state = host.state
        tool = call.tool
        if any(tuple(call.argv[: len(prefix)]) == prefix for prefix in host.hung_tools):
            return self._hang(host, call)
        if tool == "ray" and container is not None and self.consequences.frozen(container.id):
            # Its processes are stopped: the CLI waits on them for ever.
            return self._hang(host, call)
        if tool == "docker":
            if container is not None:
                return fail("bash: docker: command not found", 127)
            if host.docker_down:
                return fail(DOCKER_DOWN, 1)
            return await FakeDocker(host.engine, lambda c: self.state.session_env(host.name, c))(
                call
            )
        if tool == "ray":
            if self.state.real_ray is not None and container is not None:
                return await self.state.real_ray.cli(container, call.args)
            return self.state.ray.cli(container, call.args)
        if tool == "vllm":
            return self._vllm(host, container, call)
        if tool == "python3":
            return self._loopback_program(host, call)
        if tool == "systemctl":
            return fake_system.systemctl(state, call.args)
        if tool == "nvidia-smi":
            return fake_nvidia_smi.nvidia_smi(state, call.args)
        if tool == "ip":
            return fake_ip.ip(state, call.args)
        if tool == "df":
            return fake_system.df(state, call.args)
        if tool == "kill":
            return fake_system.kill(state, call.args, self._deliver_signal)
        if tool == "cat" and call.args == [fake_kernel.MEMINFO_PATH]:
            return Done(stdout=fake_kernel.meminfo(state))
        if tool == "cat":
            return fake_system.cat_boot_id(state, call.args)
        if tool == "journalctl":
            return fake_kernel.journalctl(state, call.args)
        if tool == "grep":
            return fake_fabric.grep(state.interface, state.data_ip, state.link, call.args)
        if tool == "ping":
            return self._ping(host, call.args)
        return fail(f"bash: {tool}: command not found", 127)

    def _ping(self, host: SimHost, args: list[str]) -> Reply:
        """iputils `ping -c 1 ... IP` over the data link: a reply when both ends' data links
        are up and the target's kernel answers (not wedged, not rebooting; a host only the ops
        box lost, or whose sshd refuses, still answers). iputils ping(8): exit 0 on a reply, 1
        when none came. The wait for a missing reply (`-W`) is not spent: only the exit counts."""
        target = args[-1] if args else ""
        peer = next((h for h in self.state.hosts.values() if h.state.data_ip == target), None)
        answers = (
            peer is not None
            and host.state.link.up
            and peer.state.link.up
            and peer.reachability in ("ok", "unreachable", "path_lost")
        )
        got = 1 if answers else 0
        lines = [
            f"PING {target} ({target}) 56(84) bytes of data.",
            "",
            f"--- {target} ping statistics ---",
            f"1 packets transmitted, {got} received, {100 - 100 * got}% packet loss, time 0ms",
        ]
        if answers:
            lines.append("rtt min/avg/max/mdev = 0.210/0.210/0.210/0.000 ms")
        return Done(stdout="\n".join(lines) + "\n", rc=0 if answers else 1)

    def _loopback_program(self, host: SimHost, call: ToolCall) -> Reply:
        """A Python program that dials the host's own loopback, given the address and port as
        its first arguments (`python3 -I -S -c PROGRAM 127.0.0.1 PORT ...`: bin/sim-tool sends
        no other python3 call here). The real program runs on this machine, the address and
        port put where the simulated host's port really listens (as its SSH channels are
        routed: a Ray head's dashboard while it answers), else at a port that refuses; stdin,
        output and exit status are its own."""
        args = call.args
        at = args.index("-c") if "-c" in args else len(args)
        options, rest = args[:at], args[at + 2 :]
        if at + 1 >= len(args) or not all(o.startswith("-") for o in options):
            return fail("python3: not a program given with -c", 2)
        if len(rest) < 2 or rest[0] not in LOOPBACK or not rest[1].isdigit():
            return fail("python3: not a loopback address and port after the program", 2)
        python = shutil.which("python3", path="/usr/bin:/bin")
        if python is None:
            return fail("bash: python3: command not found", 127)
        real = self.real_port(host.ssh.address, int(rest[1]))
        address, port = host.ssh.address, real
        if real is None:
            address, port = "127.0.0.1", refusing_port()
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        argv = [python, *args[: at + 2], address, str(port), *rest[2:]]
        return Exec(env=env, argv=argv, detach=False)

    def _hang(self, host: SimHost, call: ToolCall) -> Stream:
        """Answer nothing, ever: the call ends only when its caller goes away."""
        hung = HungCall(host.name, call.argv)
        self.state.hung_calls.append(hung)
        stream = Stream()

        def released() -> None:
            hung.released = True

        stream.on_disconnect = released
        return stream

    def _vllm(self, host: SimHost, container: Container | None, call: ToolCall) -> Reply:
        if container is None:
            return fail("bash: vllm: command not found", 127)
        if not call.args or call.args[0] != "serve":
            return fail(
                "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch}"
                f"\nvllm: error: argument subparser: invalid choice: "
                f"'{call.args[0] if call.args else ''}'",
                2,
            )
        args = parse_serve(call.args[1:], call.api_key)
        if isinstance(args, Done):
            return args

        def make_server(
            model: str, address: str, port: int, key: str | None, max_len: int
        ) -> ModelServer:
            served = self.state.served.setdefault(host.name, deque(maxlen=SERVED_KEPT))
            server = SimVllmServer(
                model,
                host.behaviour,
                host=address,
                # A real sshd dials the model port it is asked for, so there the model listens
                # on it; elsewhere on an ephemeral one, so worlds never collide.
                port=port if self.state.ssh_server == "openssh" else 0,
                api_key=key,
                max_model_len=max_len,
                served=served,
                log_stats=not args.disable_log_stats,
            )
            return _MappedServer(server, address, port, self.state.listening)

        serve = ServeProcess(
            host.engine,
            container,
            args,
            self.state.ray.cluster_of(container.id),
            {h.name: h.engine for h in self.state.hosts.values()},
            self.state.timing,
            host.faults,
            make_server,
            self.state.real_ray.placement(container) if self.state.real_ray is not None else None,
        )
        self.state.serves.append(serve)
        serve.stream.exit_code.add_done_callback(lambda _: self._forget(serve))
        if self.state.real_ray is not None:
            # No `_node_lost` from real Ray: the engine a frozen node hung ends with its serve.
            serve.stream.exit_code.add_done_callback(
                lambda _: self.consequences.unhang_engine(serve)
            )
        return serve.stream

    def _forget(self, serve: ServeProcess) -> None:
        with contextlib.suppress(ValueError):
            self.state.serves.remove(serve)
        self.consequences.serve_gone(serve)

    def _deliver_signal(self, state: HostState, pid: int, sig: int) -> bool:
        host = self.state.hosts[state.name]
        for serve in self.state.serves:
            if serve.engine is host.engine and serve.pid == pid:
                if sig:
                    serve.kill_api_server() if sig == 9 else serve.terminate()
                return True
            for engine, _, proc, _ in serve.workers:
                if engine is host.engine and proc.pid == pid:
                    if sig:
                        serve.crash(f"RayWorkerProc pid={pid} killed by signal {sig}")
                    return True
        for container in state.containers.values():
            for index, proc in enumerate(container.processes):
                if proc.pid == pid:
                    if sig in (19, 20):
                        self.consequences.freeze(container)
                    elif sig == 18:
                        self.consequences.thaw(container)
                    elif sig:
                        # The main process, or a Ray daemon `ray start --block` watches: either
                        # way the container's main command ends.
                        rc = 128 + sig if index == 0 else 1
                        host.engine.stop_container(container, rc, by_user=False)
                    return True
        for gpu in list(state.gpu_processes):
            if gpu.pid == pid and gpu.container_id is None:
                if sig:
                    state.gpu_processes.remove(gpu)
                return True
        return False

    def install_forced_command(self, host: str, program: str) -> None:
        """A forced-command program in front of `host`'s sshd (the OpenSSH server only)."""
        ssh = self.state.host(host).ssh
        if not isinstance(ssh, OpenSshHost):
            raise ValueError("a forced command needs ssh_server='openssh'")
        ssh.install_forced_command(program)


def _session_of(pid: int) -> int | None:
    """The session of a tool's process, which waits for this answer: the SSH command's shell
    (or a detached `docker exec`) leads it. Not its process group: `timeout` makes one of its
    own for what it runs."""
    if pid <= 0:  # getsid(0) would name this process's own session
        return None
    try:
        return os.getsid(pid)
    except OSError:  # gone already (its session was killed)
        return None


class _MappedServer:
    """A model server on an ephemeral port, known to the world by the port vLLM was given."""

    def __init__(
        self,
        server: SimVllmServer,
        address: str,
        port: int,
        table: dict[tuple[str, int], int],
    ) -> None:
        self.server = server
        self.key = (address, port)
        self.table = table

    async def start(self) -> int:
        if self.key in self.table:
            raise OSError(errno.EADDRINUSE, f"[Errno 98] address already in use: {self.key}")
        real = await self.server.start()
        self.table[self.key] = real
        return self.key[1]

    async def stop(self) -> None:
        if self.table.get(self.key) == self.server.port:
            del self.table[self.key]
        await self.server.stop()

    def send_prompt(self, prompt_tokens: int) -> None:
        self.server.send_prompt(prompt_tokens)

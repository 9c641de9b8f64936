"""The simulated world: DGX Spark hosts behind real SSH servers on loopback, whose fake tools all
talk to this one in-process model.

    async with World(directory, scenario="seed-morning", timing=Timing.fast()) as world:
        world.config_path, world.client_key_path, world.known_hosts_path
        await world.fault("reboot", "spark-b")

With `ray="real"` each Ray container runs Ray 2.60 itself (see real_ray.py); with
`docker="real"` each host's `docker` is the real CLI against a real engine of its own (see
real_docker.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import os
import pwd
import secrets
import shlex
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import asyncssh

from sparkd_sim import contract, fake_fabric, fake_kernel, fake_system
from sparkd_sim.checkpoint import shard_name, write_checkpoint
from sparkd_sim.config import render_config
from sparkd_sim.control import ControlServer
from sparkd_sim.engine import HostEngine, graphics_processes, normalize_image
from sparkd_sim.fake_docker import FakeDocker, image_id
from sparkd_sim.openssh import OpenSshHost, find_sshd
from sparkd_sim.owned import OwnedCommand
from sparkd_sim.protocol import Done, Reply, Stream, ToolCall, fail
from sparkd_sim.ray_dashboard import DEFAULT_DASHBOARD, DashboardServer
from sparkd_sim.ray_runtime import RayWorld, StatusLayout
from sparkd_sim.real_docker import RealDocker
from sparkd_sim.real_docker import cli as docker_cli
from sparkd_sim.real_ray import RealRay
from sparkd_sim.reference import GLM_IMAGE, INTERFACE, MODEL_ID, QWEN_IMAGE, STALE_UNITS
from sparkd_sim.serve import ModelServer, ServeFaults, ServeProcess, parse_serve
from sparkd_sim.sshd import SimSshHost
from sparkd_sim.state import (
    Container,
    GpuProcess,
    HostState,
    Mount,
    RayCluster,
    RayNode,
    Unit,
    new_boot_id,
    new_container_id,
)
from sparkd_sim.timing import Timing
from sparkd_sim.toolserver import ToolServer
from sparkd_sim.vllm_logs import crash_loop_log
from sparkd_sim.vllm_server import SERVED_KEPT, FieldNaming, ModelBehaviour, Served, SimVllmServer

TOOLS = (
    "docker", "systemctl", "nvidia-smi", "ray", "vllm", "ip", "df", "kill", "cat", "sudo",
    "journalctl", "grep",
)  # fmt: skip
SCENARIOS = ("seed-morning", "seed-crashloop", "healthy", "empty")
BIN_DIR = Path(__file__).with_name("bin")
_SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
_LOCALHOST = ipaddress.IPv4Address("127.0.0.1")
# `wrong-ip` registers a host this far above its address (127.0.0.2 -> 127.0.100.2).
WRONG_IP_OFFSET = 100 * 256
# With `data_network=True` a host's data IP is this far above its (management) address.
DATA_IP_OFFSET = 50 * 256

# What the docker CLI prints (rc 1) when dockerd does not listen on its socket.
DOCKER_DOWN = (
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
    "Is the docker daemon running?"
)

Reachability = Literal["ok", "unreachable", "blackhole", "down"]
# Which SSH server each host runs: asyncssh's, in this process, or a real OpenSSH sshd each.
SshServer = Literal["asyncssh", "openssh"]
Scenario = Literal["seed-morning", "seed-crashloop", "healthy", "empty"]
# "sim": `RayWorld`'s model of Ray; "real": Ray 2.60 itself in each Ray container (real_ray.py).
RayMode = Literal["sim", "real"]
# "sim": `FakeDocker`; "real": a real dockerd per host, reached by the real CLI (real_docker.py).
DockerMode = Literal["sim", "real"]


@dataclass(frozen=True)
class CommandRecord:
    at: float
    host: str
    source: Literal["ssh", "tool"]
    command: str
    container: str | None = None


@dataclass(frozen=True)
class PowerRecord:
    """A power request the world obeyed (`sparkd sim power`, as a PDU's CLI would take it)."""

    at: float
    host: str
    action: str


@dataclass
class HungCall:
    """A fake-tool call held by the `hang-tool` fault; `released` once its caller went away
    (the tool's process ended: killed by `timeout`, or its session closed)."""

    host: str
    argv: list[str]
    released: bool = False


@dataclass
class SimHost:
    """One simulated Spark: its state, container engine, SSH endpoint and fault switches."""

    state: HostState
    engine: HostEngine
    ssh: SimSshHost
    cluster: str
    behaviour: ModelBehaviour
    faults: ServeFaults
    reachability: Reachability = "ok"
    # Calls whose argv starts with one of these (e.g. ("nvidia-smi",), ("docker", "ps")) hang.
    hung_tools: set[tuple[str, ...]] = field(default_factory=set)
    # dockerd is gone (crashed) while containerd's shims keep the containers running.
    docker_down: bool = False

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def address(self) -> str:
        return self.state.address

    @property
    def port(self) -> int:
        return self.ssh.port


def host_names(count: int) -> list[str]:
    """spark-a ... spark-z, then spark-aa, spark-ab, ..."""
    names = []
    for i in range(count):
        label, n = "", i
        while True:
            label = chr(ord("a") + n % 26) + label
            n = n // 26 - 1
            if n < 0:
                break
        names.append(f"spark-{label}")
    return names


class World:
    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        hosts: int = 2,
        clusters: int = 1,
        scenario: Scenario = "seed-morning",
        timing: Timing | None = None,
        user: str = "aurora",
        cluster_name: str = "sparks",
        ray_status_layout: StatusLayout = "active",
        answer_naming: FieldNaming = "reasoning",
        run_as: str | None = None,
        spec_labels: Callable[[Path], Mapping[str, str]] | None = None,
        first_address: str = "127.0.0.2",
        noisy_load_logs: bool = True,
        data_network: bool = False,
        ssh_server: SshServer = "asyncssh",
        ray: RayMode = "sim",
        docker: DockerMode = "sim",
    ) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
        if hosts < 1 or clusters < 1 or hosts < clusters:
            raise ValueError("need at least one host per cluster")
        if hosts > 250:
            raise ValueError("at most 250 hosts (one loopback address each)")
        if ray == "real" and scenario == "healthy":
            # Its model launch waits on `RayWorld`'s cluster, which real Ray never fills.
            raise ValueError("the healthy scenario needs the simulated Ray")
        if docker == "real" and (scenario != "empty" or ray == "real"):
            # The seeds' containers are the simulator's; a real engine starts empty.
            raise ValueError("a real Docker engine needs the empty scenario and the simulated Ray")
        # Worlds that run at the same time (two test runs on one machine) need address blocks of
        # their own: every world's model listens on port 30000 of its head's address.
        first = ipaddress.IPv4Address(first_address)
        # The last address `wrong-ip` may hand out must be loopback too.
        top = int(first) + hosts - 1 + max(WRONG_IP_OFFSET, DATA_IP_OFFSET)
        if first not in _LOOPBACK or first == _LOCALHOST or top >= int(_LOOPBACK.broadcast_address):
            raise ValueError(f"host addresses from {first_address} must be in 127.0.0.2-127.255.x")
        self.first_address = first
        # Session-visible files (fake tools, per-host homes and log dirs) live in a fresh
        # directory under the system temp dir, which the unprivileged session user can reach even
        # when `directory` sits below a private one.
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="sparkd-sim-"))
        # Checkpoints a fault took a file from (under /models): `heal` makes them whole again.
        self._damaged: set[str] = set()
        self.directory = Path(directory) if directory is not None else self.runtime_dir
        self.host_count = hosts
        self.cluster_count = clusters
        self.scenario: Scenario = scenario
        self.timing = timing or Timing.fast()
        self.user = user
        self.cluster_name = cluster_name
        self.answer_naming: FieldNaming = answer_naming
        # Loads print real vLLM/Ray's harmless error-like lines (see `ServeFaults.noisy_log`).
        self.noisy_load_logs = noisy_load_logs
        # Hosts' data IPs on a network of their own, apart from the management address their
        # default route (and SSH) uses, as on real Sparks.
        self.data_network = data_network
        # Sessions never run as root: a fake-tool PATH mistake must not reach the real system.
        self.run_as = run_as if run_as is not None else ("nobody" if os.geteuid() == 0 else None)
        self.ssh_server: SshServer = ssh_server
        self._sshd: str | None = None
        if ssh_server == "openssh":
            self._sshd = self._check_openssh(data_network)
            # sshd logs sessions in as `user` itself; the world's files must be theirs.
            self.run_as = user
        # The `sparkd.spec` values the `healthy` scenario stamps on what it starts: the caller
        # computes them from the generated config (keys "CLUSTER/head", "CLUSTER/worker",
        # "CLUSTER/model"), so a healthy world shows no drift without the simulator computing the
        # daemon's hashes itself.
        self.spec_labels_from = spec_labels
        self.spec_labels: dict[str, str] = {}
        self.hosts: dict[str, SimHost] = {}
        self.ray = RayWorld(self.timing, self._node_lost)
        self.ray.layout = ray_status_layout
        self.real_ray = RealRay(self._ray_container_at) if ray == "real" else None
        self.real_docker = (
            RealDocker(self.runtime_dir / "docker", self._session_gid())
            if docker == "real"
            else None
        )
        self.serves: list[ServeProcess] = []
        self.command_log: list[CommandRecord] = []
        self.power_log: list[PowerRecord] = []
        self.hung_calls: list[HungCall] = []
        # Per host, the latest requests its model servers answered, with their own times.
        self.served: dict[str, deque[Served]] = {}
        # (host address, simulated port) -> the real port its model server listens on.
        self.listening: dict[tuple[str, int], int] = {}
        # Each host's Ray dashboard (simulated Ray; real Ray serves its own).
        self._dashboards: dict[str, DashboardServer] = {}
        self._tool_server = ToolServer(self.handle)
        self._client_key = asyncssh.generate_private_key("ssh-ed25519")
        self._background: set[asyncio.Future[None]] = set()
        self._launches: list[asyncio.Future[None]] = []
        self._control = ControlServer(self)
        # Head hosts whose model engine hangs because a Ray node it uses is frozen.
        self._engines_hung_by_ray: set[str] = set()
        # Head hosts whose model engine hangs in NCCL over a broken link: until it exits.
        self._engines_hung_by_link: set[str] = set()
        self.started = False

    # -- paths -----------------------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        return self.runtime_dir / "bin"

    @property
    def models_dir(self) -> Path:
        """Bind-mounted at /models in the Ray containers (`ray.mounts`): the checkpoints."""
        return self.runtime_dir / "models"

    def model_dir(self, model: str) -> Path:
        """Where the model at container path `model` (under /models) is on the hosts."""
        rest = Path(model).relative_to("/models")
        return self.models_dir / rest

    def add_checkpoint(self, model: str) -> Path:
        """A whole checkpoint for `model` (a container path under /models), as a download
        leaves it; made anew if it was there."""
        directory = self.model_dir(model)
        write_checkpoint(directory)
        return directory

    @property
    def client_key_path(self) -> Path:
        return self.directory / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.directory / "known_hosts"

    @property
    def config_path(self) -> Path:
        return self.directory / contract.CONFIG_NAME

    @property
    def control_path(self) -> Path:
        return self.directory / "control.sock"

    @property
    def ray_port(self) -> int:
        """The GCS port the config gives sparkd: free on this machine when Ray is real (real
        GCS servers listen on every address)."""
        return self.real_ray.gcs_port if self.real_ray is not None else 6379

    @property
    def dashboard_port(self) -> int:
        """The dashboard port the config gives sparkd: free on this machine when Ray is real."""
        return self.real_ray.dashboard_port if self.real_ray is not None else DEFAULT_DASHBOARD

    def _dashboard_head(self, host: str) -> RayCluster | None:
        """The Ray head on `host` whose dashboard answers now."""
        now = time.monotonic()
        for cluster in self.ray.clusters:
            if cluster.head_host == host and cluster.dashboard and cluster.answers(now):
                return cluster
        return None

    def _real_port(self, address: str, port: int) -> int | None:
        """Where a channel to `address:port` goes: a model server, or a head's dashboard while
        it answers; None is refused."""
        found = self.listening.get((address, port))
        if found is not None or self.real_ray is not None:
            real = self.real_ray is not None and port == self.real_ray.dashboard_port
            return found if found is not None else port if real else None
        for name, server in self._dashboards.items():
            head = self._dashboard_head(name) if server.address == address else None
            if head is not None and head.dashboard_port == port:
                return server.port
        return None

    def host(self, name: str) -> SimHost:
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r}; hosts: {', '.join(self.hosts)}") from None

    def commands(self, host: str | None = None) -> list[CommandRecord]:
        return [r for r in self.command_log if host is None or r.host == host]

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> World:
        try:
            await self.start()
        except BaseException:
            # Hosts that did start (a real sshd each, in openssh mode) must not outlive this.
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._prepare_directory()
        self.add_checkpoint(MODEL_ID)
        await self._tool_server.start()
        names = host_names(self.host_count)
        per_cluster = -(-self.host_count // self.cluster_count)
        for index, name in enumerate(names):
            cluster_index = index // per_cluster
            first_of_cluster = index % per_cluster == 0
            self.hosts[name] = self._make_host(name, index, cluster_index, first_of_cluster)
        if self.real_docker is not None:
            await self.real_docker.start(names)
        self._apply_scenario()
        if self.real_ray is None:
            for name, host in self.hosts.items():
                # A real sshd dials the port itself; the simulated one asks `_real_port`.
                fixed = DEFAULT_DASHBOARD if self.ssh_server == "openssh" else 0
                find = functools.partial(self._dashboard_head, name)
                stalled = functools.partial(lambda h: ("ray",) in h.hung_tools, host)
                server = DashboardServer(host.address, fixed, find, self.timing, stalled)
                await server.start()
                self._dashboards[name] = server
        ports = await asyncio.gather(*(h.ssh.listen() for h in self.hosts.values()))
        del ports
        self._write_client_files()
        await self._control.start(self.control_path)
        self.started = True
        if self.spec_labels_from is not None:
            self.spec_labels = dict(self.spec_labels_from(self.config_path))
        if self.scenario == "healthy":
            await self._bring_up_healthy()

    async def stop(self) -> None:
        await self._control.stop()
        self.ray.close()
        for server in self._dashboards.values():
            await server.stop()
        self._dashboards.clear()
        serves = list(self.serves)
        for serve in serves:
            serve.kill_hard()
        await asyncio.gather(*(s.wait_stopped() for s in serves), return_exceptions=True)
        for host in self.hosts.values():
            host.engine.shutdown()
            await host.ssh.shutdown()
        if self.real_ray is not None:
            await self.real_ray.close()
        if self.real_docker is not None:
            await self.real_docker.close()
        for task in list(self._background):
            task.cancel()
        await self._tool_server.stop()
        await asyncio.sleep(0)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        self.started = False

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _prepare_directory(self) -> None:
        self.runtime_dir.chmod(0o755)
        self.bin_dir.mkdir(exist_ok=True)
        client = self.bin_dir / "sim-tool"
        shutil.copyfile(BIN_DIR / "sim-tool", client)
        client.chmod(0o755)
        shutil.copyfile(BIN_DIR / "session-init.bash", self.bin_dir / "session-init.bash")
        (self.bin_dir / "session-init.bash").chmod(0o644)
        for tool in TOOLS:
            link = self.bin_dir / tool
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to("sim-tool")
        real_cli = docker_cli() if self.real_docker is not None else None
        if real_cli is not None:
            (self.bin_dir / "docker").unlink()
            (self.bin_dir / "docker").symlink_to(Path(real_cli).resolve())
        _check_reachable(self.bin_dir, self.run_as)

    def _make_host(self, name: str, index: int, cluster_index: int, head: bool) -> SimHost:
        address = str(self.first_address + index)
        host_dir = self.runtime_dir / "hosts" / name
        log_dir = host_dir / "serve"
        home = host_dir / "home"
        for d in (log_dir, home):
            d.mkdir(parents=True, exist_ok=True)
            self._give_to_session_user(d)
        state = HostState(
            name=name,
            address=address,
            role="head" if head else "worker",
            data_ip=(
                str(ipaddress.IPv4Address(address) + DATA_IP_OFFSET)
                if self.data_network
                else address
            ),
            interface=INTERFACE,
            log_dir=str(log_dir),
            home=str(home),
        )
        fake_kernel.boot(state)
        engine = HostEngine(state, self._run_main, self._container_exited, self.timing)
        ssh_class: Callable[..., SimSshHost] = SimSshHost
        if self._sshd is not None:
            ssh_class = functools.partial(OpenSshHost, sshd=self._sshd, directory=host_dir / "sshd")
        ssh = ssh_class(
            address=address,
            host_key=asyncssh.generate_private_key("ssh-ed25519"),
            client_key=self._client_key,
            user=self.user,
            session_env=lambda: self.session_env(name),
            cwd=str(home),
            record=lambda command: self._record(name, "ssh", command),
            other_addresses=lambda: {h.address for h in self.hosts.values()},
            run_as=self.run_as,
            real_port=self._real_port,
            aliases=lambda: {
                h.state.data_ip: h.address
                for h in self.hosts.values()
                if h.state.data_ip != h.address
            },
        )
        return SimHost(
            state=state,
            engine=engine,
            ssh=ssh,
            cluster=self._cluster_label(cluster_index),
            behaviour=ModelBehaviour(naming=self.answer_naming),
            faults=ServeFaults(noisy_log=self.noisy_load_logs),
        )

    def _check_openssh(self, data_network: bool) -> str:
        sshd = find_sshd()
        if sshd is None:
            raise RuntimeError("no sshd on this machine (apt-get install openssh-server)")
        if os.geteuid() != 0:
            raise RuntimeError("a real sshd needs root (privilege separation)")
        try:
            entry = pwd.getpwnam(self.user)
        except KeyError:
            raise RuntimeError(
                f"no account {self.user!r} for sshd to log sessions in as "
                "(sparkd_sim.openssh.ensure_login_user creates one)"
            ) from None
        if entry.pw_uid == 0:
            raise RuntimeError("sessions must not run as root: the fake tools would not be alone")
        if data_network:
            # sshd dials the model channel's address itself; the model listens on the host's
            # management address only.
            raise ValueError("data_network is not supported with ssh_server='openssh'")
        # Debian's sshd refuses to start without its privilege-separation directory.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        return sshd

    def _cluster_label(self, index: int) -> str:
        return self.cluster_name if index == 0 else f"{self.cluster_name}-{index + 1}"

    def _session_gid(self) -> int:
        return pwd.getpwnam(self.run_as).pw_gid if self.run_as is not None else os.getgid()

    def _give_to_session_user(self, path: Path) -> None:
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        path.chmod(0o755)

    # -- environments ----------------------------------------------------------------------------

    def session_env(self, host: str, container: Container | None = None) -> dict[str, str]:
        state = self.host(host).state
        env = {
            "PATH": f"{self.bin_dir}:{_SYSTEM_PATH}",
            "HOME": state.home,
            "USER": self.user,
            "LOGNAME": self.user,
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "BASH_ENV": str(self.bin_dir / "session-init.bash"),
            "SPARKD_SIM_PORT": str(self._tool_server.port),
            "SPARKD_SIM_HOST": host,
        }
        if self.real_docker is not None and host in self.real_docker.daemons:
            env["DOCKER_HOST"] = self.real_docker.url(host)
        if container is not None:
            env = {**container.env, **env, "HOSTNAME": state.name}
            env["SPARKD_SIM_CONTAINER"] = container.id
        return env

    def _record(
        self, host: str, source: Literal["ssh", "tool"], command: str, container: str | None = None
    ) -> None:
        self.command_log.append(CommandRecord(time.time(), host, source, command, container))

    # -- scenarios -------------------------------------------------------------------------------

    def _apply_scenario(self) -> None:
        for host in self.hosts.values():
            state = host.state
            state.gpu_processes = graphics_processes()
            if self.scenario == "empty":
                continue
            state.images = {normalize_image(QWEN_IMAGE), normalize_image(GLM_IMAGE)}
            if self.scenario not in ("seed-morning", "seed-crashloop"):
                continue
            if state.role == "head":
                for unit in STALE_UNITS:
                    state.units[unit] = Unit(unit, enabled=True, active=True)
            glm = Container(
                id=new_container_id(),
                name="glm-flash",
                image=GLM_IMAGE,
                command=["bash", "-c", "vllm serve /models/GLM-4.7-Flash --port 30000"],
                labels={"com.docker.compose.project": "glm"},
                env={},
                mounts=[Mount("/models", "/models")],
                restart="always",
                created_wall=time.time() - 9 * 86400,
                # `seed-crashloop`: since the reboot its server dies at start-up, and docker
                # keeps restarting it with a growing backoff.
                crash_loop=self.scenario == "seed-crashloop",
                image_id=image_id(state, GLM_IMAGE),
            )
            state.containers[glm.id] = glm
            host.engine.start(glm)
            # It came back with the reboot a couple of minutes ago ("Up 2 minutes").
            state.booted_wall = time.time() - 150
            glm.started_wall = time.time() - 120

    async def _bring_up_healthy(self) -> None:
        """What sparkd converges to: Ray on every host of each cluster, the model serving."""
        for cluster in sorted({h.cluster for h in self.hosts.values()}):
            members = [h for h in self.hosts.values() if h.cluster == cluster]
            head = members[0]
            labels = {contract.LABEL_CLUSTER: cluster}
            env = {
                "NCCL_SOCKET_IFNAME": INTERFACE,
                "GLOO_SOCKET_IFNAME": INTERFACE,
                "RAY_memory_monitor_refresh_ms": "0",
            }
            head_ip = head.state.data_ip
            head_start = ["ray", "start", "--block", "--head", f"--node-ip-address={head_ip}"]
            self._create(
                head,
                contract.container_name(cluster, "head"),
                {
                    **labels,
                    contract.LABEL_ROLE: "head",
                    contract.LABEL_SPEC: self._spec(cluster, "head", head.name),
                },
                {**env, "VLLM_HOST_IP": head_ip},
                [*head_start, "--port=6379", "--dashboard-host=0.0.0.0"],
            )
            for worker in members[1:]:
                worker_start = ["ray", "start", "--block", f"--address={head_ip}:6379"]
                self._create(
                    worker,
                    contract.container_name(cluster, "worker"),
                    {
                        **labels,
                        contract.LABEL_ROLE: "worker",
                        contract.LABEL_SPEC: self._spec(cluster, "worker", worker.name),
                    },
                    {**env, "VLLM_HOST_IP": worker.state.data_ip},
                    [*worker_start, f"--node-ip-address={worker.state.data_ip}"],
                )
            launch = asyncio.ensure_future(self._launch_model(head, cluster, len(members)))
            self._launches.append(launch)
            self._background.add(launch)
            launch.add_done_callback(self._background.discard)

    async def brought_up(self) -> None:
        """Returns once the `healthy` scenario has launched every cluster's model (it then
        loads): from here on a daemon finds nothing to start."""
        await asyncio.gather(*self._launches)

    def _spec(self, cluster: str, role: str, host: str | None = None) -> str:
        key = contract.host_spec_key(cluster, host) if host is not None else None
        by_host = self.spec_labels.get(key) if key is not None else None
        return by_host or self.spec_labels.get(contract.spec_key(cluster, role), "sim-healthy")

    async def _launch_model(self, head: SimHost, cluster: str, gpus: int) -> None:
        """Start `vllm serve` the way sparkd does, once Ray has every host's GPU."""
        while True:
            ray = next(
                (c for c in self.ray.clusters if c.alive and c.ip == head.state.data_ip), None
            )
            if ray is not None and ray.total_gpus(time.monotonic(), self.timing) >= gpus:
                break
            await asyncio.sleep(self.timing.join_retry / 8)
        log = f"{head.state.log_dir}/serve.log"
        spec_file = Path(head.state.log_dir) / "serve.spec"
        spec_file.write_text(self._spec(cluster, "model") + "\n")
        self._give_to_session_user(spec_file)
        inner = (
            f"exec vllm serve {MODEL_ID} --port 30000 --tensor-parallel-size {gpus} "
            "--pipeline-parallel-size 1 --reasoning-parser qwen3 --tool-call-parser qwen3_coder "
            f"--enable-auto-tool-choice >>{log} 2>&1"
        )
        command = f"docker exec -d sparkd-{cluster}-ray-head sh -c {shlex.quote(inner)}"
        rc, _, err = await head.ssh.run_local(command)
        if rc != 0:
            raise RuntimeError(f"could not launch the model on {head.name}: {err.strip()}")

    def _create(
        self,
        host: SimHost,
        name: str,
        labels: dict[str, str],
        env: dict[str, str],
        command: list[str],
    ) -> Container:
        # The compile cache's directory (`model.cache_dir`'s default), as sparkd's start_ray
        # makes it beside the container it starts.
        cache = Path(host.state.log_dir) / "cache"
        cache.mkdir(mode=0o700, exist_ok=True)
        self._give_to_session_user(cache)
        container = Container(
            id=new_container_id(),
            name=name,
            image=QWEN_IMAGE,
            command=command,
            labels=labels,
            env=env,
            mounts=[
                Mount(str(self.models_dir), "/models"),
                Mount(host.state.log_dir, host.state.log_dir),
            ],
            restart="no",
            shm_size="16g",
            gpus="all",
            image_id=image_id(host.state, QWEN_IMAGE),
        )
        host.state.containers[container.id] = container
        host.engine.start(container)
        return container

    # -- container main commands and their consequences ------------------------------------------

    async def _run_main(self, engine: HostEngine, container: Container) -> int:
        if container.crash_loop:
            await asyncio.sleep(self.timing.crash_loop_run)
            for line in crash_loop_log(container.processes[0].pid if container.processes else 1):
                container.log(line)
            return 1
        if container.command[:2] == ["ray", "start"]:
            if self.real_ray is not None:
                return await self.real_ray.run(
                    container,
                    container.command[2:],
                    engine.state.ray_ip_override,
                    dict(container.env),
                )
            return await self.ray.run_start(engine, container, container.command[2:])
        # Any other image command idles until stopped (the stale GLM server, a shell...).
        await asyncio.Event().wait()
        return 0

    def _container_exited(self, engine: HostEngine, container: Container) -> None:
        for serve in list(self.serves):
            if serve.container is container:
                serve.kill_hard()
        if self.real_ray is not None:
            self.real_ray.kill(container.id)

    def _ray_container_at(self, ip: str) -> tuple[HostEngine, Container] | None:
        """The running Ray container whose node registered with `ip`."""
        for host in self.hosts.values():
            if ip not in (host.state.data_ip, host.state.ray_ip_override):
                continue
            for container in host.state.containers.values():
                if container.running and container.command[:2] == ["ray", "start"]:
                    return host.engine, container
        return None

    def _node_lost(self, cluster: RayCluster, node: RayNode) -> None:
        for serve in list(self.serves):
            if serve.cluster is cluster and any(
                c.id == node.container_id for _, c, _, _ in serve.workers
            ):
                self._unhang_engine(serve)
                serve.crash(f"Ray node {node.node_id[:8]} ({node.ip}) died")

    def _freeze(self, container: Container) -> None:
        """The container's processes stop (SIGSTOP, a host that stops answering): its Ray nodes
        hang, and a model using them hangs with them until Ray declares them dead."""
        if self.real_ray is not None:
            # Real Ray finds out on its own; the model hangs until its driver sees the node die.
            self.real_ray.freeze(container.id)
            frozen = [container.id] if self.real_ray.frozen(container.id) else []
        else:
            frozen = [n.container_id for n in self.ray.freeze(container.id)]
        ids = set(frozen)
        for serve in self.serves:
            if any(c.id in ids for _, c, _, _ in serve.workers):
                host = next(h for h in self.hosts.values() if h.engine is serve.engine)
                if host.behaviour.engine == "ok":
                    host.behaviour.engine = "hung"
                    self._engines_hung_by_ray.add(host.name)

    def _hang_across(self, host: str) -> None:
        """Every running model with a rank on `host` hangs (completions never finish)."""
        h = self.host(host)
        ids = set(h.state.containers)
        for serve in self.serves:
            if serve.engine is not h.engine and not any(
                c.id in ids for _, c, _, _ in serve.workers
            ):
                continue
            head = next(x for x in self.hosts.values() if x.engine is serve.engine)
            if head.behaviour.engine == "ok":
                head.behaviour.engine = "hung"
                self._engines_hung_by_link.add(head.name)

    def _thaw(self, container: Container) -> None:
        if self.real_ray is not None:
            self.real_ray.thaw(container.id)
        self.ray.thaw(container.id)
        for serve in self.serves:
            if not any(self._frozen(c.id) for _, c, _, _ in serve.workers):
                self._unhang_engine(serve)

    def _frozen(self, container_id: str) -> bool:
        if self.real_ray is not None:
            return self.real_ray.frozen(container_id)
        return self.ray.frozen(container_id)

    def _unhang_engine(self, serve: ServeProcess) -> None:
        for host in self.hosts.values():
            if host.engine is serve.engine and host.name in self._engines_hung_by_ray:
                self._engines_hung_by_ray.discard(host.name)
                if host.behaviour.engine == "hung":
                    host.behaviour.engine = "ok"

    # -- the fake tools --------------------------------------------------------------------------

    async def handle(self, call: ToolCall) -> Reply:
        host = self.hosts.get(call.host)
        if host is None:
            return fail(f"{call.tool}: unknown simulated host {call.host!r}", 125)
        if call.tool == "@ssh":
            # From the ForceCommand wrapper of a host behind a real sshd.
            self._record(host.name, "ssh", call.args[0] if call.args else "")
            return Done()
        container = host.state.containers.get(call.container) if call.container else None
        self._record(host.name, "tool", " ".join(call.argv), container.name if container else None)
        state = host.state
        tool = call.tool
        if any(tuple(call.argv[: len(prefix)]) == prefix for prefix in host.hung_tools):
            return self._hang(host, call)
        if tool == "ray" and container is not None and self._frozen(container.id):
            # Its processes are stopped: the CLI waits on them for ever.
            return self._hang(host, call)
        if tool == "docker":
            if container is not None:
                return fail("bash: docker: command not found", 127)
            if host.docker_down:
                return fail(DOCKER_DOWN, 1)
            return await FakeDocker(host.engine, lambda c: self.session_env(host.name, c))(call)
        if tool == "ray":
            if self.real_ray is not None and container is not None:
                return await self.real_ray.cli(container, call.args)
            return self.ray.cli(container, call.args)
        if tool == "vllm":
            return self._vllm(host, container, call)
        if tool == "systemctl":
            return fake_system.systemctl(state, call.args)
        if tool == "nvidia-smi":
            return fake_system.nvidia_smi(state, call.args)
        if tool == "ip":
            return fake_system.ip(state, call.args)
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
        return fail(f"bash: {tool}: command not found", 127)

    def _hang(self, host: SimHost, call: ToolCall) -> Stream:
        """Answer nothing, ever: the call ends only when its caller goes away."""
        hung = HungCall(host.name, call.argv)
        self.hung_calls.append(hung)
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
            served = self.served.setdefault(host.name, deque(maxlen=SERVED_KEPT))
            server = SimVllmServer(
                model,
                host.behaviour,
                host=address,
                # A real sshd dials the model port it is asked for, so there the model listens
                # on it; elsewhere on an ephemeral one, so worlds never collide.
                port=port if self.ssh_server == "openssh" else 0,
                api_key=key,
                max_model_len=max_len,
                served=served,
            )
            return _MappedServer(server, address, port, self.listening)

        serve = ServeProcess(
            host.engine,
            container,
            args,
            self.ray.cluster_of(container.id),
            {h.name: h.engine for h in self.hosts.values()},
            self.timing,
            host.faults,
            make_server,
            self.real_ray.placement(container) if self.real_ray is not None else None,
        )
        self.serves.append(serve)
        serve.stream.exit_code.add_done_callback(lambda _: self._forget(serve))
        if self.real_ray is not None:
            # No `_node_lost` from real Ray: the engine a frozen node hung ends with its serve.
            serve.stream.exit_code.add_done_callback(lambda _: self._unhang_engine(serve))
        return serve.stream

    def _forget(self, serve: ServeProcess) -> None:
        with contextlib.suppress(ValueError):
            self.serves.remove(serve)
        # A broken link hung this process's NCCL, not the next launch's.
        for host in self.hosts.values():
            if host.engine is serve.engine and host.name in self._engines_hung_by_link:
                self._engines_hung_by_link.discard(host.name)
                if host.behaviour.engine == "hung":
                    host.behaviour.engine = "ok"

    def _deliver_signal(self, state: HostState, pid: int, sig: int) -> bool:
        host = self.hosts[state.name]
        for serve in self.serves:
            if serve.engine is host.engine and serve.pid == pid:
                if sig:
                    serve.kill_api_server() if sig == 9 else serve.terminate()
                return True
            for engine, _, proc, _ in serve.workers:
                if engine is host.engine and proc.pid == pid:
                    if sig:
                        serve.crash(f"RayWorkerWrapper pid={pid} killed by signal {sig}")
                    return True
        for container in state.containers.values():
            for index, proc in enumerate(container.processes):
                if proc.pid == pid:
                    if sig in (19, 20):
                        self._freeze(container)
                    elif sig == 18:
                        self._thaw(container)
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
        ssh = self.host(host).ssh
        if not isinstance(ssh, OpenSshHost):
            raise ValueError("a forced command needs ssh_server='openssh'")
        ssh.install_forced_command(program)

    # -- faults ----------------------------------------------------------------------------------

    async def fault(self, name: str, host: str, arg: str | None = None) -> str:
        """Inject fault `name` on `host`; returns a one-line description of what happened."""
        target = self.host(host)
        plain: dict[str, Callable[[str], Awaitable[str]]] = {
            "reboot": self.reboot,
            "unreachable": self.unreachable,
            "blackhole": self.blackhole,
            "heal": self.heal,
            "crash-model": self.crash_model,
            "hang-engine": self.hang_engine,
            "oom-capture": self.oom_capture,
            "wrong-ip": self.wrong_ip,
            "slow-load": self.slow_load,
            "stall-load": self.stall_load,
            "chatty-stall": self.chatty_stall,
            "noisy-load": self.noisy_load,
            "docker-down": self.docker_down,
            "docker-hung": self.docker_hung,
            "hand-restart-serve": self.hand_restart_serve,
            "lost-gpu": self.lost_gpu,
            "orphan-engine": self.orphan_engine,
            "hang-capture": self.hang_capture,
            "xid-79": self.xid_79,
            "xid-13": self.xid_13,
            "xid-45": self.xid_45,
            "link-flap": self.link_flap,
            "hang-under-load": self.hang_under_load,
        }
        with_arg: dict[str, Callable[[str, str | None], Awaitable[str]]] = {
            "stray-gpu": self.stray_gpu,
            "kill-container": self.kill_container,
            "hang-container": self.hang_container,
            "crash-loop": self.crash_loop,
            "repull-image": self.repull_image,
            "answer-style": self.answer_style,
            "hang-tool": self.hang_tool,
            "rename-iface": self.rename_iface,
            "full-disk": self.full_disk,
            "pull-image": self.pull_image,
            "nv-no-memory-wedge": self.nv_no_memory_wedge,
            "aer-fatal": self.aer_fatal,
            "memory-pressure": self.memory_pressure,
            "gid-moved": self.gid_moved,
            "mtu-mismatch": self.mtu_mismatch,
            "rate-degraded": self.rate_degraded,
            "late-delivery": self.late_delivery,
            "missing-weights": self.missing_weights,
            "vanish-weights": self.vanish_weights,
        }
        if name in with_arg:
            return await with_arg[name](target.name, arg)
        if name not in plain:
            known = ", ".join(sorted([*plain, *with_arg]))
            raise ValueError(f"unknown fault {name!r}; known: {known}")
        if arg is not None:
            raise ValueError(f"fault {name!r} takes no argument")
        return await plain[name](target.name)

    def query(self, name: str, host: str) -> list[dict[str, Any]]:
        """What the control socket's queries answer: `requests` (the host's model servers'
        latest requests, oldest first, each with the server's own time for it) or `commands`
        (every SSH command and fake-tool call on the host)."""
        target = self.host(host)
        if name == "requests":
            return [
                {"method": r.method, "path": r.path, "status": r.status, "at": r.at,
                 "seconds": r.seconds}
                for r in self.served.get(target.name, ())
            ]  # fmt: skip
        if name == "commands":
            return [
                {"at": r.at, "source": r.source, "command": r.command, "container": r.container}
                for r in self.commands(target.name)
            ]
        raise ValueError(f"unknown query {name!r}; known: commands, requests")

    async def power(self, action: str, host: str) -> str:
        """A switched PDU's outlet: `cycle` cuts the host's power and restores it (a reboot
        that nothing on the host can refuse, a wedged kernel included)."""
        if action != "cycle":
            raise ValueError(f"unknown power action {action!r}; known: cycle")
        self.host(host)
        self.power_log.append(PowerRecord(time.time(), host, action))
        await self.reboot(host)
        return f"{host}: outlet power cycled (off, on)"

    async def reboot(self, host: str) -> str:
        """Everything on the host dies; it comes back after `reboot_downtime` with a new boot id,
        its enabled units active and its `always`/`unless-stopped` containers restarted."""
        h = self.host(host)
        h.reachability = "down"
        await h.ssh.close()
        for serve in list(self.serves):
            if serve.engine is h.engine:
                serve.kill_hard()
        h.engine.shutdown()
        for unit in h.state.units.values():
            unit.active = False
        self._spawn(self._boot(h))
        return f"{host} rebooting; back in {self.timing.reboot_downtime:g}s"

    async def _boot(self, h: SimHost) -> None:
        await asyncio.sleep(self.timing.reboot_downtime)
        h.state.boot_id = new_boot_id()
        h.state.booted_wall = time.time()
        h.state.gpu_lost = False
        fake_kernel.boot(h.state)
        for unit in h.state.units.values():
            unit.active = unit.enabled
        h.engine.boot()
        if h.reachability == "down":  # an unreachable/blackhole fault outlives the reboot
            h.reachability = "ok"
            await h.ssh.listen()

    async def unreachable(self, host: str) -> str:
        h = self.host(host)
        h.reachability = "unreachable"
        await h.ssh.close()
        return f"{host} unreachable: SSH connections refused"

    async def blackhole(self, host: str) -> str:
        h = self.host(host)
        h.reachability = "blackhole"
        await h.ssh.blackhole()
        # Nothing answers, not even Ray's health checks: the host's nodes hang.
        for container in list(h.state.containers.values()):
            if container.running:
                self._freeze(container)
        return f"{host} blackholed: SSH accepts TCP and never answers"

    async def heal(self, host: str) -> str:
        """Undo the reversible faults on `host` (a reboot in progress finishes on its own)."""
        h = self.host(host)
        if h.reachability in ("unreachable", "blackhole"):
            h.reachability = "ok"
            await h.ssh.listen()
        for container in list(h.state.containers.values()):
            self._thaw(container)
            container.crash_loop = False
        h.state.memory_available_kib = fake_kernel.MEM_AVAILABLE_KIB
        h.state.link = fake_fabric.Link(carrier_changes=h.state.link.carrier_changes)
        h.faults.slow_load = False
        h.faults.stall_load = False
        h.faults.chatty_stall = False
        h.faults.noisy_log = self.noisy_load_logs
        h.faults.oom_capture = False
        h.faults.hang_capture = False
        for model in sorted(self._damaged):
            self.add_checkpoint(model)
        self._damaged.clear()
        h.faults.missing_weights.clear()
        h.faults.vanish_weights.clear()
        h.state.disk_avail_bytes = HostState.disk_avail_bytes
        h.state.ray_ip_override = None
        h.behaviour.engine = "ok"
        h.behaviour.style = "reasoning_only"
        h.behaviour.naming = self.answer_naming
        h.hung_tools.clear()
        h.docker_down = False
        h.state.interface = INTERFACE
        h.state.gpu_processes = [
            g for g in h.state.gpu_processes if g.container_id is not None or g.graphics
        ]
        return f"{host} healed"

    def _serve_on(self, host: str) -> ServeProcess:
        h = self.host(host)
        for serve in self.serves:
            if serve.engine is h.engine:
                return serve
        raise ValueError(f"no vllm serve running on {host}")

    async def crash_model(self, host: str) -> str:
        self._serve_on(host).crash("injected crash")
        return f"model on {host} crashed"

    async def hang_engine(self, host: str) -> str:
        self.host(host).behaviour.engine = "hung"
        return f"engine on {host} hung: /health 200, completions never finish"

    async def hang_under_load(self, host: str) -> str:
        """Other clients' requests running when the engine hangs: vLLM's API server still
        answers /metrics with the engine's last figures, requests running and the token counter
        standing still. The hang, and the load, are this serve process's: the next one serves
        as the host did before."""
        h = self.host(host)
        serve = self._serve_on(host)
        style = h.behaviour.style
        h.behaviour.style = "busy"
        h.behaviour.engine = "hung"

        def recover(_: object) -> None:
            if h.behaviour.engine == "hung":
                h.behaviour.engine = "ok"
                h.behaviour.style = style

        serve.stream.exit_code.add_done_callback(recover)
        return f"engine on {host} hung under load: requests running, no token generated"

    async def oom_capture(self, host: str) -> str:
        self.host(host).faults.oom_capture = True
        return f"next CUDA graph capture on {host} is OOM-killed"

    async def wrong_ip(self, host: str) -> str:
        h = self.host(host)
        # Still a loopback address: nothing may ever dial a non-loopback one.
        h.state.ray_ip_override = str(ipaddress.IPv4Address(h.address) + WRONG_IP_OFFSET)
        return f"Ray on {host} registers as {h.state.ray_ip_override} from its next start"

    async def stray_gpu(self, host: str, arg: str | None = None) -> str:
        h = self.host(host)
        pid = h.engine.new_pid()
        h.state.gpu_processes.append(
            GpuProcess(pid=pid, name="/usr/bin/python3", used_mib=int(arg or 96073))
        )
        return f"stray GPU process {pid} on {host}"

    async def late_delivery(self, host: str, arg: str | None = None) -> str:
        """The next command naming its owner (HA: fenced, or tagged) reaches `host` `arg`
        seconds late, as bytes a partition held back would; nothing is printed."""
        if arg is None:
            raise ValueError("late-delivery needs seconds")
        self.host(host).ssh.late = float(arg)
        return f"the next owned command reaches {host} {float(arg):g}s late"

    def owned_commands(self) -> list[OwnedCommand]:
        """Every command naming its owner that a host ran (or refused), oldest first."""
        found = [c for h in self.hosts.values() for c in h.ssh.owned]
        return sorted(found, key=lambda c: c.at)

    async def kill_container(self, host: str, arg: str | None = None) -> str:
        h = self.host(host)
        if arg is None:
            raise ValueError("kill-container needs a container name")
        container = h.state.container(arg)
        if container is None or not container.running:
            raise ValueError(f"no running container {arg!r} on {host}")
        h.engine.stop_container(container, 137, by_user=False)
        return f"container {container.name} on {host} killed (exit 137)"

    async def hang_container(self, host: str, arg: str | None = None) -> str:
        """Every process of container `arg` stops (SIGSTOP), as on a wedged node while its host
        still answers SSH; `heal` continues them."""
        h = self.host(host)
        container = h.state.container(arg) if arg is not None else None
        if container is None or not container.running:
            raise ValueError(f"hang-container needs a running container on {host}, got {arg!r}")
        self._freeze(container)
        return f"container {container.name} on {host} hung (its processes stopped)"

    async def crash_loop(self, host: str, arg: str | None = None) -> str:
        """Container `arg`'s process dies at start-up from now on: under a restart policy docker
        restarts it with its backoff, `restarting` in between."""
        h = self.host(host)
        if arg is None:
            raise ValueError("crash-loop needs a container name")
        container = h.state.container(arg)
        if container is None:
            raise ValueError(f"no container {arg!r} on {host}")
        container.crash_loop = True
        if container.running:
            h.engine.stop_container(container, 1, by_user=False)
        return f"container {container.name} on {host} now exits at start-up ({container.restart})"

    async def repull_image(self, host: str, arg: str | None = None) -> str:
        """Tag `arg` (default: the Ray image) now points at a new image ID on `host` only, as
        after a `docker pull` of a moved tag there; existing containers keep their image."""
        h = self.host(host)
        name = normalize_image(arg or QWEN_IMAGE)
        new_id = "sha256:" + secrets.token_hex(32)
        h.state.images.add(name)
        h.state.image_ids[name] = new_id
        return f"{name} on {host} is now {new_id[:19]}"

    async def pull_image(self, host: str, arg: str | None = None) -> str:
        """`docker pull` of tag `arg` on `host`: the same image ID every host pulls."""
        if not arg:
            raise ValueError("pull-image needs the tag")
        name = normalize_image(arg)
        self.host(host).state.images.add(name)
        return f"{name} pulled on {host}"

    async def full_disk(self, host: str, arg: str | None = None) -> str:
        """The file system under the log dir (and Docker's) has `arg` bytes left (default 0)."""
        free = int(arg) if arg else 0
        self.host(host).state.disk_avail_bytes = free
        return f"{host}: {free} bytes free"

    async def lost_gpu(self, host: str) -> str:
        """The GPU fell off the bus (Xid 79): nvidia-smi exits 15 until a reboot."""
        self.host(host).state.gpu_lost = True
        return f"the GPU of {host} is lost"

    async def xid_79(self, host: str) -> str:
        """The kernel logs XID 79 and the GPU is lost (nvidia-smi exits 15) until a reboot."""
        fake_kernel.log(self.host(host).state, fake_kernel.XID_79)
        return await self.lost_gpu(host)

    async def xid_13(self, host: str) -> str:
        """An application's graphics exception: logged, the GPU stays usable."""
        fake_kernel.log(self.host(host).state, fake_kernel.XID_13)
        return f"{host}: XID 13 logged"

    async def xid_45(self, host: str) -> str:
        """A process torn down while on the GPU: logged, harmless."""
        fake_kernel.log(self.host(host).state, fake_kernel.XID_45)
        return f"{host}: XID 45 logged"

    async def nv_no_memory_wedge(self, host: str, arg: str | None = None) -> str:
        """NVRM logs NV_ERR_NO_MEMORY; `arg` seconds later (default 10) the host stops
        answering, SSH included, until a power cycle (a reboot fault) or `heal`."""
        fake_kernel.log(self.host(host).state, fake_kernel.NV_NO_MEMORY)
        return self._wedge_later(host, arg, "NV_ERR_NO_MEMORY")

    async def aer_fatal(self, host: str, arg: str | None = None) -> str:
        """A fatal PCIe AER on the ConnectX-7, mlx5's error handler and a soft lockup; `arg`
        seconds later (default 10) the host stops answering."""
        fake_kernel.log(self.host(host).state, fake_kernel.AER_FATAL)
        return self._wedge_later(host, arg, "fatal AER")

    def _wedge_later(self, host: str, arg: str | None, what: str) -> str:
        delay = float(arg) if arg else 10.0

        async def wedge() -> None:
            await asyncio.sleep(delay)
            await self.blackhole(host)

        self._spawn(wedge())
        return f"{host}: {what} logged; wedged in {delay:g}s"

    async def memory_pressure(self, host: str, arg: str | None = None) -> str:
        """MemAvailable drops to `arg` bytes (default 1 GiB) until a reboot or `heal`."""
        available = int(arg) if arg else 1 << 30
        self.host(host).state.memory_available_kib = available // 1024
        return f"{host}: MemAvailable {available} bytes"

    async def gid_moved(self, host: str, arg: str | None = None) -> str:
        """The link dropped and the data address was re-added: its RoCE v2 GID row moves to
        `arg` (default 5), and the carrier changed twice."""
        link = self.host(host).state.link
        link.gid_start = (int(arg) if arg else 5) - 1
        link.carrier_changes += 2
        return f"{host}: the data IP's RoCE v2 GID is now at index {link.gid_start + 1}"

    async def mtu_mismatch(self, host: str, arg: str | None = None) -> str:
        """A firmware update reset the data interface's MTU to `arg` (default 1500): the model
        serving across it hangs in NCCL without an error, and stays hung after the MTU is set
        back, until it is relaunched."""
        self.host(host).state.link.mtu = int(arg) if arg else 1500
        self._hang_across(host)
        return f"{host}: data interface MTU {self.host(host).state.link.mtu}"

    async def rate_degraded(self, host: str, arg: str | None = None) -> str:
        """The port trained at `arg` Gb/s (default 25) instead of 200."""
        rate = arg or "25"
        self.host(host).state.link.rate = f"{rate} Gb/sec (1X HDR)"
        return f"{host}: RDMA port at {rate} Gb/s"

    async def link_flap(self, host: str) -> str:
        """The data link went down and came back: two carrier changes."""
        self.host(host).state.link.carrier_changes += 2
        return f"{host}: data link flapped"

    async def orphan_engine(self, host: str) -> str:
        """`kill -9` of the API server: its EngineCore and Ray workers stay with the GPUs."""
        self._serve_on(host).kill_api_server()
        return f"vllm serve on {host} SIGKILLed; its engine stays"

    async def hang_capture(self, host: str) -> str:
        self.host(host).faults.hang_capture = True
        return f"the next CUDA-graph capture on {host} hangs, spinning"

    async def missing_weights(self, host: str, arg: str | None = None) -> str:
        """`arg` is `MODEL[:FILE]`: a shard of MODEL's checkpoint (default the second of 39) is
        gone from the model directory (made first if MODEL had none), until `heal`; every load
        of that model fails for it, as vLLM's loader finds the file absent."""
        if not arg:
            raise ValueError("fault 'missing-weights' needs MODEL[:FILE]")
        model, _, shard = arg.partition(":")
        shard = shard or shard_name(2)
        if model.startswith("/models/"):
            directory = self.model_dir(model)
            if not (directory / "model.safetensors.index.json").exists():
                write_checkpoint(directory)
            (directory / shard).unlink(missing_ok=True)
            self._damaged.add(model)
        self.host(host).faults.missing_weights[model] = shard
        return f"{model} on {host} misses a weight file its index names"

    async def vanish_weights(self, host: str, arg: str | None = None) -> str:
        """`arg` is `MODEL[:FILE]`: the shard goes from MODEL's directory (under /models) once
        the next serve of MODEL on `host` has started, after sparkd prepared the cutover."""
        if not arg or not arg.startswith("/models/"):
            raise ValueError("fault 'vanish-weights' needs MODEL[:FILE], MODEL under /models")
        model, _, shard = arg.partition(":")
        self.host(host).faults.vanish_weights[model] = shard or shard_name(2)
        self._damaged.add(model)
        return f"a weight file of {model} goes from {host} once its next serve starts"

    async def slow_load(self, host: str) -> str:
        self.host(host).faults.slow_load = True
        return f"model loads on {host} take {self.timing.slow_load_factor:g}x longer"

    async def hang_tool(self, host: str, arg: str | None = None) -> str:
        """Calls of fake tool `arg` on `host` (inside its containers too) never answer, as a
        wedged `nvidia-smi` or a `ray status` stuck on a dead GCS does. `arg` may go on with
        arguments (`docker ps`): then only calls starting with those words hang. `ray` alone
        also stalls the host's Ray dashboard (its state API waits on the same GCS)."""
        words = tuple(shlex.split(arg or ""))
        tools = [t for t in TOOLS if t != "sudo"]
        if not words or words[0] not in tools:
            raise ValueError(f"hang-tool needs one of: {', '.join(tools)} (and any arguments)")
        self.host(host).hung_tools.add(words)
        return f"{' '.join(words)} on {host} now hangs"

    async def docker_down(self, host: str) -> str:
        self.host(host).docker_down = True
        return f"dockerd on {host} is gone; its containers keep running"

    async def docker_hung(self, host: str) -> str:
        self.host(host).hung_tools.add(("docker",))
        return f"every docker call on {host} now hangs (a wedged dockerd)"

    async def rename_iface(self, host: str, arg: str | None = None) -> str:
        """The data-plane device has a new name (a kernel update renamed it): the configured
        name no longer exists, the address stays on the renamed device."""
        h = self.host(host)
        h.state.interface = arg or "enP2p1s0f0np0"
        return f"{host}'s data interface is now {h.state.interface}"

    async def hand_restart_serve(self, host: str) -> str:
        """An operator restarts `vllm serve` by hand: stopped, then started again with the same
        arguments into the same log, without sparkd's launch marker or PID file."""
        serve = self._serve_on(host)
        h = self.host(host)
        argv, container = list(serve.args.argv), serve.container
        serve.terminate()
        await serve.wait_stopped()
        inner = f"exec vllm serve {shlex.join(argv)} >>{h.state.log_dir}/serve.log 2>&1"
        key = Path(h.state.log_dir) / "api_key"
        if serve.args.api_key is not None and key.exists():
            inner = f'VLLM_API_KEY="$(cat {key})"; export VLLM_API_KEY; {inner}'
        command = f"docker exec -d {container.name} sh -c {shlex.quote(inner)}"
        rc, _, err = await h.ssh.run_local(command)
        if rc != 0:
            raise RuntimeError(f"could not restart the model on {host}: {err.strip()}")
        return f"vllm serve on {host} restarted by hand (same arguments, no sparkd marker)"

    async def stall_load(self, host: str) -> str:
        self.host(host).faults.stall_load = True
        return f"the next model load on {host} stalls at 40% and never finishes"

    async def chatty_stall(self, host: str) -> str:
        self.host(host).faults.chatty_stall = True
        return f"the next model load on {host} sticks at 41% while its log keeps getting warnings"

    async def noisy_load(self, host: str) -> str:
        self.host(host).faults.noisy_log = True
        return f"model loads on {host} print vLLM's and Ray's harmless error-like warnings"

    async def answer_style(self, host: str, arg: str | None = None) -> str:
        styles = (
            "reasoning_only",
            "answer",
            "empty",
            "malformed",
            "http_500",
            "garbled",
            "slow",
            "busy",
            "no_answer",
        )
        style = (arg or "").replace("-", "_")
        if style not in styles:
            raise ValueError(f"answer-style needs one of: {', '.join(styles)}")
        self.host(host).behaviour.style = style  # type: ignore[assignment]
        return f"model on {host} now answers {style}"

    # -- client files ----------------------------------------------------------------------------

    def _write_client_files(self) -> None:
        self.client_key_path.write_bytes(self._client_key.export_private_key("openssh"))
        self.client_key_path.chmod(0o600)
        lines = [
            f"[{h.address}]:{h.port} "
            + h.ssh.host_key.export_public_key("openssh").decode().strip()
            for h in self.hosts.values()
        ]
        self.known_hosts_path.write_text("".join(line + "\n" for line in lines))
        self.config_path.write_text(render_config(self))


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


def _check_reachable(path: Path, user: str | None) -> None:
    """Refuse to start if the session user could not reach the fake tools: the shell would then
    fall through to the real docker/systemctl further down the PATH."""
    if user is None:
        return
    for part in [path, *path.parents]:
        if not part.stat().st_mode & 0o001:
            raise RuntimeError(
                f"{part} is not traversable by {user}: the fake tools would be hidden"
            )

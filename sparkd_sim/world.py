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
import functools
import ipaddress
import os
import pwd
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import asyncssh

from sparkd_sim import fake_kernel, handmade
from sparkd_sim.config import render_config
from sparkd_sim.control import ControlServer
from sparkd_sim.engine import HostEngine
from sparkd_sim.faults import Faults
from sparkd_sim.hosts import (
    DATA_IP_OFFSET,
    SCENARIOS,
    TOOLS,
    WRONG_IP_OFFSET,
    CommandRecord,
    DockerMode,
    HungCall,
    PowerRecord,
    RayMode,
    Reachability,
    Scenario,
    SimHost,
    SshServer,
    host_names,
)
from sparkd_sim.openssh import OpenSshHost, find_sshd
from sparkd_sim.owned import OwnedCommand
from sparkd_sim.ray_dashboard import DEFAULT_DASHBOARD, DashboardServer
from sparkd_sim.ray_runtime import RayWorld, StatusLayout
from sparkd_sim.real_docker import RealDocker
from sparkd_sim.real_docker import cli as docker_cli
from sparkd_sim.real_ray import RealRay
from sparkd_sim.reference import INTERFACE, MODEL_ID
from sparkd_sim.routing import ToolRouting
from sparkd_sim.scenarios import Scenarios
from sparkd_sim.serve import ServeProcess
from sparkd_sim.serve_hooks import ServeFaults
from sparkd_sim.sshd import SimSshHost
from sparkd_sim.state import HostState
from sparkd_sim.timing import Timing
from sparkd_sim.toolserver import ToolServer
from sparkd_sim.vllm_behaviour import ModelBehaviour, Served
from sparkd_sim.vllm_schema import FieldNaming

# The names tests, the demo and the CLI take from here, wherever they are defined.
__all__ = [
    "SCENARIOS",
    "WRONG_IP_OFFSET",
    "CommandRecord",
    "DockerMode",
    "HungCall",
    "PowerRecord",
    "RayMode",
    "Reachability",
    "Scenario",
    "SimHost",
    "SshServer",
    "World",
    "host_names",
]

BIN_DIR = Path(__file__).with_name("bin")
_LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
_LOCALHOST = ipaddress.IPv4Address("127.0.0.1")


class World(Faults, ToolRouting, Scenarios):
    """The one entry point: builds the hosts, starts and stops everything; what the world does
    once running lives in its rooms (faults, tool routing, scenarios, consequences)."""

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
        if ray == "real" and scenario in ("healthy", "hand-made"):
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
        elif self.scenario == "hand-made":
            await handmade.bring_up(self, handmade.SEED)
        elif self.scenario == "handmade":
            await handmade.bring_up(self, handmade.ADOPTABLE)

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

    def owned_commands(self) -> list[OwnedCommand]:
        """Every command naming its owner that a host ran (or refused), oldest first."""
        found = [c for h in self.hosts.values() for c in h.ssh.owned]
        return sorted(found, key=lambda c: c.at)

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

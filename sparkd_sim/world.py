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
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import asyncssh

from sparkd_sim import fake_kernel, handmade
from sparkd_sim.config import render_config
from sparkd_sim.consequences import Consequences
from sparkd_sim.control import ControlServer
from sparkd_sim.engine import HostEngine
from sparkd_sim.faults import Faults
from sparkd_sim.host_faults import HostFaults
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
from sparkd_sim.model_faults import ModelFaults
from sparkd_sim.openssh import OpenSshHost, find_sshd
from sparkd_sim.owned import OwnedCommand
from sparkd_sim.protocol import Reply, ToolCall
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
from sparkd_sim.state import HostState, RayCluster, RayNode
from sparkd_sim.timing import Timing
from sparkd_sim.toolserver import ToolServer
from sparkd_sim.vllm_behaviour import ModelBehaviour, Served
from sparkd_sim.vllm_schema import FieldNaming
from sparkd_sim.world_state import WorldState

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


class World:
    """The one entry point: builds the hosts, starts and stops everything. What the world does
    once running lives in its parts, each an object handed the world's state (`WorldState`, the
    one owner of its hosts and records) and the other parts it calls: the fault table
    (`Faults`, over `HostFaults` and `ModelFaults`), the tool routing, the scenarios and the
    consequences. The methods and attributes tests and tools use on a world are delegated."""

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
        # Sessions never run as root: a fake-tool PATH mistake must not reach the real system.
        run_as = run_as if run_as is not None else ("nobody" if os.geteuid() == 0 else None)
        self._sshd: str | None = None
        if ssh_server == "openssh":
            self._sshd = _check_openssh(user, data_network)
            # sshd logs sessions in as `user` itself; the world's files must be theirs.
            run_as = user
        self.state = WorldState(
            first_address=first,
            directory=Path(directory) if directory is not None else None,
            hosts=hosts,
            clusters=clusters,
            scenario=scenario,
            timing=timing or Timing.fast(),
            user=user,
            cluster_name=cluster_name,
            ray_status_layout=ray_status_layout,
            answer_naming=answer_naming,
            run_as=run_as,
            spec_labels=spec_labels,
            noisy_load_logs=noisy_load_logs,
            data_network=data_network,
            ssh_server=ssh_server,
            real_ray=ray == "real",
            real_docker=docker == "real",
            on_node_lost=self._node_lost,
        )
        self.consequences = Consequences(self.state)
        self.host_faults = HostFaults(self.state, self.consequences)
        self.model_faults = ModelFaults(self.state, self.consequences)
        self.faults = Faults(self.state, self.host_faults, self.model_faults)
        self.routing = ToolRouting(self.state, self.consequences)
        self.scenarios = Scenarios(self.state)
        self._tool_server = ToolServer(self.routing.handle)
        self._client_key = asyncssh.generate_private_key("ssh-ed25519")
        self._control = ControlServer(self)
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
        self.state.directory.mkdir(parents=True, exist_ok=True)
        self._prepare_directory()
        self.state.add_checkpoint(MODEL_ID)
        self.state.tool_port = await self._tool_server.start()
        names = host_names(self.state.host_count)
        per_cluster = -(-self.state.host_count // self.state.cluster_count)
        for index, name in enumerate(names):
            cluster_index = index // per_cluster
            first_of_cluster = index % per_cluster == 0
            self.state.hosts[name] = self._make_host(name, index, cluster_index, first_of_cluster)
        if self.state.real_docker is not None:
            await self.state.real_docker.start(names)
        self.scenarios.apply()
        if self.state.real_ray is None:
            for name, host in self.state.hosts.items():
                # A real sshd dials the port itself; the simulated one asks `ToolRouting.real_port`.
                fixed = DEFAULT_DASHBOARD if self.state.ssh_server == "openssh" else 0
                find = functools.partial(self.routing.dashboard_head, name)
                stalled = functools.partial(lambda h: ("ray",) in h.hung_tools, host)
                server = DashboardServer(host.address, fixed, find, self.state.timing, stalled)
                await server.start()
                self.state.dashboards[name] = server
        ports = await asyncio.gather(*(h.ssh.listen() for h in self.state.hosts.values()))
        del ports
        self._write_client_files()
        await self._control.start(self.state.control_path)
        self.started = True
        if self.state.spec_labels_from is not None:
            self.state.spec_labels = dict(self.state.spec_labels_from(self.state.config_path))
        if self.state.scenario == "healthy":
            await self.scenarios.bring_up_healthy()
        elif self.state.scenario == "hand-made":
            await handmade.bring_up(self.scenarios, handmade.SEED)
        elif self.state.scenario == "handmade":
            await handmade.bring_up(self.scenarios, handmade.ADOPTABLE)

    async def stop(self) -> None:
        await self._control.stop()
        self.state.ray.close()
        for server in self.state.dashboards.values():
            await server.stop()
        self.state.dashboards.clear()
        serves = list(self.state.serves)
        for serve in serves:
            serve.kill_hard()
        await asyncio.gather(*(s.wait_stopped() for s in serves), return_exceptions=True)
        for host in self.state.hosts.values():
            host.engine.shutdown()
            await host.ssh.shutdown()
        if self.state.real_ray is not None:
            await self.state.real_ray.close()
        if self.state.real_docker is not None:
            await self.state.real_docker.close()
        for task in list(self.state.background):
            task.cancel()
        await self._tool_server.stop()
        await asyncio.sleep(0)
        shutil.rmtree(self.state.runtime_dir, ignore_errors=True)
        self.started = False

    def _prepare_directory(self) -> None:
        self.state.runtime_dir.chmod(0o755)
        self.state.bin_dir.mkdir(exist_ok=True)
        client = self.state.bin_dir / "sim-tool"
        shutil.copyfile(BIN_DIR / "sim-tool", client)
        client.chmod(0o755)
        shutil.copyfile(BIN_DIR / "session-init.bash", self.state.bin_dir / "session-init.bash")
        (self.state.bin_dir / "session-init.bash").chmod(0o644)
        for tool in TOOLS:
            link = self.state.bin_dir / tool
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to("sim-tool")
        real_cli = docker_cli() if self.state.real_docker is not None else None
        if real_cli is not None:
            (self.state.bin_dir / "docker").unlink()
            (self.state.bin_dir / "docker").symlink_to(Path(real_cli).resolve())
        _check_reachable(self.state.bin_dir, self.state.run_as)

    def _make_host(self, name: str, index: int, cluster_index: int, head: bool) -> SimHost:
        address = str(self.state.first_address + index)
        host_dir = self.state.runtime_dir / "hosts" / name
        log_dir = host_dir / "serve"
        home = host_dir / "home"
        for d in (log_dir, home):
            d.mkdir(parents=True, exist_ok=True)
            self.state.give_to_session_user(d)
        state = HostState(
            name=name,
            address=address,
            role="head" if head else "worker",
            data_ip=(
                str(ipaddress.IPv4Address(address) + DATA_IP_OFFSET)
                if self.state.data_network
                else address
            ),
            interface=INTERFACE,
            log_dir=str(log_dir),
            home=str(home),
        )
        fake_kernel.boot(state)
        engine = HostEngine(
            state, self.consequences.run_main, self.consequences.container_exited, self.state.timing
        )
        ssh_class: Callable[..., SimSshHost] = SimSshHost
        if self._sshd is not None:
            ssh_class = functools.partial(OpenSshHost, sshd=self._sshd, directory=host_dir / "sshd")
        ssh = ssh_class(
            address=address,
            host_key=asyncssh.generate_private_key("ssh-ed25519"),
            client_key=self._client_key,
            user=self.state.user,
            session_env=lambda: self.state.session_env(name),
            cwd=str(home),
            record=lambda command: self.state.record(name, "ssh", command),
            other_addresses=lambda: {h.address for h in self.state.hosts.values()},
            run_as=self.state.run_as,
            real_port=self.routing.real_port,
            aliases=lambda: {
                h.state.data_ip: h.address
                for h in self.state.hosts.values()
                if h.state.data_ip != h.address
            },
        )
        return SimHost(
            state=state,
            engine=engine,
            ssh=ssh,
            cluster=self._cluster_label(cluster_index),
            behaviour=ModelBehaviour(naming=self.state.answer_naming),
            faults=ServeFaults(noisy_log=self.state.noisy_load_logs),
        )

    def _cluster_label(self, index: int) -> str:
        return self.state.cluster_name if index == 0 else f"{self.state.cluster_name}-{index + 1}"

    def query(self, name: str, host: str) -> list[dict[str, Any]]:
        """What the control socket's queries answer: `requests` (the host's model servers'
        latest requests, oldest first, each with the server's own time for it) or `commands`
        (every SSH command and fake-tool call on the host)."""
        target = self.state.host(host)
        if name == "requests":
            return [
                {"method": r.method, "path": r.path, "status": r.status, "at": r.at,
                 "seconds": r.seconds}
                for r in self.state.served.get(target.name, ())
            ]  # fmt: skip
        if name == "commands":
            return [
                {"at": r.at, "source": r.source, "command": r.command, "container": r.container}
                for r in self.state.commands(target.name)
            ]
        raise ValueError(f"unknown query {name!r}; known: commands, requests")

    def owned_commands(self) -> list[OwnedCommand]:
        """Every command naming its owner that a host ran (or refused), oldest first."""
        found = [c for h in self.state.hosts.values() for c in h.ssh.owned]
        return sorted(found, key=lambda c: c.at)

    def _node_lost(self, cluster: RayCluster, node: RayNode) -> None:
        # Ray is the state's, which exists before the consequences that follow a lost node.
        self.consequences.node_lost(cluster, node)

    # -- what is asked of a world (delegated to its parts) --------------------------------------

    async def fault(self, name: str, host: str, arg: str | None = None) -> str:
        """Inject fault `name` on `host`; returns a one-line description of what happened."""
        return await self.faults.fault(name, host, arg)

    async def power(self, action: str, host: str) -> str:
        return await self.faults.power(action, host)

    async def handle(self, call: ToolCall) -> Reply:
        return await self.routing.handle(call)

    def install_forced_command(self, host: str, program: str) -> None:
        self.routing.install_forced_command(host, program)

    async def brought_up(self) -> None:
        await self.scenarios.brought_up()

    def host(self, name: str) -> SimHost:
        return self.state.host(name)

    def commands(self, host: str | None = None) -> list[CommandRecord]:
        return self.state.commands(host)

    def model_dir(self, model: str) -> Path:
        return self.state.model_dir(model)

    def add_checkpoint(self, model: str) -> Path:
        return self.state.add_checkpoint(model)

    def _serve_on(self, host: str) -> ServeProcess:
        return self.state.serve_on(host)

    @property
    def hosts(self) -> dict[str, SimHost]:
        return self.state.hosts

    @property
    def timing(self) -> Timing:
        return self.state.timing

    @property
    def scenario(self) -> Scenario:
        return self.state.scenario

    @property
    def user(self) -> str:
        return self.state.user

    @property
    def run_as(self) -> str | None:
        return self.state.run_as

    @property
    def first_address(self) -> ipaddress.IPv4Address:
        return self.state.first_address

    @property
    def ray(self) -> RayWorld:
        return self.state.ray

    @property
    def real_ray(self) -> RealRay | None:
        return self.state.real_ray

    @property
    def real_docker(self) -> RealDocker | None:
        return self.state.real_docker

    @property
    def serves(self) -> list[ServeProcess]:
        return self.state.serves

    @property
    def served(self) -> dict[str, deque[Served]]:
        return self.state.served

    @property
    def listening(self) -> dict[tuple[str, int], int]:
        return self.state.listening

    @property
    def command_log(self) -> list[CommandRecord]:
        return self.state.command_log

    @property
    def power_log(self) -> list[PowerRecord]:
        return self.state.power_log

    @property
    def hung_calls(self) -> list[HungCall]:
        return self.state.hung_calls

    @property
    def directory(self) -> Path:
        return self.state.directory

    @property
    def bin_dir(self) -> Path:
        return self.state.bin_dir

    @property
    def models_dir(self) -> Path:
        return self.state.models_dir

    @property
    def client_key_path(self) -> Path:
        return self.state.client_key_path

    @property
    def known_hosts_path(self) -> Path:
        return self.state.known_hosts_path

    @property
    def config_path(self) -> Path:
        return self.state.config_path

    @property
    def control_path(self) -> Path:
        return self.state.control_path

    @property
    def ray_port(self) -> int:
        return self.state.ray_port

    @property
    def dashboard_port(self) -> int:
        return self.state.dashboard_port

    # -- client files ----------------------------------------------------------------------------

    def _write_client_files(self) -> None:
        self.state.client_key_path.write_bytes(self._client_key.export_private_key("openssh"))
        self.state.client_key_path.chmod(0o600)
        lines = [
            f"[{h.address}]:{h.port} "
            + h.ssh.host_key.export_public_key("openssh").decode().strip()
            for h in self.state.hosts.values()
        ]
        self.state.known_hosts_path.write_text("".join(line + "\n" for line in lines))
        self.state.config_path.write_text(render_config(self.state))


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


def _check_openssh(user: str, data_network: bool) -> str:
    """The sshd each host runs, once this machine is found able to run it for `user`."""
    sshd = find_sshd()
    if sshd is None:
        raise RuntimeError("no sshd on this machine (apt-get install openssh-server)")
    if os.geteuid() != 0:
        raise RuntimeError("a real sshd needs root (privilege separation)")
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise RuntimeError(
            f"no account {user!r} for sshd to log sessions in as "
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

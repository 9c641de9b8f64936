"""What every part of the world reads and writes: its hosts, their model servers, the records of
what was done, its paths, and the session environment its hosts give the fake tools."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import pwd
import tempfile
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Literal

from sparkd_sim import contract
from sparkd_sim.checkpoint import write_checkpoint
from sparkd_sim.engine import HostEngine
from sparkd_sim.hosts import CommandRecord, HungCall, PowerRecord, Scenario, SimHost, SshServer
from sparkd_sim.ray_dashboard import DEFAULT_DASHBOARD, DashboardServer
from sparkd_sim.ray_nodes import NodeLost
from sparkd_sim.ray_runtime import RayWorld, StatusLayout
from sparkd_sim.real_docker import RealDocker
from sparkd_sim.real_ray import RealRay
from sparkd_sim.serve import ServeProcess
from sparkd_sim.state import Container
from sparkd_sim.timing import Timing
from sparkd_sim.vllm_behaviour import Served
from sparkd_sim.vllm_schema import FieldNaming

_SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class WorldState:
    """The world's state, its one owner: the hosts, their Ray and model servers, the records of
    what was done, and where its files are. The world's parts are each handed this object."""

    def __init__(
        self,
        *,
        first_address: ipaddress.IPv4Address,
        directory: Path | None,
        hosts: int,
        clusters: int,
        scenario: Scenario,
        timing: Timing,
        user: str,
        cluster_name: str,
        ray_status_layout: StatusLayout,
        answer_naming: FieldNaming,
        run_as: str | None,
        spec_labels: Callable[[Path], Mapping[str, str]] | None,
        noisy_load_logs: bool,
        data_network: bool,
        ssh_server: SshServer,
        real_ray: bool,
        real_docker: bool,
        on_node_lost: NodeLost,
    ) -> None:
        self.first_address = first_address
        # Session-visible files (fake tools, per-host homes and log dirs) live in a fresh
        # directory under the system temp dir, which the unprivileged session user can reach even
        # when `directory` sits below a private one.
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="sparkd-sim-"))
        # Checkpoints a fault took a file from (under /models): `heal` makes them whole again.
        self.damaged: set[str] = set()
        self.directory = directory if directory is not None else self.runtime_dir
        self.host_count = hosts
        self.cluster_count = clusters
        self.scenario: Scenario = scenario
        self.timing = timing
        self.user = user
        self.cluster_name = cluster_name
        self.answer_naming: FieldNaming = answer_naming
        # Loads print real vLLM/Ray's harmless error-like lines (see `ServeFaults.noisy_log`).
        self.noisy_load_logs = noisy_load_logs
        # Hosts' data IPs on a network of their own, apart from the management address their
        # default route (and SSH) uses, as on real Sparks.
        self.data_network = data_network
        # Sessions never run as root: a fake-tool PATH mistake must not reach the real system.
        self.run_as = run_as
        self.ssh_server: SshServer = ssh_server
        # The `sparkd.spec` values the `healthy` scenario stamps on what it starts: the caller
        # computes them from the generated config (keys "CLUSTER/head", "CLUSTER/worker",
        # "CLUSTER/model"), so a healthy world shows no drift without the simulator computing the
        # daemon's hashes itself.
        self.spec_labels_from = spec_labels
        self.spec_labels: dict[str, str] = {}
        self.hosts: dict[str, SimHost] = {}
        self.ray = RayWorld(self.timing, on_node_lost)
        self.ray.layout = ray_status_layout
        self.real_ray = RealRay(self.ray_container_at) if real_ray else None
        self.real_docker = (
            RealDocker(self.runtime_dir / "docker", self.session_gid()) if real_docker else None
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
        self.dashboards: dict[str, DashboardServer] = {}
        # The port the fake tools send their calls to (the world's tool server, once started).
        self.tool_port = 0
        # What the world runs on its own (a reboot's boot, a wedge to come, a scenario's model
        # launch): cancelled when it stops.
        self.background: set[asyncio.Future[None]] = set()

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

    def host(self, name: str) -> SimHost:
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r}; hosts: {', '.join(self.hosts)}") from None

    def commands(self, host: str | None = None) -> list[CommandRecord]:
        return [r for r in self.command_log if host is None or r.host == host]

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    def session_gid(self) -> int:
        return pwd.getpwnam(self.run_as).pw_gid if self.run_as is not None else os.getgid()

    def give_to_session_user(self, path: Path) -> None:
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
            "SPARKD_SIM_PORT": str(self.tool_port),
            "SPARKD_SIM_HOST": host,
        }
        if self.real_docker is not None and host in self.real_docker.daemons:
            env["DOCKER_HOST"] = self.real_docker.url(host)
        if container is not None:
            env = {**container.env, **env, "HOSTNAME": state.name}
            env["SPARKD_SIM_CONTAINER"] = container.id
        return env

    def record(
        self,
        host: str,
        source: Literal["ssh", "tool"],
        command: str,
        container: str | None = None,
        session: int | None = None,
    ) -> None:
        record = CommandRecord(time.time(), host, source, command, container, session)
        self.command_log.append(record)

    def serve_on(self, host: str) -> ServeProcess:
        h = self.host(host)
        for serve in self.serves:
            if serve.engine is h.engine:
                return serve
        raise ValueError(f"no vllm serve running on {host}")

    def ray_container_at(self, ip: str) -> tuple[HostEngine, Container] | None:
        """The running Ray container whose node registered with `ip`."""
        for host in self.hosts.values():
            if ip not in (host.state.data_ip, host.state.ray_ip_override):
                continue
            for container in host.state.containers.values():
                if container.running and container.command[:2] == ["ray", "start"]:
                    return host.engine, container
        return None

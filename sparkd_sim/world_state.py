"""What every room of the world reads and writes: its hosts, their model servers, the records of
what was done, its paths, and the session environment its hosts give the fake tools."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import pwd
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Literal

import asyncssh

from sparkd_sim import contract
from sparkd_sim.checkpoint import write_checkpoint
from sparkd_sim.hosts import CommandRecord, HungCall, PowerRecord, Scenario, SimHost, SshServer
from sparkd_sim.ray_dashboard import DEFAULT_DASHBOARD, DashboardServer
from sparkd_sim.ray_runtime import RayWorld
from sparkd_sim.real_docker import RealDocker
from sparkd_sim.real_ray import RealRay
from sparkd_sim.serve import ServeProcess
from sparkd_sim.state import Container
from sparkd_sim.timing import Timing
from sparkd_sim.toolserver import ToolServer
from sparkd_sim.vllm_behaviour import Served
from sparkd_sim.vllm_schema import FieldNaming

_SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class WorldState:
    """The world's state, set up by `World.__init__` (which says what each part is for)."""

    first_address: ipaddress.IPv4Address
    runtime_dir: Path
    directory: Path
    host_count: int
    cluster_count: int
    scenario: Scenario
    timing: Timing
    user: str
    cluster_name: str
    answer_naming: FieldNaming
    noisy_load_logs: bool
    data_network: bool
    run_as: str | None
    ssh_server: SshServer
    spec_labels_from: Callable[[Path], Mapping[str, str]] | None
    spec_labels: dict[str, str]
    hosts: dict[str, SimHost]
    ray: RayWorld
    real_ray: RealRay | None
    real_docker: RealDocker | None
    serves: list[ServeProcess]
    command_log: list[CommandRecord]
    power_log: list[PowerRecord]
    hung_calls: list[HungCall]
    served: dict[str, deque[Served]]
    listening: dict[tuple[str, int], int]
    started: bool
    _damaged: set[str]
    _sshd: str | None
    _dashboards: dict[str, DashboardServer]
    _tool_server: ToolServer
    _client_key: asyncssh.SSHKey
    _background: set[asyncio.Future[None]]
    _launches: list[asyncio.Future[None]]
    _engines_hung_by_ray: set[str]
    _engines_hung_by_link: set[str]

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

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

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
        self,
        host: str,
        source: Literal["ssh", "tool"],
        command: str,
        container: str | None = None,
        session: int | None = None,
    ) -> None:
        record = CommandRecord(time.time(), host, source, command, container, session)
        self.command_log.append(record)

    def _serve_on(self, host: str) -> ServeProcess:
        h = self.host(host)
        for serve in self.serves:
            if serve.engine is h.engine:
                return serve
        raise ValueError(f"no vllm serve running on {host}")

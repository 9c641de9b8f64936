"""A simulated Spark as the world keeps it (`SimHost`), the records of what was done to the
hosts, and the names every part of the world shares."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from sparkd_sim.engine import HostEngine
from sparkd_sim.serve_hooks import ServeFaults
from sparkd_sim.sshd import SimSshHost
from sparkd_sim.state import HostState
from sparkd_sim.vllm_behaviour import ModelBehaviour

TOOLS = (
    "docker", "systemctl", "nvidia-smi", "ray", "vllm", "ip", "df", "kill", "cat", "sudo",
    "journalctl", "grep", "ping", "python3",
)  # fmt: skip
SCENARIOS = ("seed-morning", "seed-crashloop", "healthy", "empty", "hand-made", "handmade")
# `wrong-ip` registers a host this far above its address (127.0.0.2 -> 127.0.100.2).
WRONG_IP_OFFSET = 100 * 256
# With `data_network=True` a host's data IP is this far above its (management) address.
DATA_IP_OFFSET = 50 * 256

# `path_lost`: the ops box's path to the host is gone (its SSH silent to sparkd), the host and
# its data link fine: the other hosts still reach it.
Reachability = Literal["ok", "unreachable", "blackhole", "down", "path_lost"]
# Which SSH server each host runs: asyncssh's, in this process, or a real OpenSSH sshd each.
SshServer = Literal["asyncssh", "openssh"]
Scenario = Literal["seed-morning", "seed-crashloop", "healthy", "empty", "hand-made", "handmade"]
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
    # A tool call's session when the world took it: the PID of the SSH command's shell it came
    # from (each leads a session of its own), so a call is traced to its command.
    session: int | None = None


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
    # A wedge a kernel omen announced and that has not struck yet: a power cycle first ends it
    # (the kernel that was about to hang is gone), so a reboot cancels it.
    pending_wedge: asyncio.Future[None] | None = None

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

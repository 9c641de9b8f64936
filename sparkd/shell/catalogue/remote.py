"""One remote command, and the `timeout` every tool runs under."""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from sparkd.model.cluster import ClusterSpec

KILL_GRACE = 2


@dataclass(frozen=True)
class Remote:
    """One remote command: the shell text to run, and what goes to its stdin (secrets only)."""

    name: str
    command: str
    mutating: bool
    stdin: str | None = None

    def __repr__(self) -> str:  # stdin may hold a secret
        return f"Remote({self.name!r}, {self.command!r}, mutating={self.mutating})"


def timed(argv: Sequence[str], seconds: float) -> list[str]:
    return ["timeout", "-k", str(KILL_GRACE), str(max(1, math.ceil(seconds))), *argv]


def tool_timeout(cluster: ClusterSpec) -> float:
    """Each tool in the fact script gets a share of the command timeout, so one hung tool is
    killed on the host (timeout -k) while the script still reports the others."""
    return max(1.0, cluster.ssh.command_timeout / 3)


def sudo(cluster: ClusterSpec, argv: list[str]) -> list[str]:
    """`argv` through `sudo -n` when the cluster's SSH user needs it (`ssh.sudo`)."""
    return ["sudo", "-n", *argv] if cluster.ssh.sudo else argv


def cmd(argv: Sequence[str], seconds: float) -> str:
    """One tool's command line under `timeout`, every word quoted."""
    return shlex.join(timed(argv, seconds))

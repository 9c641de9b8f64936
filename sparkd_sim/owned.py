"""Commands that name their owner (HA): the fence prefix, or the unfenced audit tag. A simulated
host logs each with its cluster, token and instance and the exit status it ended with, so a
test can check, host by host, that tokens never went backwards in what actually ran."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The simulator shares no code with sparkd: it knows the fence prefix as a host's log would
# show it, a shell function `sparkd_fence` defined and then called with its arguments.
_FENCED = re.compile(
    r"sparkd_fence\(\) \{ .*? \}; sparkd_fence (?P<cluster>\S+) (?P<token>\d+) (?P<etcd>\d+) "
    r"(?P<instance>\S+) \d+( refence| force)? && \{ ",
    re.S,
)
# The fence's own refusals: a newer token recorded, another etcd's record, the lock busy.
FENCE_REFUSALS = (76, 77, 75)
_AUDITED = re.compile(r": sparkd-unfenced (?P<cluster>\S+) (?P<token>\d+) (?P<instance>\S+); ")


@dataclass(frozen=True)
class Owner:
    cluster: str
    token: int
    instance: str
    fenced: bool
    # The etcd cluster the token is from (the fence's record names it too); 0 when unfenced.
    etcd: int = 0


@dataclass(frozen=True)
class OwnedCommand:
    """One owned command as the host ran it: `at` when it started there, `status` its exit,
    `session` the PID of its shell (the leader of its session: the world's records of the
    tool calls it made carry it) and `ended` when it ended."""

    at: float
    host: str
    owner: Owner
    status: int
    command: str
    session: int = 0
    ended: float = 0.0

    @property
    def refused(self) -> bool:
        """The host's fence turned it away: nothing of it ran."""
        return self.owner.fenced and self.status in FENCE_REFUSALS


def owner_of(command: str) -> Owner | None:
    match = _FENCED.match(command)
    if match is not None:
        token, etcd = int(match["token"]), int(match["etcd"])
        return Owner(match["cluster"], token, match["instance"], True, etcd)
    match = _AUDITED.match(command)
    if match is not None:
        return Owner(match["cluster"], int(match["token"]), match["instance"], False)
    return None

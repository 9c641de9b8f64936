"""Commands that name their owner (HA): the fence prefix, or the unfenced audit tag. A simulated
host logs each with its cluster, token and instance and the exit status it ended with, so a
test can check, host by host, that tokens never went backwards in what actually ran."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The simulator shares no code with sparkd: it knows the fence prefix as a host's log would
# show it, a shell function `sparkd_fence` defined and then called with its arguments.
_FENCED = re.compile(
    r"sparkd_fence\(\) \{ .*? \}; sparkd_fence (?P<cluster>\S+) (?P<token>\d+) \d+ "
    r"(?P<instance>\S+) \d+( refence)? && \{ ",
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


@dataclass(frozen=True)
class OwnedCommand:
    """One owned command as the host ran it: `at` when it started there, `status` its exit."""

    at: float
    host: str
    owner: Owner
    status: int
    command: str

    @property
    def refused(self) -> bool:
        """The host's fence turned it away: nothing of it ran."""
        return self.owner.fenced and self.status in FENCE_REFUSALS


def owner_of(command: str) -> Owner | None:
    for pattern, fenced in ((_FENCED, True), (_AUDITED, False)):
        match = pattern.match(command)
        if match is not None:
            return Owner(match["cluster"], int(match["token"]), match["instance"], fenced)
    return None

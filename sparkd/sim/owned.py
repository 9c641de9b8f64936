"""Commands that name their owner (HA): the fence prefix, or the unfenced audit tag. A simulated
host logs each with its cluster, token and instance and the exit status it ended with, so a
test can check, host by host, that tokens never went backwards in what actually ran."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkd.shell import catalogue

_FENCED = re.compile(
    re.escape(catalogue.FENCE_FUNCTION)
    + r"; sparkd_fence (?P<cluster>\S+) (?P<token>\d+) \d+ (?P<instance>\S+) \d+( refence)? && \{ "
)
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
        return self.owner.fenced and self.status in (
            catalogue.FENCED_EXIT,
            catalogue.FENCE_MISMATCH_EXIT,
            catalogue.FENCE_BUSY_EXIT,
        )


def owner_of(command: str) -> Owner | None:
    for pattern, fenced in ((_FENCED, True), (_AUDITED, False)):
        match = pattern.match(command)
        if match is not None:
            return Owner(match["cluster"], int(match["token"]), match["instance"], fenced)
    return None

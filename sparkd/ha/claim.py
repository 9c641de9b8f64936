"""One cluster's claim as this instance knows it, and the clock the owner's deadline runs on."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

Role = Literal["owner", "standby", "no etcd"]


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass
class Claim:
    cluster: str
    # The owner key's create revision while this instance holds it.
    token: int | None = None
    # The instance that held it when last read, when not this one.
    holder: str | None = None
    holder_token: int | None = None
    # The etcd cluster the token is from (the fence on the hosts compares it too).
    etcd_cluster: int | None = None
    # Hosts whose fence refuses every token: another etcd's record, or an unreadable one.
    mismatched: dict[str, str] = field(default_factory=dict)

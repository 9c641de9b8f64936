"""sparkd's forced-command wrapper as a function: which command lines it lets through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkd.model.cluster import ClusterSpec
from sparkd.model.spec import HostSpec
from sparkd.shell import forced

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample sparkd"


def decide(cluster: ClusterSpec, host: HostSpec) -> Callable[[str], bool]:
    namespace: dict[str, Any] = {"__name__": "sparkd_forced_wrapper"}
    exec(compile(forced.wrapper(cluster, host, KEY), "wrapper", "exec"), namespace)
    allowed: Callable[[str], bool] = namespace["allowed"]
    return allowed

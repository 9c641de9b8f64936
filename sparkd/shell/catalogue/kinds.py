"""One row per action kind: the command it sends, the part of it that varies at run time, how
long it may take, which executor method runs it, and what `sparkd commands` lists for it.

The executor, the listing, the forced-command wrapper and the sudoers rules all read this table,
so a new kind is a new `ActionKind` and a new row (a test checks every kind has one and that what
the rows build passes the wrapper and sudoers).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from sparkd.model.cluster import ClusterSpec
from sparkd.model.plan import ActionKind
from sparkd.model.spec import HostSpec
from sparkd.shell.catalogue.actions import (
    SUDO_PATHS,
    SUDOERS_KILL,
    kill_process,
    prune_cache,
    remove_container,
    start_model,
    start_ray,
    stop_unit,
)
from sparkd.shell.catalogue.remote import Remote

# The signals sparkd sends a process (the graceful one, then the one that cannot be caught).
SIGNALS = ("TERM", "KILL")
# What the listing shows for the parts only known at run time.
CACHE_ENTRY_EXAMPLE = "0123456789ab-model"
PID_EXAMPLE = "12345"
API_KEY_EXAMPLE = "<from api_key_file>"

# Which part of a command varies at run time, and so how the wrapper admits it:
# "nothing" and "unit" (the config names every unit): the exact texts the row builds;
# "container", "pid", "cache_entry": an anchored pattern for that part;
# "api_key": the model's spec hash (the key's fingerprint is in it), when the config has a key.
Varies = Literal["nothing", "unit", "container", "pid", "cache_entry", "api_key"]
# How long an action may take (Executor.action_timeout): a Ray start waits on `docker run`, a
# model start also for the serve process to appear and an old one to stop, the power command
# has its own timeout.
TimeoutRule = Literal["default", "ray_start", "model_start", "power"]
# Which hosts a kind acts on; "ops_box": it runs on this box, never over SSH.
Where = Literal["every", "head", "workers", "ops_box"]

# (cluster, host, the varying part, seconds) -> every command shape for that value.
Builder = Callable[[ClusterSpec, HostSpec, str, float], tuple[Remote, ...]]


@dataclass(frozen=True)
class ActionSpec:
    kind: ActionKind
    # The executor's method (Executor._<handler>) that runs the kind.
    handler: str
    timeout: TimeoutRule
    where: Where
    varies: Varies = "nothing"
    # The commands carrying the change; None: nothing is sent to a host (power_cycle).
    build: Builder | None = None
    # The varying part's values `sparkd commands` lists (the config's, or an example).
    examples: Callable[[ClusterSpec, HostSpec], tuple[str, ...]] = lambda cluster, host: ("",)
    # The sudoers commands the kind's `sudo -n` needs, and the names sudoers cannot express.
    sudoers: Callable[[ClusterSpec], tuple[list[str], list[str]]] | None = None

    def on(self, cluster: ClusterSpec, host: HostSpec) -> bool:
        """Whether the kind may act on `host` over SSH."""
        if self.build is None or self.where == "ops_box":
            return False
        if self.where == "head":
            return host.name == cluster.head.name
        if self.where == "workers":
            return host.name != cluster.head.name
        return True

    def listed(self, cluster: ClusterSpec, host: HostSpec, seconds: float) -> list[Remote]:
        """The commands `sparkd commands` shows for the kind on `host`."""
        if self.build is None or not self.on(cluster, host):
            return []
        return [
            r
            for value in self.examples(cluster, host)
            for r in self.build(cluster, host, value, seconds)
        ]


def _units(cluster: ClusterSpec, host: HostSpec) -> tuple[str, ...]:
    return tuple(cluster.cleanup.units)


def _unit_rules(cluster: ClusterSpec) -> tuple[list[str], list[str]]:
    """A stop and a disable per unit; a backslash (systemd's escaping) sudoers cannot match
    literally, so such a unit is refused."""
    rules: list[str] = []
    refused: list[str] = []
    systemctl = SUDO_PATHS["systemctl"]
    for unit in cluster.cleanup.units:
        if "\\" in unit:
            refused.append(unit)
            continue
        escaped = re.sub(r"([,:=!()\s])", r"\\\1", unit)
        rules += [f"{systemctl} stop -- {escaped}", f"{systemctl} disable -- {escaped}"]
    return rules, refused


def _kill_rules(cluster: ClusterSpec) -> tuple[list[str], list[str]]:
    return [f"{SUDO_PATHS['kill']} {SUDOERS_KILL}"], []


def _start_ray(
    cluster: ClusterSpec, host: HostSpec, value: str, seconds: float
) -> tuple[Remote, ...]:
    return (start_ray(cluster, host, seconds),)


def _start_model(
    cluster: ClusterSpec, host: HostSpec, value: str, seconds: float
) -> tuple[Remote, ...]:
    return (
        start_model(cluster, seconds, value if cluster.model.api_key_file is not None else None),
    )


def _api_key(cluster: ClusterSpec, host: HostSpec) -> tuple[str, ...]:
    return (API_KEY_EXAMPLE,)


def _ray_row(kind: ActionKind, where: Where) -> ActionSpec:
    return ActionSpec(kind, "_start_ray", "ray_start", where, build=_start_ray)


def _model_row(kind: ActionKind) -> ActionSpec:
    return ActionSpec(
        kind, "_start_model", "model_start", "head", "api_key", _start_model, _api_key
    )


_ROWS = (
    ActionSpec(
        "stop_unit", "_stop_unit", "default", "every", "unit",
        lambda cluster, host, unit, seconds: (stop_unit(cluster, unit, seconds),),
        _units, _unit_rules,
    ),
    ActionSpec(
        "remove_container", "_remove_container", "default", "every", "container",
        lambda cluster, host, name, seconds: (remove_container(name, seconds),),
        lambda cluster, host: tuple(cluster.cleanup.container_patterns),
    ),
    _ray_row("start_ray_head", "head"),
    _ray_row("start_ray_worker", "workers"),
    _ray_row("restart_ray", "every"),
    _model_row("start_model"),
    _model_row("restart_model"),
    ActionSpec(
        "kill_gpu_process", "_kill_gpu_process", "default", "every", "pid",
        lambda cluster, host, pid, seconds: tuple(
            kill_process(cluster, int(pid), signal, seconds) for signal in SIGNALS
        ),
        lambda cluster, host: (PID_EXAMPLE,),
        _kill_rules,
    ),
    ActionSpec("power_cycle", "_power_cycle", "power", "ops_box"),
    ActionSpec(
        "prune_cache", "_prune_cache", "default", "every", "cache_entry",
        lambda cluster, host, entry, seconds: (prune_cache(cluster, host, entry, seconds),),
        lambda cluster, host: (CACHE_ENTRY_EXAMPLE,),
    ),
)  # fmt: skip

ACTIONS: Mapping[ActionKind, ActionSpec] = MappingProxyType({row.kind: row for row in _ROWS})


def action_commands(cluster: ClusterSpec, host: HostSpec, seconds: float) -> list[Remote]:
    """Every distinct command the action kinds list for `host`, in the table's order."""
    seen: dict[str, Remote] = {}
    for row in ACTIONS.values():
        for remote in row.listed(cluster, host, seconds):
            seen.setdefault(remote.command, remote)
    return list(seen.values())


def sudoers_rules(cluster: ClusterSpec) -> tuple[list[str], list[str]]:
    """The sudoers commands for exactly the kinds' `sudo -n` shapes, and the units sudoers
    cannot express exactly."""
    rules: list[str] = []
    refused: list[str] = []
    for row in ACTIONS.values():
        if row.sudoers is not None:
            more, left = row.sudoers(cluster)
            rules += [rule for rule in more if rule not in rules]
            refused += [name for name in left if name not in refused]
    return rules, refused

"""Every command sparkd runs on a host, built in this package and nowhere else.

Commands are built from typed config values; every value is quoted with `shlex.quote` (via
`shlex.join`), also inside the one nested `sh -c` layer, and every tool runs under
`timeout -k 2 N` so nothing outlives its cycle on the host (an SSH-side timeout closes the channel
but leaves the remote process running).

The package's rooms, each imported by name (`catalogue.actions.start_model`): `remote` (a
command, the `timeout` every tool runs under), `reads` (the fact script and the other reads),
`actions` (what changes a host), `kinds` (the table of action kinds the executor, the listing,
the forced-command wrapper and sudoers read) and `fence` (HA's host-side fence). This module
holds only the whole catalogue, for `sparkd commands` and the wrapper.
"""

from __future__ import annotations

from sparkd.core.spec import container_name
from sparkd.model.cluster import ClusterSpec
from sparkd.model.spec import HostSpec
from sparkd.shell.catalogue import actions, fence, kinds, reads, remote
from sparkd.shell.catalogue.actions import signal_serve
from sparkd.shell.catalogue.kinds import SIGNALS, action_commands
from sparkd.shell.catalogue.reads import (
    EVENTS_SPAN,
    dashboard_reads,
    docker_events,
    fact_scripts,
    gpu_apps,
    inspect_container,
    read_serve_log_tail,
    read_serve_spec,
    serve_processes,
)
from sparkd.shell.catalogue.remote import Remote

__all__ = ["actions", "catalogue", "fence", "helper_commands", "kinds", "reads", "remote"]


def catalogue(cluster: ClusterSpec, seconds: float) -> list[tuple[HostSpec, Remote]]:
    """Every command sparkd may run against this cluster, for `sparkd commands`: the action
    kinds' commands (`ACTIONS`) with `seconds`, and the reads and helpers the executor runs
    beside them, the fact script as observing runs it (`tool_timeout`)."""
    return _entries(cluster, seconds, with_actions=True)


def helper_commands(cluster: ClusterSpec, seconds: float) -> list[tuple[HostSpec, Remote]]:
    """The commands no action kind is named by: observing's reads, and what the executor reads
    and signals around an action (a precondition, a postcondition, stopping the old serve)."""
    return _entries(cluster, seconds, with_actions=False)


def _entries(
    cluster: ClusterSpec, seconds: float, with_actions: bool
) -> list[tuple[HostSpec, Remote]]:
    entries: list[tuple[HostSpec, Remote]] = []
    head = cluster.head
    for host in cluster.hosts:
        entries += [(host, script) for script in fact_scripts(cluster, host)]
        if with_actions:
            entries += [(host, remote) for remote in action_commands(cluster, host, seconds)]
        entries.append((host, gpu_apps(seconds)))
        entries.append((host, docker_events(EVENTS_SPAN)))
    entries.append((head, serve_processes(cluster, seconds)))
    entries += [(head, signal_serve(cluster, signal, seconds)) for signal in SIGNALS]
    entries.append((head, read_serve_spec(cluster, seconds)))
    entries.append((head, read_serve_log_tail(cluster, seconds)))
    entries += [(head, read) for read in dashboard_reads(cluster)]
    for host in cluster.hosts:
        entries.append((host, inspect_container(container_name(cluster, host), seconds)))
    return entries

"""Every command sparkd runs on a host, built in this package and nowhere else.

Commands are built from typed config values; every value is quoted with `shlex.quote` (via
`shlex.join`), also inside the one nested `sh -c` layer, and every tool runs under
`timeout -k 2 N` so nothing outlives its cycle on the host (an SSH-side timeout closes the channel
but leaves the remote process running).

The package's rooms: `remote` (a command, the `timeout` every tool runs under), `reads` (the fact
script and the other reads), `actions` (what changes a host) and `fence` (HA's host-side fence).
"""

from __future__ import annotations

from sparkd.core.spec import container_name
from sparkd.model.cluster import ClusterSpec
from sparkd.model.spec import HostSpec
from sparkd.shell.catalogue.actions import (
    API_KEY_FILE,
    CACHE_STAND_IN,
    PID_DIGITS,
    SUDO_PATHS,
    SUDOERS_KILL,
    docker_run_argv,
    kill_process,
    own_dir,
    prune_cache,
    ray_command,
    remove_container,
    serve_argv,
    serve_shell,
    signal_serve,
    start_model,
    start_ray,
    stop_unit,
)
from sparkd.shell.catalogue.fence import (
    FENCE_DIR,
    FENCE_FUNCTION,
    FENCE_MARKER,
    TOKEN_DIGITS,
    FenceToken,
    audited,
    fence_prefix,
    fence_sweep,
    fenced,
)
from sparkd.shell.catalogue.kinds import (
    ACTIONS,
    CACHE_ENTRY_EXAMPLE,
    SIGNALS,
    ActionSpec,
    action_commands,
    sudoers_rules,
)
from sparkd.shell.catalogue.reads import (
    CACHE_LISTING,
    DASHBOARD_FAILED_EXIT,
    DASHBOARD_GET,
    DASHBOARD_HOST,
    DASHBOARD_MAX_ANSWER,
    DASHBOARD_PATHS,
    DASHBOARD_REFUSED_EXIT,
    DASHBOARD_TOO_LARGE_EXIT,
    DOCKER_ROOT,
    EVENT_ACTIONS,
    EVENTS_SPAN,
    FABRIC_FILES,
    GPU_APPS,
    KERNEL_LOG,
    LOG_TAIL_BYTES,
    MEMINFO_PATH,
    RAIL_FILES,
    REDUCE_INDEX,
    TOP_FORMAT,
    UNIT_PROPERTIES,
    dashboard_get,
    dashboard_reads,
    docker_events,
    fabric_section,
    fact_script,
    fact_scripts,
    gpu_apps,
    inspect_container,
    model_files_sections,
    rail_globs,
    ray_cli,
    read_serve_spec,
    serve_processes,
)
from sparkd.shell.catalogue.remote import KILL_GRACE, Remote, cmd, sudo, timed, tool_timeout

__all__ = [
    "ACTIONS",
    "API_KEY_FILE",
    "CACHE_ENTRY_EXAMPLE",
    "CACHE_LISTING",
    "CACHE_STAND_IN",
    "DASHBOARD_FAILED_EXIT",
    "DASHBOARD_GET",
    "DASHBOARD_HOST",
    "DASHBOARD_MAX_ANSWER",
    "DASHBOARD_PATHS",
    "DASHBOARD_REFUSED_EXIT",
    "DASHBOARD_TOO_LARGE_EXIT",
    "DOCKER_ROOT",
    "EVENTS_SPAN",
    "EVENT_ACTIONS",
    "FABRIC_FILES",
    "FENCE_DIR",
    "FENCE_FUNCTION",
    "FENCE_MARKER",
    "GPU_APPS",
    "KERNEL_LOG",
    "KILL_GRACE",
    "LOG_TAIL_BYTES",
    "MEMINFO_PATH",
    "PID_DIGITS",
    "RAIL_FILES",
    "REDUCE_INDEX",
    "SIGNALS",
    "SUDOERS_KILL",
    "SUDO_PATHS",
    "TOKEN_DIGITS",
    "TOP_FORMAT",
    "UNIT_PROPERTIES",
    "ActionSpec",
    "FenceToken",
    "Remote",
    "action_commands",
    "audited",
    "catalogue",
    "cmd",
    "dashboard_get",
    "dashboard_reads",
    "docker_events",
    "docker_run_argv",
    "fabric_section",
    "fact_script",
    "fact_scripts",
    "fence_prefix",
    "fence_sweep",
    "fenced",
    "gpu_apps",
    "helper_commands",
    "inspect_container",
    "kill_process",
    "model_files_sections",
    "own_dir",
    "prune_cache",
    "rail_globs",
    "ray_cli",
    "ray_command",
    "read_serve_spec",
    "remove_container",
    "serve_argv",
    "serve_processes",
    "serve_shell",
    "signal_serve",
    "start_model",
    "start_ray",
    "stop_unit",
    "sudo",
    "sudoers_rules",
    "timed",
    "tool_timeout",
]


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
    entries += [(head, read) for read in dashboard_reads(cluster)]
    for host in cluster.hosts:
        entries.append((host, inspect_container(container_name(cluster, host), seconds)))
    return entries

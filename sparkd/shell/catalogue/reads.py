"""Every command sparkd runs on a host, built here and nowhere else.

Commands are built from typed config values; every value is quoted with `shlex.quote` (via
`shlex.join`), also inside the one nested `sh -c` layer, and every tool runs under
`timeout -k 2 N` so nothing outlives its cycle on the host (an SSH-side timeout closes the channel
but leaves the remote process running).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkd.core import cache, kernel, parsers, weights
from sparkd.core.assemble import LAUNCH_MARKER
from sparkd.core.spec import (
    LABEL_CLUSTER,
    LABEL_ROLE,
    LABEL_SPEC,
    SHORT_ID_DIGITS,
    container_name,
    key_fingerprint,
    model_spec_hash,
    ray_spec_hash,
    serve_log_path,
    serve_pid_path,
    serve_spec_path,
)
from sparkd.model.exits import FENCE_BUSY_EXIT, FENCE_MISMATCH_EXIT, FENCED_EXIT
from sparkd.model.sections import FactSection, top_section
from sparkd.settings import DEFAULT_DASHBOARD_PORT, ClusterSpec, HostSpec

KILL_GRACE = 2
# A `docker events` stream is renewed this often, so no remote process outlives sparkd by more.
EVENTS_SPAN = 3600.0
UNIT_PROPERTIES = "Id,LoadState,ActiveState,SubState,UnitFileState"
TOP_FORMAT = "pid,etimes,times,args"
LOG_TAIL_BYTES = 65536
# Docker's default data root (`data-root` in daemon.json moves it; then the read is unknown).
DOCKER_ROOT = "/var/lib/docker"
API_KEY_FILE = "api_key"
# The cache root's entries: modification time and name (core.cache.parse_listing).
CACHE_LISTING = ("-mindepth", "1", "-maxdepth", "1", "-printf", "%T@ %f\\n")
CACHE_ENTRY_EXAMPLE = "0123456789ab-model"
# Where the launch puts the image's digits in the cache entry's name (see start_model).
CACHE_STAND_IN = "sparkd-cache-image"


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


def _sudo(cluster: ClusterSpec, argv: list[str]) -> list[str]:
    return ["sudo", "-n", *argv] if cluster.ssh.sudo else argv


def _line(argv: Sequence[str], seconds: float) -> str:
    return shlex.join(timed(argv, seconds))


# -- read path -----------------------------------------------------------------------------


_SECTION_FUNCTION = (
    's() { n=$1; shift; printf \'@@sparkd %s\\n\' "$n"; "$@" 2>&1; rc=$?; '
    'printf \'\\n@@sparkd-end %s %s\\n\' "$n" "$rc"; }'
)
# A section whose output the script reads again (in `$o`); then `N`, a newline, to split that
# output into lines with the shell alone (POSIX sh: the forced command runs `/bin/sh -c`).
_CAPTURE_FUNCTION = (
    'c() { n=$1; shift; o=$("$@" 2>&1); rc=$?; '
    'printf \'@@sparkd %s\\n%s\\n@@sparkd-end %s %s\\n\' "$n" "$o" "$n" "$rc"; }; N=\'\n\''
)
# `$1`..., `$o`'s lines, `IFS` as given: the loops below read captured output without a tool.
_LINES = "set -f; IFS=$N; for l in {text}; do {body}; done; unset IFS; set +f"
# The running containers' names from `docker ps -a`'s JSON lines (what `docker ps` lists: the
# states where Docker counts a container running), one a line. Docker escapes quotes inside
# values, so `"State":"running"` and `"Names":"` match the fields themselves.
_RUNNING_NAMES = "r=; " + _LINES.format(
    text="$k",
    body=(
        'case $l in *\'"State":"running"\'*|*\'"State":"restarting"\'*|*\'"State":"paused"\'*) '
        'case $l in *\'"Names":"\'*) n=${l#*\'"Names":"\'}; n=${n%%\'"\'*}; '
        'r="$r$n$N";; esac;; esac'
    ),
)
# The PIDs of a container's `top` (first column), added to `$t`.
_TOP_PIDS = _LINES.format(text="$o", body="IFS=' '; set -- $l; t=\"$t $1 \"; IFS=$N")
# Whether `nvidia-smi` listed a process no container's `top` holds (u=1): only such a process is
# judged (foreign), and only once seen in a second read too.
_UNATTRIBUTED = "u=0; " + _LINES.format(
    text="$a",
    body='IFS=\', \'; set -- $l; IFS=$N; case "$t" in *" $1 "*) ;; *) [ -n "$1" ] && u=1;; esac',
)


def fact_script(
    cluster: ClusterSpec,
    host: HostSpec,
    tool_timeout: float,
    ray_status: bool = False,
    read_ray: bool = True,
    prepare: bool = False,
) -> Remote:
    """One batched script per host per cycle: every fact in sections (core.parsers.parse_sections).

    On the head, `ray status` runs only when the node list fails, or with `ray_status` (while
    Ray settles: a node listed ALIVE is usable for placement only once `ray status` counts its
    GPU, a few seconds later). Without `read_ray`, no `ray` call at all (Ray's last reading is
    reused). With `prepare`, the head also reads the model directory (core.weights)."""
    t = tool_timeout

    def section(name: FactSection, argv: Sequence[str]) -> str:
        return shlex.join(["s", name, *timed(argv, t)])

    def capture(name: FactSection, argv: Sequence[str]) -> str:
        return shlex.join(["c", name, *timed(argv, t)])

    lines = [_SECTION_FUNCTION, _CAPTURE_FUNCTION]
    # bash's own clock (5.0 and later) spares a `date` process; `date` where it has none.
    now = section(FactSection.NOW, ["date", "+%s.%N"])
    lines.append(
        'if [ -n "$EPOCHREALTIME" ]; then '
        f"printf '@@sparkd {FactSection.NOW}\\n%s\\n@@sparkd-end {FactSection.NOW} 0\\n' "
        '"$EPOCHREALTIME"; '
        f"else {now}; fi"
    )
    lines.append(section(FactSection.BOOT_ID, ["cat", "/proc/sys/kernel/random/boot_id"]))
    if cluster.cleanup.units:
        lines.append(
            section(
                FactSection.UNITS,
                ["systemctl", "show", "-p", UNIT_PROPERTIES, "--", *cluster.cleanup.units],
            )
        )
    # A hung Docker daemon would cost every later `docker` call its whole tool timeout and the
    # script its SSH timeout (the host would read as unreachable): once `docker ps` timed out
    # (d=124), no other `docker` call is made; the host still reports everything else.
    lines.append(
        capture(
            FactSection.CONTAINERS, ["docker", "ps", "-a", "--no-trunc", "--format", "{{json .}}"]
        )
        + "; d=$rc; k=$o"
    )

    def docker(line: str) -> str:
        return f'if [ "$d" != 124 ]; then {line}; fi'

    lines.append(
        docker(
            section(
                FactSection.IMAGE,
                ["docker", "image", "inspect", "--format", "{{.Id}}", cluster.ray.image],
            )
        )
    )
    lines.append(capture(FactSection.GPU_APPS, GPU_APPS) + "; g=$rc; a=$o")
    # The running containers' names are a section too, so a failed listing is seen as such
    # rather than as "no processes in any container"; each named one then gets its `top`,
    # whose PIDs (in `$t`) tell which GPU processes are the containers'.
    top = shlex.join(timed(["docker", "top"], t))
    top_name = top_section("$n")
    lines.append(
        docker(
            f"{_RUNNING_NAMES}; printf '@@sparkd {FactSection.RUNNING}\\n%s\\n"
            f"@@sparkd-end {FactSection.RUNNING} %s\\n' "
            '"$r" "$d"; t=; '
            f'if [ "$d" = 0 ]; then for n in $r; do c "{top_name}" {top} "$n" -eo {TOP_FORMAT}; '
            f'if [ "$rc" = 0 ]; then {_TOP_PIDS}; fi; done; fi'
        )
    )
    # Asked again after the `top`s (unless it failed the first time) when it listed a process
    # no container holds: only a process seen both times is judged, so one that started or
    # ended in between is never taken for foreign.
    lines.append(
        f'if [ "$g" = 0 ]; then {_UNATTRIBUTED}; '
        f'if [ "$u" = 1 ]; then {section(FactSection.GPU_APPS_AFTER, GPU_APPS)}; fi; fi'
    )
    # The image sparkd's container runs, by ID: a re-pulled tag is a new image.
    lines.append(
        docker(
            section(
                FactSection.OURS_IMAGE,
                [
                    "docker",
                    "inspect",
                    "--format",
                    "{{.Name}} {{.Image}}",
                    "--",
                    container_name(cluster, host),
                ],
            )
        )
    )
    lines.append(section(FactSection.IFACE, ["ip", "-j", "addr", "show", "dev", host.interface]))
    # The compile cache's file system in the same call (a missing cache directory, before the
    # first container with its mount, leaves log_dir's row: core.parsers.parse_df_paths).
    cache_root = str(cluster.model.cache_root)
    disk = ["df", "-B1", "--output=avail", str(cluster.model.log_dir), cache_root]
    lines.append(section(FactSection.DISK, disk))
    lines.append(section(FactSection.CACHE, ["find", cache_root, *CACHE_LISTING]))
    # Docker's own file system too: a full one fails `docker run` and `docker exec`.
    lines.append(section(FactSection.DOCKER_DISK, ["df", "-B1", "--output=avail", DOCKER_ROOT]))
    # This boot's kernel log, the last lines only: the text is the same every cycle (so the
    # forced command can list it), and what is new is told apart by the kernel's timestamps.
    lines.append(section(FactSection.KERNEL, KERNEL_LOG))
    lines.append(section(FactSection.MEMINFO, ["cat", MEMINFO_PATH]))
    lines.append(fabric_section(host, t))
    head = container_name(cluster, host)
    if host.role == "head" and read_ray:
        ray_lines: list[str] = []
        if cluster.ray.dashboard:
            ray_lines.append(
                # The filter applies before Ray's default limit of 100 rows (ALIVE and DEAD
                # together, sorted by id), which otherwise silently drops ALIVE nodes once
                # restarts have left enough DEAD records.
                section(
                    FactSection.RAY_NODES,
                    [
                        "docker",
                        "exec",
                        head,
                        "ray",
                        "list",
                        "nodes",
                        "--format=json",
                        "--filter",
                        "state=ALIVE",
                    ],
                )
            )
        # Each `ray` call costs the head 0.6-3 s of a core: `ray status` only when the node
        # list could not be had (no dashboard, or it failed).
        status = _ray_status_section(cluster, t)
        if cluster.ray.dashboard and not ray_status:
            ray_lines.append(f'if [ "$rc" != 0 ]; then {status}; fi')
        else:
            ray_lines.append(status)
        lines.append(docker("; ".join(ray_lines)))
    if host.role == "head":
        lines.append(section(FactSection.SERVE_SPEC, ["cat", serve_spec_path(cluster)]))
        lines.append(
            section(
                FactSection.SERVE_LOG, ["tail", "-c", str(LOG_TAIL_BYTES), serve_log_path(cluster)]
            )
        )
        lines.append(
            section(FactSection.SERVE_LOG_MTIME, ["stat", "-c", "%y", serve_log_path(cluster)])
        )
    directory = weights.host_path(cluster)
    if host.role == "head" and prepare and directory is not None:
        lines += model_files_sections(directory, t)
    return Remote("facts", "\n".join(lines) + "\n", mutating=False)


def _ray_status_section(cluster: ClusterSpec, seconds: float) -> str:
    head = container_name(cluster, cluster.head)
    argv = ["docker", "exec", head, "ray", "status"]
    return shlex.join(["s", FactSection.RAY_STATUS, *timed(argv, seconds)])


def ray_cli(cluster: ClusterSpec, tool_timeout: float) -> Remote:
    """`ray status` alone, in a section, for when the head's dashboard did not answer (then
    `ray list nodes`, a client of the same dashboard, cannot answer either): Ray read from its
    GCS, without node IPs."""
    text = f"{_SECTION_FUNCTION}\n{_ray_status_section(cluster, tool_timeout)}\n"
    return Remote("ray_cli", text, mutating=False)


# -- write path ----------------------------------------------------------------------------


def stop_unit(cluster: ClusterSpec, unit: str, seconds: float) -> Remote:
    stop = _line(_sudo(cluster, ["systemctl", "stop", "--", unit]), seconds)
    disable = _line(_sudo(cluster, ["systemctl", "disable", "--", unit]), seconds)
    return Remote("stop_unit", f"{stop} && {disable}", mutating=True)


def remove_container(name: str, seconds: float) -> Remote:
    return Remote("remove_container", _line(["docker", "rm", "-f", "--", name], seconds), True)


def ray_command(cluster: ClusterSpec, host: HostSpec) -> list[str]:
    ray = cluster.ray
    if host.role == "head":
        argv = [
            "ray", "start", "--block", "--head",
            f"--node-ip-address={host.ip}", f"--port={ray.port}",
        ]  # fmt: skip
        if ray.dashboard:
            argv.append("--dashboard-host=127.0.0.1")
            if ray.dashboard_port != DEFAULT_DASHBOARD_PORT:
                argv.append(f"--dashboard-port={ray.dashboard_port}")
        else:
            argv.append("--include-dashboard=false")
        return argv
    return [
        "ray", "start", "--block",
        f"--address={cluster.head.ip}:{ray.port}", f"--node-ip-address={host.ip}",
    ]  # fmt: skip


def docker_run_argv(cluster: ClusterSpec, host: HostSpec) -> list[str]:
    """Like vLLM's run_cluster.sh and NVIDIA's Spark playbook, plus sparkd's labels."""
    ray = cluster.ray
    argv = ["docker", "run", "-d", "--name", container_name(cluster, host)]
    argv += ["--label", f"{LABEL_CLUSTER}={cluster.name}"]
    argv += ["--label", f"{LABEL_ROLE}={host.role}"]
    argv += ["--label", f"{LABEL_SPEC}={ray_spec_hash(cluster, host)}"]
    for key, value in sorted(ray.env.items()):
        argv += ["-e", f"{key}={value}"]
    # Per node, as vLLM's multi-node launcher sets it: without it vLLM binds its placement
    # group to the address of the default route (the management network), unknown to Ray.
    argv += ["-e", f"VLLM_HOST_IP={host.ip}"]
    for mount in ray.mounts:
        argv += ["-v", mount]
    if host.role == "head":
        log_dir = str(cluster.model.log_dir)
        argv += ["-v", f"{log_dir}:{log_dir}"]
    # Not part of the spec hash: containers made before the mount existed are not drift; it
    # takes effect when a container is next created for another reason.
    cache_root = str(cluster.model.cache_root)
    argv += ["-v", f"{cache_root}:{cache_root}"]
    argv += ["--network", "host", "--gpus", "all", "--shm-size", ray.shm_size]
    argv += ["--restart=no", "--pull=never", *ray.extra_docker_args, ray.image]
    return argv + ray_command(cluster, host)


def own_dir(path: str, seconds: float) -> str:
    """`path` as a 0700 directory of the SSH user's own, created if missing; a symlink or a
    directory of another user's fails: whoever can write there can plant a symlink that
    receives the API key."""
    d = shlex.quote(path)
    refuse = shlex.quote(f"sparkd: {path} is a symlink or not the SSH user's own directory")
    return (
        f"{_line(['mkdir', '-p', '-m', '700', '--', path], seconds)} && "
        f"{{ {{ [ ! -L {d} ] && [ -O {d} ]; }} || {{ echo {refuse} >&2; false; }}; }} && "
        f"{_line(['chmod', '700', '--', path], seconds)}"
    )


def _write_new(target: Path, producer: str, seconds: float) -> str:
    """`producer`'s output into `target` without following a symlink there: a fresh 0600 file
    beside it (mktemp), renamed over whatever `target` was."""
    temp = _line(["mktemp", str(target.parent / f".{target.name}.XXXXXX")], seconds)
    move = shlex.join(timed(["mv", "-fT", "--", "$t", str(target)], seconds))
    remove = shlex.join(timed(["rm", "-f", "--", "$t"], seconds))
    # "$t" is the temporary file's name: quoted for the shell, not as the literal text.
    move, remove = (text.replace("'$t'", '"$t"') for text in (move, remove))
    return f't="$({temp})" && {{ {{ {producer} > "$t" && {move}; }} || {{ {remove}; false; }}; }}'


def start_ray(cluster: ClusterSpec, host: HostSpec, seconds: float) -> Remote:
    """Start the node's container; a container holding the name (exited or not) goes first."""
    name = container_name(cluster, host)
    remove = _line(["docker", "rm", "-f", "--", name], seconds)
    run = _line(docker_run_argv(cluster, host), seconds)
    prepare = ""
    if host.role == "head":
        prepare = own_dir(str(cluster.model.log_dir), seconds) + " && "
    # Made by the SSH user before `docker run` would make it root's.
    prepare += own_dir(str(cluster.model.cache_root), seconds) + " && "
    return Remote("start_ray", f"{prepare}{{ {remove} >/dev/null 2>&1; {run}; }}", mutating=True)


def serve_argv(cluster: ClusterSpec) -> list[str]:
    model = cluster.model
    return [
        "vllm", "serve", model.id,
        "--port", str(model.port),
        "--tensor-parallel-size", str(model.tensor_parallel_size),
        "--pipeline-parallel-size", str(model.pipeline_parallel_size),
        "--distributed-executor-backend", "ray",
        *model.extra_args,
    ]  # fmt: skip


def serve_shell(cluster: ClusterSpec) -> str:
    """The inner `sh -c` text: exec so the serve process replaces the shell (docker top shows
    it, signals reach it), output appended to the bind-mounted log. The API key is read from a
    0600 file inside the shell, so it never appears on any command line."""
    text = f"exec {shlex.join(serve_argv(cluster))} >>{shlex.quote(serve_log_path(cluster))} 2>&1"
    if cluster.model.api_key_file is not None:
        key = shlex.quote(str(cluster.model.log_dir / API_KEY_FILE))
        text = f'VLLM_API_KEY="$(cat {key})"; export VLLM_API_KEY; {text}'
    # The PID as the container sees it: stopping the model then needs only `docker exec`,
    # not root on the host.
    return f"echo $$ > {shlex.quote(serve_pid_path(cluster))}; {text}"


def signal_serve(cluster: ClusterSpec, signal: str, seconds: float) -> Remote:
    """Signal `vllm serve` inside the head container by its recorded PID, after checking the
    PID still is a vLLM process (a stale file must never hit a reused PID)."""
    pidfile = shlex.quote(serve_pid_path(cluster))
    inner = (
        f'p="$(cat {pidfile} 2>/dev/null)"; [ -n "$p" ] && '
        f'grep -q vllm "/proc/$p/cmdline" 2>/dev/null && kill -{signal} "$p"'
    )
    head = container_name(cluster, cluster.head)
    return Remote("signal_serve", _line(["docker", "exec", head, "sh", "-c", inner], seconds), True)


def start_model(cluster: ClusterSpec, seconds: float, api_key: str | None = None) -> Remote:
    """Record the spec hash beside the log, store the API key (from stdin), launch detached."""
    log_dir = str(cluster.model.log_dir)
    spec = serve_spec_path(cluster)
    head = container_name(cluster, cluster.head)
    key = key_fingerprint(api_key) if api_key is not None else None
    spec_hash = shlex.quote(model_spec_hash(cluster, key))
    log = shlex.quote(serve_log_path(cluster))
    not_linked = shlex.quote(f"sparkd: {serve_log_path(cluster)} is a symlink")
    steps = [
        own_dir(log_dir, seconds),
        _write_new(Path(spec), f"printf '%s\\n' {spec_hash}", seconds),
        f"{{ [ ! -L {log} ] || {{ echo {not_linked} >&2; false; }}; }}",
        f"printf '%s %s ===\\n' {shlex.quote(LAUNCH_MARKER)} {spec_hash} >> {log}",
    ]
    if api_key is not None:
        target = cluster.model.log_dir / API_KEY_FILE
        steps.append(_write_new(target, shlex.join(timed(["cat"], seconds)), seconds))
    # The cache entry is named on the host from the image the head container runs (as
    # core.cache.cache_key names it): the text stays the same whatever the image.
    inspect = ["docker", "inspect", "--format", "{{.Image}}", "--", head]
    digits = f"%.{SHORT_ID_DIGITS}s"
    steps.append(f'i="$({_line(inspect, seconds)})" && k="$(printf {digits} "${{i#sha256:}}")"')
    steps.append('case "$k" in *[!0-9a-f]*|"") false ;; esac')
    root = cluster.model.cache_root
    env = f"VLLM_CACHE_ROOT={root}/{CACHE_STAND_IN}-{cache.model_slug(cluster.model.id)}"
    exec_argv = ["docker", "exec", "-d", "-e", env, head, "sh", "-c", serve_shell(cluster)]
    launch = _line(exec_argv, seconds)
    quoted = shlex.quote(env)
    left, right = (shlex.quote(part) for part in env.split(CACHE_STAND_IN))
    steps.append(launch.replace(quoted, f'{left}"$k"{right}'))
    return Remote("start_model", " && ".join(steps), mutating=True, stdin=api_key)


def prune_cache(cluster: ClusterSpec, host: HostSpec, entry: str, seconds: float) -> Remote:
    """Remove one compile cache entry (core.cache.judge_cache decides which); gone already is
    done. Inside the host's Ray container, which mounts the cache at the same path: vLLM
    writes the entry as the container's root, so the SSH user could not remove it."""
    if not cache.ENTRY.fullmatch(entry):
        raise ValueError(f"not a cache entry of sparkd's naming: {entry!r}")
    target = str(cluster.model.cache_root / entry)
    argv = ["docker", "exec", container_name(cluster, host), "rm", "-rf", "--", target]
    return Remote("prune_cache", _line(argv, seconds), mutating=True)


def model_files_sections(directory: str, seconds: float) -> list[str]:
    """Cheap `stat`s of the model's files (the weight files by the host's glob, the directory
    quoted), and the index's first bytes for the ops box to parse (core.weights)."""
    base = shlex.quote(directory.rstrip("/") or "/")
    stat = shlex.join(
        ["s", FactSection.MODEL_FILES, *timed(["stat", "-L", "-c", "%s %n", "--"], seconds)]
    )
    named = " ".join(f"{base}/{name}" for name in (weights.CONFIG, weights.INDEX))
    index = str(Path(directory) / weights.INDEX)
    reduce = ["python3", "-I", "-c", REDUCE_INDEX, index, str(weights.INDEX_LIMIT)]
    reduce.append(str(weights.REDUCED_LIMIT))
    return [
        f"{stat} {named} {base}/*.safetensors",
        shlex.join(["s", FactSection.MODEL_INDEX, *timed(reduce, seconds)]),
    ]


# The host reduces the index to what the ops box checks (metadata and one weight_map entry per
# file): a big MoE checkpoint's index is megabytes of tensor names, more than the fact script's
# output may hold (shell.ssh.MAX_OUTPUT). Python 3 is on every host (the forced command is one).
# What it cannot reduce within the bounds it names after `!` (core.weights.with_index).
REDUCE_INDEX = """import json, sys
path, limit, most = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    with open(path, 'rb') as f:
        raw = f.read(limit + 1)
except OSError as e:
    sys.exit(print('!could not be read (%s)' % e.strerror))
if len(raw) > limit:
    sys.exit(print('!is larger than %d bytes' % limit))
try:
    data = json.loads(raw)
except ValueError as e:
    sys.exit(print('!is not JSON (%s)' % e))
if isinstance(data, dict):
    data = {k: data[k] for k in ('metadata', 'weight_map') if k in data}
    w = data.get('weight_map')
    if isinstance(w, dict):
        data['weight_map'] = {json.dumps(v): v for v in w.values()}
out = json.dumps(data)
print(out if len(out) <= most else '!is more than %d bytes once reduced' % most)
"""


KERNEL_LOG = (
    "journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager",
    "-n", str(kernel.TAIL_LINES),
)  # fmt: skip
MEMINFO_PATH = "/proc/meminfo"

FABRIC_FILES = (
    "mtu",
    "carrier_changes",
    "device/infiniband/*/ports/*/state",
    "device/infiniband/*/ports/*/phys_state",
    "device/infiniband/*/ports/*/rate",
    "device/infiniband/*/ports/*/gids/*",
    "device/infiniband/*/ports/*/gid_attrs/types/*",
)


def fabric_section(host: HostSpec, seconds: float) -> str:
    """The data interface's sysfs files, globs left to the host's shell (the RDMA device and
    its GID rows are found there); the interface's name is quoted."""
    base = shlex.quote(f"/sys/class/net/{host.interface}")
    paths = " ".join(f"{base}/{name}" for name in FABRIC_FILES)
    grep = shlex.join(["s", FactSection.FABRIC, *timed(["grep", "-s", "-H", "."], seconds)])
    return f"{grep} {paths}"


GPU_APPS = (
    "nvidia-smi",
    "--query-compute-apps=pid,process_name,used_memory",
    "--format=csv,noheader,nounits",
)


# What makes sparkd look again at once: a container (or the serve process, run under
# `docker exec`) ending or starting.
EVENT_ACTIONS = ("die", "stop", "kill", "oom", "start", "exec_start", "exec_die")


def docker_events(seconds: float) -> Remote:
    """The host's container events as JSON lines, for `seconds` (then watched anew)."""
    argv = ["docker", "events", "--format", "{{json .}}", "--filter", "type=container"]
    for action in EVENT_ACTIONS:
        argv += ["--filter", f"event={action}"]
    return Remote("docker_events", _line(argv, seconds), mutating=False)


def gpu_apps(seconds: float) -> Remote:
    return Remote("gpu_apps", _line(GPU_APPS, seconds), mutating=False)


def kill_process(cluster: ClusterSpec, pid: int, signal: str, seconds: float) -> Remote:
    if not parsers.is_pid(pid):
        raise ValueError(f"not a PID sparkd signals: {pid}")
    # Through sudo or env, the kill program runs (real, or the simulator's), never the builtin.
    if cluster.ssh.sudo:
        argv = ["sudo", "-n", "kill", f"-{signal}", str(pid)]
    else:
        argv = ["env", "kill", f"-{signal}", str(pid)]
    return Remote("kill_process", _line(argv, seconds), mutating=True)


def serve_processes(cluster: ClusterSpec, seconds: float) -> Remote:
    head = container_name(cluster, cluster.head)
    return Remote(
        "serve_processes", _line(["docker", "top", head, "-eo", TOP_FORMAT], seconds), False
    )


def inspect_container(name: str, seconds: float) -> Remote:
    template = '{{.State.Running}} {{index .Config.Labels "' + LABEL_SPEC + '"}}'
    argv = ["docker", "inspect", "--format", template, "--", name]
    return Remote("inspect_container", _line(argv, seconds), mutating=False)


def read_serve_spec(cluster: ClusterSpec, seconds: float) -> Remote:
    return Remote("read_serve_spec", _line(["cat", serve_spec_path(cluster)], seconds), False)


# Where sudo finds the tools `sudo -n` runs (Ubuntu's merged /usr, DGX OS included).
SUDO_PATHS = {"systemctl": "/usr/bin/systemctl", "kill": "/usr/bin/kill"}
# A PID sparkd may signal, as a POSIX extended and a Python regular expression: decimal with no
# leading zero, never 0 or 1, at most 7 digits. procps `kill` reads a longer number modulo 2^32
# (4294967295 is -1, every process; 4294967297 is PID 1); 7 digits hold every PID the kernel
# gives (below pid_max, at most 2^22) and none of those.
PID_DIGITS = "[2-9]|[1-9][0-9]{1,6}"
# sudoers (1.9.10 and later) matches arguments by a regular expression between ^ and $: a
# signal sparkd sends, and one PID as above. Which PIDs are GPU compute processes sudo cannot
# know: sparkd checks that against `nvidia-smi` itself.
SUDOERS_KILL = f"^-(TERM|KILL) ({PID_DIGITS})$"


def sudoers_rules(cluster: ClusterSpec) -> tuple[list[str], list[str]]:
    """The sudoers commands for exactly the `sudo -n` shapes above, and the units sudoers
    cannot express exactly (a backslash, from systemd's escaping, is not matched literally)."""
    rules: list[str] = []
    refused: list[str] = []
    systemctl = SUDO_PATHS["systemctl"]
    for unit in cluster.cleanup.units:
        if "\\" in unit:
            refused.append(unit)
            continue
        escaped = re.sub(r"([,:=!()\s])", r"\\\1", unit)
        rules += [f"{systemctl} stop -- {escaped}", f"{systemctl} disable -- {escaped}"]
    rules.append(f"{SUDO_PATHS['kill']} {SUDOERS_KILL}")
    return rules, refused


def fact_scripts(cluster: ClusterSpec, host: HostSpec) -> list[Remote]:
    """Every variant of the fact script observing may send `host`: with and without `ray
    status`, and with Ray's last reading reused (no `ray` call); with the dashboard, the script
    without `ray` and the head's `ray status` alone (`ray_cli`). One text each."""
    t = tool_timeout(cluster)
    # With the dashboard, Ray is read over HTTP, and through `ray status` when it is silent.
    reads = (False,) if cluster.ray.dashboard else (True, False)
    scripts = [
        fact_script(cluster, host, t, ray_status, read_ray, prepare)
        for prepare in (False, True)
        for read_ray in reads
        for ray_status in (False, True)
    ]
    if cluster.ray.dashboard and host.role == "head":
        scripts.append(ray_cli(cluster, t))
    return list({script.command: script for script in scripts}.values())


def catalogue(cluster: ClusterSpec, seconds: float) -> list[tuple[HostSpec, Remote]]:
    """Every command sparkd may run against this cluster, for `sparkd commands`: the actions'
    commands with `seconds`, the fact script as observing runs it (`tool_timeout`)."""
    entries: list[tuple[HostSpec, Remote]] = []
    head = cluster.head
    for host in cluster.hosts:
        entries += [(host, script) for script in fact_scripts(cluster, host)]
        for unit in cluster.cleanup.units:
            entries.append((host, stop_unit(cluster, unit, seconds)))
        for pattern in cluster.cleanup.container_patterns:
            entries.append((host, remove_container(pattern, seconds)))
        entries.append((host, start_ray(cluster, host, seconds)))
        entries.append((host, gpu_apps(seconds)))
        entries.append((host, docker_events(EVENTS_SPAN)))
        entries.append((host, kill_process(cluster, 12345, "TERM", seconds)))
    api_key = "<from api_key_file>" if cluster.model.api_key_file is not None else None
    entries.append((head, start_model(cluster, seconds, api_key)))
    entries.append((head, serve_processes(cluster, seconds)))
    entries.append((head, signal_serve(cluster, "TERM", seconds)))
    entries.append((head, read_serve_spec(cluster, seconds)))
    for host in cluster.hosts:
        entries.append((host, prune_cache(cluster, host, CACHE_ENTRY_EXAMPLE, seconds)))
    for host in cluster.hosts:
        entries.append((host, inspect_container(container_name(cluster, host), seconds)))
    return entries


# -- host-side fencing (HA) ----------------------------------------------------------------

# The owner of a cluster (HA) is the only one whose commands a host runs: each mutating command
# carries the owner key's create revision (the token), and the host compares-and-sets it under
# `flock` in the same SSH command. The forced-command wrapper recognises this exact text and
# does the same in Python (forced.FENCE_BODY); the two share the file layout.
FENCE_DIR = ".local/state/sparkd/fence"
FENCE_MARKER = "sparkd fence:"
# One shell function, the same text in every fenced command (the wrapper matches it exactly).
# $1 cluster, $2 token, $3 etcd cluster id, $4 instance, $5 seconds to wait for the lock,
# $6 `refence` to take over a file naming another etcd. It opens the lock on fd 9, which the
# command then runs without (`9>&-`): the shell keeps the lock until the command ends, and a
# detached child (`setsid`, `nohup`, `docker exec -d`) never inherits it.
FENCE_FUNCTION = (
    "sparkd_fence() { "
    f'd="$HOME/{FENCE_DIR}"; f="$d/$1"; '
    'mkdir -p -m 700 -- "$d" && exec 9>>"$f.lock" || '
    f'{{ echo "{FENCE_MARKER} $1: cannot open $f.lock" >&2; return {FENCE_MISMATCH_EXIT}; }}; '
    f'flock -w "$5" 9 || {{ echo "{FENCE_MARKER} $1: lock busy for $5s" >&2; '
    f"return {FENCE_BUSY_EXIT}; }}; "
    'if [ -e "$f" ]; then '
    's=""; c=""; i=""; read -r s c i < "$f"; '
    'case "$s" in ""|*[!0-9]*) '
    f'if [ "$6" != refence ]; then echo "{FENCE_MARKER} $1: unreadable $f: '
    f'run sparkd ha refence $1" >&2; return {FENCE_MISMATCH_EXIT}; fi; s=0; c="$3";; esac; '
    'if [ "$c" != "$3" ] && [ "$6" != refence ]; then '
    f'echo "{FENCE_MARKER} $1: token from etcd cluster $c, this is $3: '
    f'run sparkd ha refence $1" >&2; return {FENCE_MISMATCH_EXIT}; fi; '
    'if [ "$c" = "$3" ] && [ "$s" -gt "$2" ]; then '
    f'echo "{FENCE_MARKER} $1: refused token $2 < $s ($i)" >&2; return {FENCED_EXIT}; fi; '
    'if [ "$s" = "$2" ] && [ "$c" = "$3" ]; then return 0; fi; '
    "fi; "
    'printf \'%s %s %s\\n\' "$2" "$3" "$4" > "$d/.$1.new" && sync -- "$d/.$1.new" && '
    'mv -f -- "$d/.$1.new" "$f" || '
    f'{{ echo "{FENCE_MARKER} $1: cannot write $f" >&2; return {FENCE_MISMATCH_EXIT}; }}; '
    "}"
)


@dataclass(frozen=True)
class FenceToken:
    """What a fenced command carries: the owner key's create revision in one etcd cluster."""

    cluster: str
    token: int
    etcd_cluster: int
    instance: str

    def __post_init__(self) -> None:
        if self.token <= 0 or self.etcd_cluster < 0:
            raise ValueError(f"not a fencing token: {self.token} in {self.etcd_cluster}")


def fence_prefix(fence: FenceToken, seconds: float, refence: bool = False) -> str:
    args = [fence.cluster, str(fence.token), str(fence.etcd_cluster), fence.instance]
    args.append(str(max(1, math.ceil(seconds))))
    if refence:
        args.append("refence")
    return f"{FENCE_FUNCTION}; {shlex.join(['sparkd_fence', *args])} && {{ "


def fenced(remote: Remote, fence: FenceToken, seconds: float) -> Remote:
    """`remote` run only if `fence` is not older than the host's record for its cluster, and
    with the host's lock held until it ends (a takeover's sweep waits for it)."""
    if not remote.mutating:
        raise ValueError(f"{remote.name} changes nothing: it is never fenced")
    command = f"{fence_prefix(fence, seconds)}{remote.command}\n}} 9>&-"
    return Remote(remote.name, command, mutating=True, stdin=remote.stdin)


def fence_sweep(fence: FenceToken, seconds: float, refence: bool = False) -> Remote:
    """The no-op a new owner runs on every host first: it waits behind a former owner's command
    still running there, then records the new token so any later one of the old is refused."""
    name = "refence" if refence else "fence"
    return Remote(name, f"{fence_prefix(fence, seconds, refence)}true\n}} 9>&-", mutating=True)


def audited(remote: Remote, fence: FenceToken) -> Remote:
    """`[ha] host_fencing = false`: the owner and token named on the command, nothing checked
    (for tests and diagnosis: a stale owner's command then runs)."""
    tag = shlex.join([":", "sparkd-unfenced", fence.cluster, str(fence.token), fence.instance])
    return Remote(remote.name, f"{tag}; {remote.command}", mutating=True, stdin=remote.stdin)

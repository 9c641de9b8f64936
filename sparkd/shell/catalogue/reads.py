"""The commands that change nothing: the fact script (one per host per cycle, in sections that
core.reading.assemble reads) and the other reads."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlencode

from sparkd.core.reading import kernel, parsers, ray_json, weight_files
from sparkd.core.spec import (
    LABEL_SPEC,
    container_name,
    serve_log_path,
    serve_spec_path,
)
from sparkd.model.cluster import ClusterSpec
from sparkd.model.exits import (
    DASHBOARD_FAILED_EXIT,
    DASHBOARD_REFUSED_EXIT,
    DASHBOARD_TOO_LARGE_EXIT,
)
from sparkd.model.hca import parse_hca
from sparkd.model.sections import FactSection, peer_section, top_section
from sparkd.model.spec import HostSpec
from sparkd.shell.catalogue.remote import Remote, cmd, timed, tool_timeout

# A `docker events` stream is renewed this often, so no remote process outlives sparkd by more.
EVENTS_SPAN = 3600.0
UNIT_PROPERTIES = "Id,LoadState,ActiveState,SubState,UnitFileState"
TOP_FORMAT = "pid,etimes,times,args"
LOG_TAIL_BYTES = parsers.LOG_TAIL_CHARS
# Docker's default data root (`data-root` in daemon.json moves it; then the read is unknown).
DOCKER_ROOT = "/var/lib/docker"
# The cache root's entries: modification time and name (core.reading.cache_entries.parse_listing).
CACHE_LISTING = ("-mindepth", "1", "-maxdepth", "1", "-printf", "%T@ %f\\n")


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
# `docker ps` prints each container as `STATE NAMES {json}`: the state and names from the template's
# own fields (Docker's names hold no space, its states none either), so the shell reads them as
# words, whatever spacing the CLI's JSON may come to have; core.reading.parsers reads the JSON.
# `--size=false` given explicitly: a template touching `.Size` (as `{{json .}}` does) makes the CLI
# ask the daemon for every container's size unless `--size` was set either way (docker/cli v29.7.2
# cli/command/container/list.go: `sizeChanged`), and that walk of every writable layer took
# 6.5-8.6 s for one container of 150,000 files (tests/fixtures/docker-real/size.jsonl).
PS_FORMAT = "{{.State}} {{.Names}} {{json .}}"
CONTAINER_LIST = ("docker", "ps", "-a", "--no-trunc", "--size=false", "--format", PS_FORMAT)
# Lines of a container's own output read when it has exited (core.reading.assemble takes the last).
EXIT_LOG_LINES = 5


def _running_names(own: str) -> str:
    """The running containers' names (what `docker ps` lists: the states where Docker counts a
    container running), one a line in `$r`, from the listing's first two words; the first name
    only (`--no-trunc` adds a legacy link's names after a comma). `$e` is the state of `own`."""
    body = (
        "IFS=' '; set -- $l; IFS=$N; "
        "case $2 in ''|'{'*) ;; *) n=${2%%,*}; "
        f"case $n in {shlex.quote(own)}) e=$1;; esac; "
        'case $1 in running|restarting|paused) r="$r$n$N";; esac;; esac'
    )
    return "r=; e=; " + _LINES.format(text="$k", body=body)


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
    """One batched script per host per cycle: every fact in sections
    (core.reading.parsers.parse_sections).

    On the head, `ray status` runs only when the node list fails, or with `ray_status` (while
    Ray settles: a node listed ALIVE is usable for placement only once `ray status` counts its
    GPU, a few seconds later). Without `read_ray`, no `ray` call at all (Ray's last reading is
    reused). With `prepare`, the head also reads the model directory (core.reading.weight_files)."""
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
    lines.append(capture(FactSection.CONTAINERS, CONTAINER_LIST) + "; d=$rc; k=$o")

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
    own = container_name(cluster, host)
    top = shlex.join(timed(["docker", "top"], t))
    top_name = top_section("$n")
    lines.append(
        docker(
            f"{_running_names(own)}; printf '@@sparkd {FactSection.RUNNING}\\n%s\\n"
            f"@@sparkd-end {FactSection.RUNNING} %s\\n' "
            '"$r" "$d"; t=; '
            f'if [ "$d" = 0 ]; then for n in $r; do c "{top_name}" {top} "$n" -eo {TOP_FORMAT}; '
            f'if [ "$rc" = 0 ]; then {_TOP_PIDS}; fi; done; fi'
        )
    )
    # First contact (core.judging.adopt): while sparkd's own Ray container does not run, the running
    # containers' image, env and command, so a deployment made by hand is recognised before
    # anything is started beside it. No running container: an empty section, read as none.
    foreign = shlex.join(
        [
            "s",
            FactSection.FOREIGN,
            *timed(["docker", "inspect", "--format", parsers.FOREIGN_FORMAT], t),
        ]
    )
    empty = f"printf '@@sparkd {FactSection.FOREIGN}\\n\\n@@sparkd-end {FactSection.FOREIGN} 0\\n'"
    lines.append(
        docker(
            f'if [ "$d" = 0 ] && [ "$e" != running ]; then '
            f'if [ -n "$r" ]; then set -f; {foreign} -- $r; set +f; else {empty}; fi; fi'
        )
    )
    # sparkd's own container, exited: its last lines say why (an image without `ray` exits 127
    # at once, `ray: not found`), so the restart that follows is not blind (core.judging.ray_stage).
    exit_log = ["docker", "logs", "--tail", str(EXIT_LOG_LINES), "--", own]
    lines.append(
        docker(f'if [ "$e" = exited ]; then {section(FactSection.EXIT_LOG, exit_log)}; fi')
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
    # first container with its mount, leaves log_dir's row: core.reading.parsers.parse_df_paths).
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
    lines.append(fabric_section(host, t, rails=rail_globs(cluster)))
    # Every other host's data IP, one echo over the data link: a host silent to the ops box
    # that another host still reaches has a kernel that answers (core.deciding.gate `peer_view`).
    for peer in cluster.hosts:
        if peer.name != host.name:
            argv = timed([*PING, peer.data_ip], t)
            lines.append(shlex.join(["s", peer_section(peer.data_ip), *argv]))
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
    directory = weight_files.host_path(cluster)
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


def model_files_sections(directory: str, seconds: float) -> list[str]:
    """Cheap `stat`s of the model's files (the weight files by the host's glob, the directory
    quoted), and the index's first bytes for the ops box to parse (core.reading.weight_files)."""
    base = shlex.quote(directory.rstrip("/") or "/")
    stat = shlex.join(
        ["s", FactSection.MODEL_FILES, *timed(["stat", "-L", "-c", "%s %n", "--"], seconds)]
    )
    named = " ".join(f"{base}/{name}" for name in (weight_files.CONFIG, weight_files.INDEX))
    index = str(Path(directory) / weight_files.INDEX)
    reduce = ["python3", "-I", "-c", REDUCE_INDEX, index, str(weight_files.INDEX_LIMIT)]
    reduce.append(str(weight_files.REDUCED_LIMIT))
    return [
        f"{stat} {named} {base}/*.safetensors",
        shlex.join(["s", FactSection.MODEL_INDEX, *timed(reduce, seconds)]),
    ]


# The host reduces the index to what the ops box checks (metadata and one weight_map entry per
# file): a big MoE checkpoint's index is megabytes of tensor names, more than the fact script's
# output may hold (shell.ssh.MAX_OUTPUT). Python 3 is on every host (the forced command is one).
# What it cannot reduce within the bounds it names after `!` (core.reading.weight_files.with_index).
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


# Ray's dashboard, read on the head host's own loopback by an exec'd command rather than through
# a channel the key opens: a channel to the dashboard's port would also reach Ray's job API
# (`POST /api/jobs/` runs code as root in the head's container), the command reaches only the
# GETs below. `ray start --dashboard-host=127.0.0.1` binds it there (the containers share the
# host's network).
DASHBOARD_HOST = "127.0.0.1"
# The filter applies before the limit, as with `ray list nodes --filter state=ALIVE`: DEAD
# records (one per restart, for the life of the head) never push an ALIVE node out.
NODES_PATH = "/api/v0/nodes?" + urlencode(
    [
        ("limit", str(ray_json.NODES_LIMIT)),
        ("filter_keys", "state"),
        ("filter_predicates", "="),
        ("filter_values", "ALIVE"),
    ]
)
STATUS_PATH = "/api/cluster_status"
# The same status as text, as `ray status` prints it: under autoscaler v2 the only one there is.
FORMATTED_STATUS_PATH = "/api/cluster_status?format=1"
DASHBOARD_PATHS = (NODES_PATH, STATUS_PATH, FORMATTED_STATUS_PATH)
# A node list is a few kB; the cluster status grows with the nodes and resources.
DASHBOARD_MAX_ANSWER = 1 << 20
# Python 3's standard library, not curl: Python 3 is on every host already (the forced command
# is a Python 3 program, and the fact script's index reduction runs one), curl is not part of
# every Ubuntu install. `-I -S` and a bare socket (an HTTP/1.0 request, read to the server's
# close) keep its start to a few tens of ms: `http.client` alone doubles it. The method, the
# host and the answer's cap are the program's own; the path is one of DASHBOARD_PATHS (the
# forced command admits no other). Ray's token comes on stdin, never on a command line (an
# empty line: no token), and goes only into the `Authorization` header (Ray compares the whole
# value with `Bearer <token>`: ray 2.60 python/ray/dashboard/authentication_utils.py
# `validate_request_token`).
DASHBOARD_GET = f"""# sparkd: one GET from Ray's dashboard on this host's loopback
import socket, sys
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
limit, t = int(sys.argv[4]), float(sys.argv[5])
token = sys.stdin.readline(4096).strip()
if not token.isprintable():
    print('!token')
    sys.exit({DASHBOARD_FAILED_EXIT})
ask = 'GET %s HTTP/1.0\\r\\nHost: %s:%d\\r\\n' % (path, host, port)
if token:
    ask += 'Authorization: Bearer %s\\r\\n' % token
got = bytearray()
try:
    with socket.create_connection((host, port), timeout=t) as s:
        s.sendall((ask + '\\r\\n').encode())
        while len(got) <= limit + 65536:
            part = s.recv(65536)
            if not part:
                break
            got += part
except ConnectionRefusedError:
    sys.exit({DASHBOARD_REFUSED_EXIT})
except OSError as e:
    print('!' + type(e).__name__)
    sys.exit({DASHBOARD_FAILED_EXIT})
top, sep, body = bytes(got).partition(b'\\r\\n\\r\\n')
words = top.split(b'\\r\\n', 1)[0].split(b' ')
if not sep or len(words) < 2 or not words[1].isdigit():
    print('!not HTTP')
    sys.exit({DASHBOARD_FAILED_EXIT})
if len(body) > limit:
    sys.exit({DASHBOARD_TOO_LARGE_EXIT})
sys.stdout.buffer.write(b'HTTP ' + words[1] + b'\\n' + body)
"""


def dashboard_get(port: int, path: str, seconds: float, token: str | None = None) -> Remote:
    """One of the fixed GETs from the head's dashboard, on the head host's loopback, bounded by
    `seconds` (each socket operation and, under `timeout`, the whole). `token`, Ray's, goes on
    stdin: a line is always sent, since the program reads one."""
    if path not in DASHBOARD_PATHS:
        raise ValueError(f"not a dashboard read sparkd makes: {path!r}")
    argv = ["python3", "-I", "-S", "-c", DASHBOARD_GET, DASHBOARD_HOST, str(port), path]
    argv += [str(DASHBOARD_MAX_ANSWER), f"{max(1.0, seconds):g}"]
    return Remote("dashboard_get", cmd(argv, seconds), mutating=False, stdin=f"{token or ''}\n")


def dashboard_reads(cluster: ClusterSpec) -> list[Remote]:
    """Every dashboard read observing may send the head, as it sends them (`tool_timeout`)."""
    if not cluster.ray.dashboard:
        return []
    t = tool_timeout(cluster)
    return [dashboard_get(cluster.ray.dashboard_port, path, t) for path in DASHBOARD_PATHS]


KERNEL_LOG = (
    "journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager",
    "-n", str(kernel.TAIL_LINES),
)  # fmt: skip
MEMINFO_PATH = "/proc/meminfo"
# One echo request, its reply awaited 2 s, numeric, quiet. iputils ping(8): it exits 0 on a
# reply, 1 when no reply came within the deadline, 2 on any other error (unknown, not down).
PING = ("ping", "-c", "1", "-W", "2", "-n", "-q")

FABRIC_FILES = (
    "mtu",
    "carrier_changes",
    "device/infiniband/*/ports/*/state",
    "device/infiniband/*/ports/*/phys_state",
    "device/infiniband/*/ports/*/rate",
    "device/infiniband/*/ports/*/gids/*",
    "device/infiniband/*/ports/*/gid_attrs/types/*",
)


RAIL_FILES = tuple(name.removeprefix("device/infiniband/*/ports/*/") for name in FABRIC_FILES[2:])


def rail_globs(cluster: ClusterSpec) -> tuple[str, ...]:
    """The port directories of every RDMA device `ray.env` NCCL_IB_HCA names, as shell words
    (name quoted, globs not): a DGX Spark's port is two devices (one per PCIe x4 half), and
    NCCL spreads its traffic over every one listed. A name is a prefix unless the list starts
    with `=` (NCCL's matching, which the glob repeats); an excluding list (`^`) names the
    devices NCCL avoids, not those it uses, so only the data interface's device is read then."""
    value = cluster.ray.env.get("NCCL_IB_HCA")
    if value is None:
        return ()
    hca = parse_hca(value)  # validated when the config loaded
    if hca.exclude:
        return ()
    found: list[str] = []
    for name, port in hca.devices:
        base = shlex.quote(f"/sys/class/infiniband/{name}")
        found.append(f"{base}{'' if hca.exact else '*'}/ports/{'*' if port is None else port}")
    return tuple(found)


def fabric_section(host: HostSpec, seconds: float, rails: Sequence[str] = ()) -> str:
    """The data interface's sysfs files, globs left to the host's shell (the RDMA device and
    its GID rows are found there); the interface's name is quoted. `rails`: port directories
    of further RDMA devices NCCL uses (`rail_globs`), read the same way."""
    base = shlex.quote(f"/sys/class/net/{host.interface}")
    paths = " ".join(
        [f"{base}/{name}" for name in FABRIC_FILES]
        + [f"{rail}/{name}" for rail in rails for name in RAIL_FILES]
    )
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
    return Remote("docker_events", cmd(argv, seconds), mutating=False)


def gpu_apps(seconds: float) -> Remote:
    return Remote("gpu_apps", cmd(GPU_APPS, seconds), mutating=False)


def serve_processes(cluster: ClusterSpec, seconds: float) -> Remote:
    head = container_name(cluster, cluster.head)
    return Remote(
        "serve_processes", cmd(["docker", "top", head, "-eo", TOP_FORMAT], seconds), False
    )


def inspect_container(name: str, seconds: float) -> Remote:
    template = '{{.State.Running}} {{index .Config.Labels "' + LABEL_SPEC + '"}}'
    argv = ["docker", "inspect", "--format", template, "--", name]
    return Remote("inspect_container", cmd(argv, seconds), mutating=False)


# What the executor reads of the serve log while a launch starts: its last lines, enough to
# tell whether the launched process has written any and to quote the last.
LAUNCH_TAIL_BYTES = 8192


def read_serve_log_tail(cluster: ClusterSpec, seconds: float) -> Remote:
    argv = ["tail", "-c", str(LAUNCH_TAIL_BYTES), "--", serve_log_path(cluster)]
    return Remote("read_serve_log", cmd(argv, seconds), False)


def read_serve_spec(cluster: ClusterSpec, seconds: float) -> Remote:
    return Remote("read_serve_spec", cmd(["cat", serve_spec_path(cluster)], seconds), False)


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

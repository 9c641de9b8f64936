"""Turn one host's fact-script sections into snapshot values. Pure.

Host times (log mtime, process ages) are converted to the daemon's clock through the host's own
`date`, so a skewed host clock never shortens or stretches the load grace.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sparkd.core.reading import cache_entries, kernel, parsers, weight_files
from sparkd.core.reading.links import parse_fabric
from sparkd.core.reading.placement import parse_placement
from sparkd.core.spec import container_name, model_spec_hashes, normalize_image
from sparkd.core.text import printable, redact
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import GpuProcess, HostError, HostFacts, RayState, ServeState
from sparkd.model.sections import FactSection, peer_section, top_container, top_section
from sparkd.model.spec import HostSpec
from sparkd.model.weights import ModelFiles

LOG_TAIL_LINES = 20
REQUIRED_SECTIONS = (FactSection.BOOT_ID, FactSection.CONTAINERS, FactSection.RUNNING)
_STOPPED_SINCE = re.compile(r"is not running|No such container")
# Docker answers `top` on a container between restarts of its restart policy with this: it owns
# no processes now.
_RESTARTING = re.compile(r"is restarting, wait until the container is running")
_PRIVILEGE = re.compile(
    r"Interactive authentication required|Access denied|Permission denied|"
    r"a password is required|not in the sudoers|Insufficient Permissions",
    re.I,
)
# vLLM's engine process and its workers, by their process titles (tests/fixtures/vllm-ray-titles):
# `VLLM::EngineCore`; a Ray worker is `ray::RayWorkerProc.<method>` (RayExecutorV2, the default
# from vLLM 0.32 and the only Ray executor in 0.34), or `ray::RayWorkerWrapper.<method>` (the
# executor before it, still on older images); while a worker loads weights vLLM titles it
# `VLLM::Worker_TP<n>` (`VLLM::Worker` with one GPU, also the title of a non-Ray worker).
# In silent stages (torch.compile, a loader that prints nothing) the workers do the work.
ENGINE_MARKERS = ("EngineCore", "RayWorkerProc", "RayWorkerWrapper", "VLLM::Worker")
LAUNCH_MARKER = "=== sparkd launch"
# What the API server prints once as it starts: `non-default args: {...}` (vLLM >= 0.8), and
# `vLLM API server version X` before 0.20 (later releases draw the version in a banner).
_SERVE_BANNER = re.compile(r"\bnon-default args: |vLLM API server version ")


# What the docker CLI prints when its daemon is down (rc 1), or cannot be reached at all.
_DOCKER_DOWN = re.compile(
    r"Cannot connect to the Docker daemon|Is the docker daemon running\?|error during connect"
)
# `ps` ages are whole seconds: a child started in the launch's first second may read one more.
ELAPSED_SLACK = 1.0


@dataclass(frozen=True)
class HeadExtras:
    ray: RayState
    # None when Docker did not answer: whether `vllm serve` runs is unknown, not "no".
    serve: ServeState | None


def _host_clock(sections: dict[str, parsers.Section], observed_at: float) -> float:
    now = sections.get(FactSection.NOW)
    if now is not None and now.ok:
        try:
            # bash's $EPOCHREALTIME writes the locale's decimal mark.
            clock = float(now.body.strip().replace(",", "."))
            if math.isfinite(clock):
                return clock
        except ValueError:
            pass
    return observed_at


def _tops(sections: dict[str, parsers.Section]) -> dict[str, tuple[parsers.TopRow, ...]]:
    tops: dict[str, tuple[parsers.TopRow, ...]] = {}
    for name, section in sections.items():
        container = top_container(name)
        if container is not None and section.ok:
            tops[container] = parsers.parse_docker_top(section.body)
    return tops


def _unread_tops(sections: dict[str, parsers.Section]) -> list[str]:
    """Running containers whose process list could not be read (not merely stopped since)."""
    unread = []
    for container in sections[FactSection.RUNNING].body.split():
        top = sections.get(top_section(container))
        gone = top is not None and (_STOPPED_SINCE.search(top.body) or _RESTARTING.search(top.body))
        if top is None or (not top.ok and not gone):
            unread.append(container)
    return unread


def unreadable(sections: dict[str, parsers.Section]) -> HostError | None:
    """Why this host's sections cannot be trusted as a whole, if they cannot.

    Other sections may fail alone and read as "unknown", but without the container list the
    facts would mislead: no containers reads as "start Ray" (which first removes a running
    head). One container's failed `top` only makes its processes' owner unknown.
    """
    docker = docker_failure(sections) is not None
    for name in REQUIRED_SECTIONS:
        if docker and name in (FactSection.CONTAINERS, FactSection.RUNNING):
            continue  # the host answered: Docker alone is down, and that is its own finding
        section = sections.get(name)
        if section is None:
            return HostError(kind="exit_nonzero", detail=f"fact script printed no {name} section")
        if not section.ok:
            return _failed(name, section)
    garbled = parsers.unreadable_container_line(sections[FactSection.CONTAINERS].body)
    if garbled is not None:
        return HostError(
            kind="exit_nonzero", detail=f"containers: a `docker ps` line does not read: {garbled}"
        )
    return None


def docker_failure(sections: dict[str, parsers.Section]) -> str | None:
    """Why Docker did not answer (its daemon down, or hung until the tool timeout), if so."""
    section = sections.get(FactSection.CONTAINERS)
    if section is None or section.ok:
        return None
    if section.rc == 124 or _DOCKER_DOWN.search(section.body):
        return read_failure("docker", section)
    return None


def _failed(name: str, section: parsers.Section) -> HostError:
    return HostError(kind="exit_nonzero", detail=read_failure(name, section))


def read_failure(name: str, section: parsers.Section) -> str:
    """Why a section failed, keeping the line that says why (real `systemctl` prints the cause
    first and `See system logs...` last), with a hint when it is a privilege problem."""
    status = f"rc {section.rc}" if section.rc is not None else "cut off"
    if section.rc == 124:
        status = "timed out"
    why = parsers.failure_reason(section.body)
    detail = f"{name} failed ({status})" + (f": {why}" if why else "")
    if _PRIVILEGE.search(section.body):
        detail += " (a privilege problem: see ssh.sudo and `sparkd commands --sudoers`)"
    return detail[:300]


def host_facts(
    cluster: ClusterSpec, host: HostSpec, sections: dict[str, parsers.Section], observed_at: float
) -> HostFacts:
    tops = _tops(sections)
    owners = {row.pid: name for name, rows in tops.items() for row in rows}
    started = {
        name: observed_at - max(r.elapsed for r in rows if r.elapsed is not None)
        for name, rows in tops.items()
        if any(r.elapsed is not None for r in rows)
    }
    docker = docker_failure(sections)
    unread = _unread_tops(sections) if FactSection.RUNNING in sections and docker is None else []

    def body(name: FactSection) -> str | None:
        section = sections.get(name)
        return section.body if section is not None and section.ok else None

    def error(name: FactSection) -> str | None:
        section = sections.get(name)
        if section is None or section.ok:
            return None
        return read_failure(name, section)

    boot = body(FactSection.BOOT_ID)
    units_text = body(FactSection.UNITS)
    containers_text = body(FactSection.CONTAINERS)
    apps_text = body(FactSection.GPU_APPS)
    iface_text = body(FactSection.IFACE)
    disk_paths = [str(cluster.model.log_dir), str(cluster.model.cache_root)]
    disk_section = sections.get(FactSection.DISK)
    free = (
        parsers.parse_df_paths(disk_section.body, disk_paths)
        if disk_section is not None and disk_section.rc in (0, 1)
        else dict.fromkeys(disk_paths)
    )
    docker_disk = body(FactSection.DOCKER_DISK)
    image = sections.get(FactSection.IMAGE)
    images: tuple[str, ...] | None = None
    image_id: str | None = None
    if image is not None and image.rc == 0:
        images = (normalize_image(cluster.ray.image),)
        image_id = _image_id(image.body)
    elif image is not None and image.rc == 1 and "no such image" in image.body.lower():
        images = ()
    ours = _image_ids(body(FactSection.OURS_IMAGE))
    containers = (
        parsers.parse_docker_ps(containers_text, started) if containers_text is not None else ()
    )
    containers = tuple(
        c.model_copy(update={"image_id": ours[c.name]}) if c.name in ours else c for c in containers
    )
    last = _last_line(body(FactSection.EXIT_LOG))
    own = container_name(cluster, host)
    containers = tuple(
        c.model_copy(update={"last_line": last}) if c.name == own and last else c
        for c in containers
    )
    gpu = _stable_gpu_processes(apps_text, body(FactSection.GPU_APPS_AFTER), owners)
    if unread or docker is not None:
        gpu = tuple(
            p.model_copy(update={"owner_unknown": True}) if p.container is None else p for p in gpu
        )
    listing = body(FactSection.CACHE)
    kernel_text = body(FactSection.KERNEL)
    kernel_error = error(FactSection.KERNEL)
    if kernel_text is not None:
        kernel_error = kernel.unreadable(kernel_text)
    available, total = kernel.parse_meminfo(body(FactSection.MEMINFO) or "")
    # grep exits 2 for the unused GID rows (EINVAL) on every real host: the lines are the facts.
    links = sections.get(FactSection.FABRIC)
    foreign_text = body(FactSection.FOREIGN)
    # ping exits 0 on a reply, 1 on none within its deadline; anything else says nothing.
    pings = {
        peer.data_ip: sections.get(peer_section(peer.data_ip))
        for peer in cluster.hosts
        if peer.name != host.name
    }
    reaches = {
        ip: section.rc == 0
        for ip, section in pings.items()
        if section is not None and section.rc in (0, 1)
    }
    return HostFacts(
        reaches=reaches,
        name=host.name,
        boot_id=boot.strip() or None if boot is not None else None,
        units=parsers.parse_systemctl_show(units_text) if units_text is not None else (),
        units_error=error(FactSection.UNITS),
        containers=containers,
        gpu_processes=gpu,
        gpu_error=error(FactSection.GPU_APPS),
        interface_error=error(FactSection.IFACE),
        docker_error=docker,
        interface=parsers.parse_ip_addr(iface_text) if iface_text is not None else None,
        disk_free_bytes=free[disk_paths[0]],
        docker_disk_free_bytes=parsers.parse_df_avail(docker_disk) if docker_disk else None,
        images=images,
        image_id=image_id,
        kernel=kernel.parse_kernel_log(kernel_text)
        if kernel_error is None and kernel_text is not None
        else None,
        kernel_error=kernel_error,
        memory_available_bytes=available,
        memory_total_bytes=total,
        fabric=parse_fabric(links.body, host.ip) if links is not None else None,
        cache_entries=cache_entries.parse_listing(listing) if listing is not None else None,
        cache_free_bytes=free[disk_paths[1]],
        model_files=_model_files(cluster, sections),
        foreign=parsers.parse_foreign(foreign_text, tops) if foreign_text is not None else None,
        foreign_error=error(FactSection.FOREIGN),
    )


def _model_files(cluster: ClusterSpec, sections: dict[str, parsers.Section]) -> ModelFiles | None:
    """The prepare sections (only on the head, only while a rollout prepares)."""
    stat = sections.get(FactSection.MODEL_FILES)
    directory = weight_files.host_path(cluster)
    if stat is None or directory is None:
        return None
    files = weight_files.parse_stat(directory, stat.body, stat.rc)
    index = sections.get(FactSection.MODEL_INDEX)
    return weight_files.with_index(
        files, index.body if index is not None else None, index.rc if index else None
    )


# What of an exited container's last line goes into reasons (Ray's tracebacks end in one line).
LAST_LINE_CHARS = 200


def _last_line(text: str | None) -> str | None:
    """The last line an exited container printed, readable and bounded, credentials masked."""
    lines = parsers.section_log_lines(text or "")
    if not lines:
        return None
    return redact(printable(lines[-1].strip()[:LAST_LINE_CHARS])) or None


_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


def _image_id(text: str) -> str | None:
    value = text.strip()
    return value if _IMAGE_ID.match(value) else None


def _image_ids(text: str | None) -> dict[str, str]:
    """`docker inspect --format '{{.Name}} {{.Image}}' NAME...`: `/name sha256:...` per line."""
    found: dict[str, str] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and _IMAGE_ID.match(parts[1]):
            found[parts[0].lstrip("/")] = parts[1]
    return found


def head_extras(
    cluster: ClusterSpec,
    sections: dict[str, parsers.Section],
    observed_at: float,
    secrets: tuple[str, ...] = (),
    known_ray: RayState | None = None,
    ray_read: RayState | None = None,
) -> HeadExtras:
    """`ray_read`: Ray as its dashboard served it this look (then no `ray` section counts)."""
    skew = observed_at - _host_clock(sections, observed_at)
    ray = known_ray.model_copy(update={"reused": True}) if known_ray is not None else ray_read
    nodes = None if ray is not None else sections.get(FactSection.RAY_NODES)
    if nodes is not None and nodes.ok:
        ray = parsers.parse_ray_nodes(nodes.body)
        beside = sections.get(FactSection.RAY_STATUS)
        counted = (
            parsers.parse_ray_status(beside.body) if beside is not None and beside.ok else None
        )
        if ray is not None and counted is not None:
            ray = ray.model_copy(update={"gpus_usable": counted.gpus_total})
    if ray is None:
        status = sections.get(FactSection.RAY_STATUS)
        if status is not None and status.ok:
            ray = parsers.parse_ray_status(status.body)
        if ray is None:
            said = status if status is not None else nodes
            detail = parsers.failure_reason(said.body) if said is not None else ""
            if said is not None and said.rc == 124:
                detail = f"`ray` timed out{': ' + detail if detail else ''}"
            ray = RayState(error=detail or "Ray did not answer")

    docker = docker_failure(sections)
    if docker is not None:
        return HeadExtras(
            ray=RayState(error=f"unknown: Docker not answering ({docker})"), serve=None
        )
    tops = _tops(sections)
    head_rows = tops.get(container_name(cluster, cluster.head), ())
    serve_row = parsers.find_serve(head_rows)
    log = sections.get(FactSection.SERVE_LOG)
    lines = parsers.section_log_lines(log.body) if log is not None and log.ok else []
    lines = [redact(line, secrets) for line in _since_launch(lines)]
    mtime_section = sections.get(FactSection.SERVE_LOG_MTIME)
    progress_at: float | None = None
    if mtime_section is not None and mtime_section.ok:
        mtime = parsers.parse_stat_time(mtime_section.body)
        progress_at = mtime + skew if mtime is not None else None
    spec = sections.get(FactSection.SERVE_SPEC)
    spec_hash = spec.body.strip() or None if spec is not None and spec.ok else None
    cpu = _engine_cpu(head_rows)
    if serve_row is None:
        serve = ServeState(
            running=False,
            spec_hash=spec_hash,
            log_tail=tuple(lines[-LOG_TAIL_LINES:]),
            orphans=tuple(
                f"pid {r.pid} ({_title(r.args)})"
                for r in head_rows
                if any(marker in r.args for marker in ENGINE_MARKERS)
            ),
        )
    else:
        serve = ServeState(
            running=True,
            pid=serve_row.pid,
            elapsed_seconds=serve_row.elapsed,
            spec_hash=spec_hash,
            progress=parsers.parse_load_progress(lines, progress_at),
            log_tail=tuple(lines[-LOG_TAIL_LINES:]),
            cpu_seconds=cpu,
            placement=parse_placement(lines),
        )
    return HeadExtras(ray=ray, serve=serve)


WITHHELD_TAIL = (
    "log tail withheld: the model was launched with another spec, maybe an API key sparkd no"
    " longer holds (rotated); it shows again after the next launch"
)


def withhold_foreign_tail(cluster: ClusterSpec, serve: ServeState, key: str | None) -> ServeState:
    """The serve state without its log text when the running launch is not of the spec as
    desired with the key read now (`key` its fingerprint): that launch may print a rotated-out
    key a restarted process never read, so cannot mask."""
    if serve.spec_hash in model_spec_hashes(cluster, key) or not serve.log_tail:
        return serve
    progress = serve.progress.model_copy(update={"message": ""}) if serve.progress else None
    return serve.model_copy(update={"log_tail": (WITHHELD_TAIL,), "progress": progress})


def _title(args: str) -> str:
    """The engine's process title (setproctitle's `VLLM::EngineCore`), not its interpreter."""
    words = args.split()
    named = [w for w in words if any(marker in w for marker in ENGINE_MARKERS)]
    return (named or words or ["?"])[0][:60]


def _engine_cpu(rows: tuple[parsers.TopRow, ...]) -> float | None:
    """CPU seconds of the serve process and its engine processes (not Ray's own daemons), of
    this launch only: an engine left over from an earlier launch burns CPU that proves nothing
    about this one."""
    serve = parsers.find_serve(rows)
    born = serve.elapsed if serve is not None else None
    engine = [
        r
        for r in rows
        if any(marker in r.args for marker in ENGINE_MARKERS)
        and (born is None or r.elapsed is None or r.elapsed <= born + ELAPSED_SLACK)
    ]
    if serve is not None and serve not in engine:
        engine.append(serve)
    if not engine or any(r.cpu_seconds is None for r in engine):
        return None
    return sum(r.cpu_seconds or 0.0 for r in engine)


def launch_output(text: str) -> list[str]:
    """The lines the latest launch wrote, from the tail of the serve log (`text`): none while the
    launched process has not started, since only it writes after sparkd's marker."""
    return _since_launch(parsers.log_lines(text))


def _since_launch(lines: list[str]) -> list[str]:
    """The log is appended to across launches: only the latest launch's lines say anything.
    A launch starts at sparkd's marker, or at the banner every `vllm serve` prints when it
    starts (a serve restarted by hand into the same log writes no marker)."""
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith(LAUNCH_MARKER):
            return lines[index + 1 :]
        if _SERVE_BANNER.search(lines[index]):
            return lines[index:]
    return lines


def _stable_gpu_processes(
    before: str | None, after: str | None, owners: dict[int, str]
) -> tuple[GpuProcess, ...]:
    """Processes listed both before and after the containers' `top`s (when both were read)."""
    if before is None:
        return ()
    processes = parsers.parse_compute_apps(before, owners)
    if after is None:
        return processes
    still = {p.pid for p in parsers.parse_compute_apps(after)}
    return tuple(p for p in processes if p.pid in still)

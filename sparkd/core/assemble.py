"""Turn one host's fact-script sections into snapshot values. Pure.

Host times (log mtime, process ages) are converted to the daemon's clock through the host's own
`date`, so a skewed host clock never shortens or stretches the load grace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkd.core import facts
from sparkd.core.spec import container_name, normalize_image
from sparkd.model.observed import GpuProcess, HostError, HostFacts, RayState, ServeState
from sparkd.settings import ClusterSpec, HostSpec

LOG_TAIL_LINES = 20
REQUIRED_SECTIONS = ("boot_id", "containers", "running")
_STOPPED_SINCE = re.compile(r"is not running|No such container")
LAUNCH_MARKER = "=== sparkd launch"


@dataclass(frozen=True)
class HeadExtras:
    ray: RayState
    serve: ServeState


def _host_clock(sections: dict[str, facts.Section], observed_at: float) -> float:
    now = sections.get("now")
    if now is not None and now.ok:
        try:
            return float(now.body.strip())
        except ValueError:
            pass
    return observed_at


def _tops(sections: dict[str, facts.Section]) -> dict[str, tuple[facts.TopRow, ...]]:
    return {
        name[len("top ") :]: facts.parse_docker_top(section.body)
        for name, section in sections.items()
        if name.startswith("top ") and section.ok
    }


def unreadable(sections: dict[str, facts.Section]) -> HostError | None:
    """Why this host's sections cannot be trusted as a whole, if they cannot.

    Other sections may fail alone and read as "not observed", but without the container list
    and each running container's processes the facts would mislead: no containers reads as
    "start Ray" (which first removes a running head), and a process whose container is unknown
    reads as a foreign GPU process, maybe to be killed.
    """
    for name in REQUIRED_SECTIONS:
        section = sections.get(name)
        if section is None:
            return HostError(kind="exit_nonzero", detail=f"fact script printed no {name} section")
        if not section.ok:
            return _failed(name, section)
    for container in sections["running"].body.split():
        top = sections.get(f"top {container}")
        if top is None:
            return HostError(kind="exit_nonzero", detail=f"no process list for {container}")
        # A container that stopped since it was listed has no processes left to own.
        if not top.ok and not _STOPPED_SINCE.search(top.body):
            return _failed(f"top {container}", top)
    return None


def _failed(name: str, section: facts.Section) -> HostError:
    status = f"rc {section.rc}" if section.rc is not None else "cut off"
    first = _first_line(section.body)
    detail = f"{name} section failed ({status})" + (f": {first}" if first else "")
    return HostError(kind="exit_nonzero", detail=detail[:200])


def host_facts(
    cluster: ClusterSpec, host: HostSpec, sections: dict[str, facts.Section], observed_at: float
) -> HostFacts:
    tops = _tops(sections)
    owners = {row.pid: name for name, rows in tops.items() for row in rows}
    started = {
        name: observed_at - max(r.elapsed for r in rows if r.elapsed is not None)
        for name, rows in tops.items()
        if any(r.elapsed is not None for r in rows)
    }

    def body(name: str) -> str | None:
        section = sections.get(name)
        return section.body if section is not None and section.ok else None

    boot = body("boot_id")
    units_text = body("units")
    containers_text = body("containers")
    apps_text = body("gpu_apps")
    iface_text = body("iface")
    disk_text = body("disk")
    image = sections.get("image")
    images: tuple[str, ...] | None = None
    if image is not None and image.rc == 0:
        images = (normalize_image(cluster.ray.image),)
    elif image is not None and image.rc == 1 and "no such image" in image.body.lower():
        images = ()
    return HostFacts(
        name=host.name,
        boot_id=boot.strip() or None if boot is not None else None,
        units=facts.parse_systemctl_show(units_text) if units_text is not None else (),
        containers=facts.parse_docker_ps(_json_lines(containers_text), started)
        if containers_text is not None
        else (),
        gpu_processes=_stable_gpu_processes(apps_text, body("gpu_apps_after"), owners),
        interface=facts.parse_ip_addr(iface_text) if iface_text is not None else None,
        disk_free_bytes=facts.parse_df_avail(disk_text) if disk_text is not None else None,
        images=images,
    )


def head_extras(
    cluster: ClusterSpec,
    sections: dict[str, facts.Section],
    observed_at: float,
    secrets: tuple[str, ...] = (),
) -> HeadExtras:
    skew = observed_at - _host_clock(sections, observed_at)
    ray: RayState | None = None
    nodes = sections.get("ray_nodes")
    if nodes is not None and nodes.ok:
        ray = facts.parse_ray_nodes(nodes.body)
    if ray is None:
        status = sections.get("ray_status")
        if status is not None and status.ok:
            ray = facts.parse_ray_status(status.body)
        if ray is None:
            detail = _first_line(status.body) if status is not None else ""
            ray = RayState(error=detail or "Ray did not answer")

    tops = _tops(sections)
    head_rows = tops.get(container_name(cluster, cluster.head), ())
    serve_row = facts.find_serve(head_rows)
    log = sections.get("serve_log")
    lines = facts.log_lines(log.body) if log is not None and log.ok else []
    lines = [facts.redact(line, secrets) for line in _since_launch(lines)]
    mtime_section = sections.get("serve_log_mtime")
    progress_at: float | None = None
    if mtime_section is not None and mtime_section.ok:
        mtime = facts.parse_stat_time(mtime_section.body)
        progress_at = mtime + skew if mtime is not None else None
    spec = sections.get("serve_spec")
    spec_hash = spec.body.strip() or None if spec is not None and spec.ok else None
    if serve_row is None:
        serve = ServeState(
            running=False, spec_hash=spec_hash, log_tail=tuple(lines[-LOG_TAIL_LINES:])
        )
    else:
        serve = ServeState(
            running=True,
            pid=serve_row.pid,
            elapsed_seconds=serve_row.elapsed,
            spec_hash=spec_hash,
            progress=facts.parse_load_progress(lines, progress_at),
            log_tail=tuple(lines[-LOG_TAIL_LINES:]),
        )
    return HeadExtras(ray=ray, serve=serve)


def _since_launch(lines: list[str]) -> list[str]:
    """The log is appended to across launches: only the latest launch's lines say anything."""
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith(LAUNCH_MARKER):
            return lines[index + 1 :]
    return lines


def _stable_gpu_processes(
    before: str | None, after: str | None, owners: dict[int, str]
) -> tuple[GpuProcess, ...]:
    """Processes listed both before and after the containers' `top`s (when both were read)."""
    if before is None:
        return ()
    processes = facts.parse_compute_apps(before, owners)
    if after is None:
        return processes
    still = {p.pid for p in facts.parse_compute_apps(after)}
    return tuple(p for p in processes if p.pid in still)


def _json_lines(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.lstrip().startswith("{"))


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""

"""Parse what the hosts print into snapshot values. Pure: text in, values out.

Each parser reads one real tool's format (samples in tests/fixtures/samples) and is defensive:
a section that cannot be read yields None ("not observed"), never a guess.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparkd.core.text import printable, printable_json
from sparkd.model.observed import (
    Container,
    ForeignContainer,
    GpuProcess,
    Interface,
    LoadProgress,
    LoadStage,
    RayNode,
    RayState,
    UnitState,
)

SECTION_START = "@@sparkd "
SECTION_END = "@@sparkd-end "


@dataclass(frozen=True)
class Section:
    body: str
    rc: int | None

    @property
    def ok(self) -> bool:
        return self.rc == 0


_RC = re.compile(r"^-?[0-9]{1,5}$")


# More lines than any section holds when the tools are sane (the serve log's 64 KiB tail, were it
# all line breaks; a kernel tail is 200, a GID table 510): a section past it is a host printing
# up to the SSH output cap to hold the parsers, read as cut off (no exit status), unparsed.
SECTION_LINES = 65_536
# Far more markers than the script prints (its sections, and a `top` per container): the rest of
# an output past it is read as cut off.
MAX_MARKERS = 1024
# Every character `str.splitlines` ends a line at.
_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# A marker, up to the next line break (a literal first: the scan skips to each `@@sparkd`); it
# counts only at the start of a line.
_MARKER = re.compile(f"@@sparkd(?: |-end )[^{_BREAKS}]*")


def parse_sections(text: str) -> dict[str, Section]:
    """Split the fact script's output: `@@sparkd NAME` ... `@@sparkd-end NAME RC`.

    The markers are found by one regex scan and each body is cut out whole, so the output costs
    no Python step per line; a body of more than SECTION_LINES lines is not split at all.
    """
    sections: dict[str, Section] = {}
    name: str | None = None
    start = 0
    for seen, marker in enumerate(_MARKER.finditer(text)):
        if seen == MAX_MARKERS:
            break
        if marker.start() > 0 and text[marker.start() - 1] not in _BREAKS:
            continue
        line = marker.group(0)
        if line.startswith(SECTION_START):
            name, start = line[len(SECTION_START) :].strip(), _next_line(text, marker.end())
        elif name is not None:
            _, _, rc_text = line[len(SECTION_END) :].strip().rpartition(" ")
            rc = int(rc_text) if _RC.match(rc_text) else None
            sections[name] = _section(text[start : marker.start()], rc)
            name = None
    if name is not None:  # cut off mid-section: keep what came, with no exit status
        sections[name] = _section(text[start:], None)
    return sections


def _next_line(text: str, end: int) -> int:
    """Where the line after the one ending at `end` starts (`\r\n` is one break)."""
    if text.startswith("\r\n", end):
        return end + 2
    return min(end + 1, len(text))


def _section(body: str, rc: int | None) -> Section:
    if sum(body.count(c) for c in _BREAKS) > SECTION_LINES:
        return Section("", None)
    return Section("\n".join(body.splitlines()), rc)


def parse_systemctl_show(text: str) -> tuple[UnitState, ...]:
    """`systemctl show -p Id,LoadState,ActiveState,SubState,UnitFileState UNIT...`."""
    units: list[UnitState] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" not in fields:
            continue
        units.append(
            UnitState(
                name=fields["Id"],
                load_state=fields.get("LoadState", ""),
                active_state=fields.get("ActiveState", ""),
                sub_state=fields.get("SubState", ""),
                unit_file_state=fields.get("UnitFileState", ""),
            )
        )
    return tuple(units)


def parse_docker_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key:
            labels[key.strip()] = value
    return labels


def container_json(line: str) -> str | None:
    """The JSON of one `docker ps` line: the whole line (`--format '{{json .}}'`), or what
    follows the state and names (`--format '{{.State}} {{.Names}} {{json .}}'`, the fact
    script's); None for a line of neither form."""
    text = line.strip()
    if text.startswith("{"):
        return text
    parts = text.split(None, 2)
    if len(parts) == 3 and parts[2].startswith("{"):
        return parts[2]
    return None


_EXITED = re.compile(r"^Exited \((-?[0-9]{1,3})\)")


def exit_code(status: str) -> int | None:
    """The exit code in Docker's `Status` of an exited container (`Exited (127) 2 seconds
    ago`); None for any other status."""
    found = _EXITED.match(status)
    return int(found.group(1)) if found else None


# More containers than a host holds when sane (`docker ps -a` lists the exited ones too): a
# listing past it is read as unreadable (the host's facts unknown) rather than parsed line by
# line, so a host printing its whole output cap of container lines (about 49,000) cannot hold
# the event loop; one of sparkd's own containers skipped would read as missing.
MAX_CONTAINERS = 4096


@dataclass(frozen=True)
class DockerPs:
    """A `docker ps` listing read once: its containers, and the first line meant as a container
    that is not one (cut short; None when every such line reads)."""

    containers: tuple[Container, ...]
    unreadable: str | None


def read_docker_ps(text: str, started: Mapping[str, float] | None = None) -> DockerPs:
    """`docker ps -a --no-trunc --format '{{json .}}'` (each line's JSON after the state and
    names, as the fact script asks), one JSON object per line, each decoded once. A line that
    is not meant as a container (neither JSON nor naming `Names`) is skipped; one that is meant
    as one and does not read is `unreadable`. Past MAX_CONTAINERS such lines nothing more is
    decoded and the listing is `unreadable`: no host output costs more than MAX_CONTAINERS
    decodes."""
    containers: list[Container] = []
    unreadable: str | None = None
    meant = 0
    for line in text.splitlines():
        found = container_json(line)
        if found is None and '"Names"' not in line:
            continue
        meant += 1
        if meant > MAX_CONTAINERS:
            return DockerPs(tuple(containers), f"more than {MAX_CONTAINERS} containers listed")
        container = _container(found, started) if found is not None else None
        if container is not None:
            containers.append(container)
        elif unreadable is None:
            unreadable = line.strip()[:120]
    return DockerPs(tuple(containers), unreadable)


def _container(found: str, started: Mapping[str, float] | None) -> Container | None:
    # Plain json.loads: each field used goes through _text, which makes it printable.
    try:
        row = json.loads(found)
    except (ValueError, RecursionError):
        return None
    if not isinstance(row, dict):
        return None
    name = _text(row.get("Names")).split(",")[0]
    if not name:
        return None
    status = _text(row.get("Status"))
    return Container(
        name=name,
        image=_text(row.get("Image")),
        state=_text(row.get("State")).lower(),
        labels=parse_docker_labels(_text(row.get("Labels"))),
        started_at=(started or {}).get(name),
        status=status,
        exit_code=exit_code(status),
    )


def parse_docker_ps(text: str, started: Mapping[str, float] | None = None) -> tuple[Container, ...]:
    """The containers of a `docker ps` listing (read_docker_ps)."""
    return read_docker_ps(text, started).containers


def unreadable_container_line(text: str) -> str | None:
    """The first line of `docker ps` output that is meant as a container (JSON, or naming
    `Names`) but is not one, cut short; None when every such line reads. Skipped, that line's
    container would read as missing, and a missing head container reads as "start Ray"."""
    return read_docker_ps(text).unreadable


def _text(value: object, limit: int = 4096) -> str:
    """A JSON field as text: strings as they are (bounded), anything else as nothing."""
    return printable(value[:limit]) if isinstance(value, str) else ""


@dataclass(frozen=True)
class TopRow:
    pid: int
    elapsed: float | None
    args: str
    cpu_seconds: float | None = None


def parse_docker_top(text: str) -> tuple[TopRow, ...]:
    """`docker top NAME -eo pid,etimes,times,args` (or without `times`): a header, then one
    process per line; the columns are read from the header."""
    lines = text.splitlines()
    if not lines:
        return ()
    header = lines[0].split()
    with_cpu = len(header) >= 4
    rows: list[TopRow] = []
    for line in lines[1:]:
        parts = line.split(None, 3 if with_cpu else 2)
        if len(parts) < 2 or not _is_count(parts[0]):
            continue
        elapsed = float(parts[1]) if _is_count(parts[1]) else None
        cpu: float | None = None
        args_at = 2
        if with_cpu:
            cpu = float(parts[2]) if len(parts) > 2 and _is_count(parts[2]) else None
            args_at = 3
        args = parts[args_at] if len(parts) > args_at else ""
        rows.append(TopRow(pid=int(parts[0]), elapsed=elapsed, args=args, cpu_seconds=cpu))
    return tuple(rows)


MAX_NAME = 256
# The kernel's PIDs stay below pid_max, which is at most 2^22 (PID_MAX_LIMIT on 64-bit).
PID_LIMIT = 4_194_304


def is_pid(value: int) -> bool:
    """A process sparkd may name: never 0 (its own group), 1 (init) or past the kernel's limit."""
    return 2 <= value < PID_LIMIT


def _is_count(text: str) -> bool:
    """ASCII digits only (`str.isdigit` also takes `²`), and of a sane length."""
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit()


def parse_compute_apps(
    text: str, owners: Mapping[int, str] | None = None
) -> tuple[GpuProcess, ...]:
    """`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits`.

    GB10 prints `[N/A]` for memory it cannot attribute; that is unknown, not zero.
    """
    processes: list[GpuProcess] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not _is_count(parts[0]) or not is_pid(int(parts[0])):
            continue
        memory = parts[2] if len(parts) > 2 else ""
        used = int(memory) if _is_count(memory) else None
        pid = int(parts[0])
        # A path is at most PATH_MAX (4096); the name is shown in reasons, bounded further.
        name = parts[1][:MAX_NAME]
        processes.append(
            GpuProcess(pid=pid, name=name, used_memory_mib=used, container=(owners or {}).get(pid))
        )
    return tuple(processes)


def parse_ip_addr(text: str) -> Interface | None:
    """`ip -j addr show dev IFACE` (iproute2 JSON)."""
    rows = json_or_none(text)
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict):
        return None
    row = rows[0]
    flags = row.get("flags")
    flags = flags if isinstance(flags, list) else []
    up = row.get("operstate") == "UP" or ("UP" in flags and "LOWER_UP" in flags)
    info = row.get("addr_info")
    addresses = tuple(
        a["local"]
        for a in (info if isinstance(info, list) else [])
        if isinstance(a, dict) and isinstance(a.get("local"), str)
    )
    return Interface(name=_text(row.get("ifname"), 64), up=up, addresses=addresses)


def parse_stat_time(text: str) -> float | None:
    """`stat -c %y` ("2026-11-30 03:18:05.123456789 +0000", sub-second and portable), or an
    epoch number; None when it is neither."""
    text = text.strip()
    try:
        number = float(text)
        return number if math.isfinite(number) else None
    except ValueError:
        pass
    match = re.match(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d+))? ([+-]\d{4})$", text)
    if match is None:
        return None
    date, clock = match.group(1).split(" ")
    year, month, day = (int(x) for x in date.split("-"))
    hour, minute, second = (int(x) for x in clock.split(":"))
    zone = match.group(3)
    offset = (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[3:5]) * 60)
    fraction = float(f"0.{match.group(2)}") if match.group(2) else 0.0
    seconds = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second
    return seconds - offset + fraction


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (no clock, no locale, no tz db)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def parse_df_avail(text: str) -> int | None:
    """`df -B1 --output=avail PATH`: a header line, then bytes available."""
    for line in text.splitlines()[1:]:
        if _is_count(line.strip()):
            return int(line.strip())
    return None


def parse_df_paths(text: str, paths: Sequence[str]) -> dict[str, int | None]:
    """`df -B1 --output=avail PATH...` (stderr merged): one row per path in order, except a
    path that does not exist, which df names in an error line instead (and exits 1)."""
    errors = [line for line in text.splitlines() if line.startswith("df: ")]
    # The message is in the host's language; the path it names is not (quoted when odd).
    named = ("df: {}:", "df: '{}':", "df: \u2018{}\u2019:")
    missing = {p for p in paths for e in errors if any(e.startswith(n.format(p)) for n in named)}
    rows = [
        int(line.strip())
        for line in text.splitlines()
        if not line.startswith("df:") and _is_count(line.strip())
    ]
    present = [p for p in paths if p not in missing]
    if len(rows) != len(present):
        return dict.fromkeys(paths)
    found: dict[str, int | None] = dict.fromkeys(paths)
    found.update(zip(present, rows, strict=True))
    return found


NO_RESOURCES = "No resource in the cluster"
NO_STATUS = "No cluster status"


def parse_ray_nodes(text: str) -> RayState | None:
    """`ray list nodes --format=json` (needs the dashboard): ONE line of JSON on stdout. Other
    lines (warnings on stderr, merged by the fact script) are not the answer. None when no line
    is that JSON. While Ray starts up it prints `No resource in the cluster` (rc 0): up, empty.
    """
    rows: Any = json_or_none(text)
    for line in [] if isinstance(rows, list) else reversed(text.splitlines()):
        stripped = line.strip()
        if stripped.startswith("["):
            rows = json_or_none(stripped)
            if isinstance(rows, list):
                break
    if not isinstance(rows, list):
        if NO_RESOURCES in text:
            return RayState(nodes=(), gpus_total=0.0)
        return None
    return ray_rows(rows)


def ray_rows(rows: list[Any]) -> RayState | None:
    """Ray's node rows, as the CLI prints them and the state API serves them; None when one
    row is not a node (no id, a GPU count that is not a count)."""
    nodes: list[RayNode] = []
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("node_id"), str):
            return None
        resources = row.get("resources_total") or {}
        gpus = gpu_count(resources.get("GPU", 0.0) if isinstance(resources, dict) else 0.0)
        if gpus is None:
            # Read as 0 GPUs, a garbage count would restart both Ray nodes of a serving cluster.
            return None
        message = row.get("state_message")
        nodes.append(
            RayNode(
                node_id=row["node_id"][:128],
                ip=_text(row.get("node_ip"), 64),
                alive=row.get("state") == "ALIVE",
                gpus=gpus,
                is_head=row.get("is_head_node") is True,
                state_message=message if isinstance(message, str) else None,
            )
        )
    total = sum(n.gpus for n in nodes if n.alive)
    return RayState(nodes=tuple(nodes), gpus_total=total)


def gpu_count(value: object) -> float | None:
    """A GPU count, None when it is not a count (NaN, Infinity, negative, text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if 0.0 <= number < 1e6 else None


def failure_reason(text: str) -> str:
    """The line that says why a tool failed: a Python traceback's last line (not
    `Traceback (most recent call last):`), else the first meaningful line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        return lines[-1][:300]
    return lines[0][:300]


_RAY_NODE = re.compile(r"^\s*\d+\s+node_([0-9a-f]+)\s*$")
_RAY_GPU = re.compile(r"^\s*(\d{1,9}(?:\.\d{1,9})?)/(\d{1,9}(?:\.\d{1,9})?)\s+GPU\b")


def parse_ray_status(text: str) -> RayState | None:
    """`ray status`, each layout: `Active:`/`Total Usage:` (Ray 2.60), with `Idle:` too under
    autoscaler v2 (a node with nothing scheduled is listed there, alive), and `Healthy:`/`Usage:`.

    It names nodes but not their IPs: the state says so, and the planner then trusts GPUs only.
    """
    if NO_STATUS in text and "Node status" not in text:
        # Ray's internal services are still starting: up, nothing registered yet.
        return RayState(nodes=(), gpus_total=0.0, ips_known=False)
    if "Node status" not in text:
        return None
    block: str | None = None
    node_ids: list[str] = []
    total: float | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in ("Active:", "Idle:", "Healthy:"):
            block = "nodes"
            continue
        if stripped.endswith(":") and not stripped.startswith("node_"):
            block = "usage" if stripped in ("Total Usage:", "Usage:") else None
            continue
        if block == "nodes" and (match := _RAY_NODE.match(line)):
            node_ids.append(match.group(1))
        elif block == "usage" and (match := _RAY_GPU.match(line)):
            total = float(match.group(2))
    if total is None and not node_ids:
        return None
    nodes = tuple(RayNode(node_id=n, ip="", alive=True) for n in node_ids)
    return RayState(nodes=nodes, gpus_total=total or 0.0, ips_known=False)


# Every weight loader's bar has tqdm's `{desc}: {percentage:3.0f}% Completed | ...`, only the
# `desc` names the loader (`Loading safetensors checkpoint shards`, `... (eager)`, `Loading
# fastsafetensors checkpoint shards`, `Multi-thread loading shards`, ...: tests/fixtures/
# vllm-loaders). Any other loader is silent.
_SHARDS = re.compile(r"(?:Loading|Multi-thread loading) [^:\r\n]{1,60}: {1,3}(\d{1,3})% Completed")
_CAPTURE = re.compile(r"Capturing CUDA graph|Graph capturing|CUDA graph capture", re.I)
_READY = re.compile(r"Application startup complete|Starting vLLM API server|Uvicorn running on")
# Only a signature that the engine is gone fails a load whose process still runs: warnings
# with `Error:` in them (vLLM's ulimit notice, Ray's autoscaler "No available node types"
# notice, a Python warning quoting a RuntimeError) are not failures. Anything else fatal ends
# the process, and an exited process is the evidence.
_FATAL = re.compile(r"EngineCore failed to start|Engine core initialization failed|EngineDeadError")


# The serve log's tail the fact script reads (`tail -c`; shell.catalogue.reads.LOG_TAIL_BYTES):
# a log section holds at most this many characters when the host prints what it was asked for.
LOG_TAIL_CHARS = 65536


def log_lines(text: str) -> list[str]:
    """Lines as a person would see them: tqdm's carriage-return updates become lines."""
    return [part.rstrip() for part in re.split(r"[\r\n]+", text) if part.strip()]


def section_log_lines(text: str) -> list[str]:
    """The lines of a log section of the fact script, of its last LOG_TAIL_CHARS characters
    only (what the script asked the host for): a host printing up to the SSH output cap costs
    no more than one that printed the tail."""
    return log_lines(text[-LOG_TAIL_CHARS:])


def parse_load_progress(lines: list[str], progress_at: float | None) -> LoadProgress:
    """Where a `vllm serve` load stands, from its log. The last stage reached wins, a fatal
    line after it means the load failed."""
    stage: LoadStage = "starting"
    percent: float | None = None
    message = ""
    for line in lines:
        if match := _SHARDS.search(line):
            stage, percent, message = "weights", float(match.group(1)), line.strip()
        elif _CAPTURE.search(line):
            stage, message = "graph_capture", line.strip()
        elif _READY.search(line):
            stage, percent, message = "ready", 100.0, line.strip()
        elif _FATAL.search(line) and stage != "ready":
            stage, message = "failed", line.strip()
    if stage == "failed":
        # The traceback's last line names the error better than its first line.
        tail = next((ln.strip() for ln in reversed(lines) if _FATAL.search(ln)), message)
        message = tail
    return LoadProgress(stage=stage, percent=percent, progress_at=progress_at, message=message)


def find_serve(rows: Iterable[TopRow]) -> TopRow | None:
    """The `vllm serve` process among a container's processes (`exec` replaced the `sh -c`)."""
    for row in rows:
        words = row.args.split()
        for i, word in enumerate(words[:-1]):
            if (word == "vllm" or word.endswith("/vllm")) and words[i + 1] == "serve":
                return row
    return None


def json_or_none(text: str) -> Any:
    """The decoded JSON with its strings printable (see core.text), or None."""
    try:
        return printable_json(json.loads(text))
    except (ValueError, RecursionError):
        return None


# What first contact reads of each running container (core.judging.adopt): one JSON object a line.
FOREIGN_FORMAT = (
    '{"name":{{json .Name}},"image":{{json .Config.Image}},"env":{{json .Config.Env}},'
    '"entrypoint":{{json .Config.Entrypoint}},"cmd":{{json .Config.Cmd}}}'
)
# Option words whose next word (or `=value`) is never kept: a key on a command line.
_SECRET_OPTION = re.compile(r"^(--[\w-]*(?:key|token|secret|password)[\w-]*)(=.*)?$", re.I)
_SECRET_NAME = re.compile(r"key|token|secret|password|passwd|credential", re.I)
REDACTED = "<redacted>"


def redact_words(words: Sequence[str]) -> tuple[str, ...]:
    """Command words with the value of a secret-looking option (`--api-key X`,
    `--hf-token=X`) replaced."""
    out: list[str] = []
    hide = False
    for word in words:
        if " " in word:
            # `sh -c "vllm serve ... --api-key X"`: one word of Docker's `Cmd`.
            out.append(" ".join(redact_words(word.split(" "))))
            continue
        if hide:
            out.append(REDACTED)
            hide = False
            continue
        found = _SECRET_OPTION.match(word)
        if found is not None and found.group(2):
            out.append(f"{found.group(1)}={REDACTED}")
        else:
            out.append(word)
            hide = found is not None
    return tuple(out)


def parse_foreign(text: str, tops: Mapping[str, Sequence[TopRow]]) -> tuple[ForeignContainer, ...]:
    """`docker inspect --format FOREIGN_FORMAT -- NAMES...`: one container a line, each with
    its processes from its `docker top` (`PID ARGS`). The value of a secret-looking env name or
    option is never kept. A line that is not such an object is skipped."""
    found: list[ForeignContainer] = []
    for line in text.splitlines():
        row = json_or_none(line.strip())
        if not isinstance(row, dict):
            continue
        name = _text(row.get("name")).lstrip("/")
        if not name:
            continue
        env: dict[str, str] = {}
        for item in row.get("env") or ():
            if isinstance(item, str) and "=" in item:
                key, _, value = item.partition("=")
                env[key] = REDACTED if _SECRET_NAME.search(key) else value
        command = [
            w for part in ("entrypoint", "cmd") for w in (row.get(part) or ()) if isinstance(w, str)
        ]
        processes = tuple(
            f"{r.pid} {' '.join(redact_words(r.args.split()))}" for r in tops.get(name, ())
        )
        found.append(
            ForeignContainer(
                name=name,
                image=_text(row.get("image")),
                env=env,
                command=redact_words(command),
                processes=processes,
            )
        )
    return tuple(found)

"""What `docker ps`, `logs`, `inspect` and `top` tell of a simulated host's containers."""

from __future__ import annotations

import re
import shlex
import time
from typing import Any

from sparkd_sim.docker_args import DAEMON, Parsed, is_restarting, no_such, not_running, parse
from sparkd_sim.docker_images import (
    IMAGE_ENV,
    IMAGE_SIZE,
    find_image,
    human_size,
    image_id,
    image_value,
)
from sparkd_sim.engine import ENTRYPOINT
from sparkd_sim.formats import (
    ago,
    docker_time,
    go_json,
    go_quote,
    human_duration,
    render_template,
    rfc3339,
    tabwriter,
)
from sparkd_sim.protocol import Done, fail
from sparkd_sim.state import Container, HostState, SimProcess


def _ps_row(c: Container, no_trunc: bool, size: bool) -> dict[str, Any]:
    command = shlex.join([ENTRYPOINT, *c.command])
    if not no_trunc and len(command) > 20:
        command = command[:19] + "…"
    if c.status == "running":
        status = "Up " + human_duration(time.time() - c.started_wall)
    elif c.status == "restarting":
        status = f"Restarting ({c.exit_code}) {ago(c.finished_wall)}"
    elif c.status == "exited":
        status = f"Exited ({c.exit_code}) {ago(c.finished_wall)}"
    else:
        status = "Created"
    return {
        "Command": go_quote(command),
        "CreatedAt": docker_time(c.created_wall),
        "ID": c.id if no_trunc else c.id[:12],
        "Image": c.image,
        "Labels": ",".join(f"{k}={v}" for k, v in sorted(c.labels.items())),
        "LocalVolumes": "0",
        "Mounts": ",".join(m.source for m in c.mounts),
        "Names": c.name,
        "Networks": c.network,
        # The CLI's own field (28.x), null for a single-platform image.
        "Platform": None,
        "Ports": "",
        "RunningFor": ago(c.created_wall),
        # Unasked, the sizes are zero and the CLI prints `0B` (formatter/container.go `Size`).
        "Size": (
            f"{human_size(c.layer_bytes)} (virtual {human_size(IMAGE_SIZE + c.layer_bytes)})"
            if size
            else "0B"
        ),
        "State": c.status,
        "Status": status,
    }


def _matches(c: Container, filters: list[str]) -> bool | str:
    by_key: dict[str, list[str]] = {}
    for f in filters:
        key, eq, value = f.partition("=")
        if not eq:
            return f"{DAEMON}: invalid filter '{f}'"
        by_key.setdefault(key, []).append(value)
    for key, values in by_key.items():
        if key == "label":
            for v in values:
                k, eq2, want = v.partition("=")
                if k not in c.labels or (eq2 and c.labels[k] != want):
                    return False
        elif key == "name":
            if not any(v.lstrip("/") in c.name for v in values):
                return False
        elif key == "status":
            if c.status not in values:
                return False
        elif key == "id":
            if not any(c.id.startswith(v) for v in values):
                return False
        else:
            return f"{DAEMON}: invalid filter '{key}'"
    return True


_PS_VALUES = {"--format", "-f", "--filter"}
_PS_BOOLS = {"-a", "--all", "--no-trunc", "-q", "--quiet", "-s", "--size"}
# Go's strconv.ParseBool, as a `--flag=value` is read.
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}
# `.Size` in a template, or `{{json .}}` (which marshals every field, `.Size` too).
_USES_SIZE = re.compile(r"\.Size\b|\{\{\s*json\s+\.\s*\}\}")


def _sizes_asked(parsed: Parsed) -> bool:
    """Whether the daemon is asked for sizes: `--size` as given, else when the template uses
    `.Size` (and not `--quiet`), as docker/cli v29.7.2 cli/command/container/list.go decides:
    `--size=false` given explicitly keeps them off."""
    given = parsed.flags.get("--size", []) + parsed.flags.get("-s", [])
    if given:
        return given[-1] not in _FALSE
    fmt = parsed.one("--format")
    quiet = parsed.has("-q", "--quiet")
    return fmt is not None and not quiet and _USES_SIZE.search(fmt) is not None


def walked_bytes(host: HostState, args: list[str]) -> int:
    """The writable layers the daemon walks to answer this `docker ps`: those of every listed
    container when sizes are asked (the walk is the cost: seconds for a big layer), else none."""
    parsed = parse(args, _PS_VALUES, _PS_BOOLS, "ps")
    if isinstance(parsed, Done) or not _sizes_asked(parsed):
        return 0
    show_all = parsed.has("-a", "--all")
    return sum(c.layer_bytes for c in host.containers.values() if show_all or c.up)


def ps(host: HostState, args: list[str]) -> Done:
    parsed = parse(args, _PS_VALUES, _PS_BOOLS, "ps")
    if isinstance(parsed, Done):
        return parsed
    if parsed.rest:
        return fail("\"docker ps\" accepts no arguments.\nSee 'docker ps --help'.", 1)
    show_all = parsed.has("-a", "--all")
    no_trunc = parsed.has("--no-trunc")
    size = _sizes_asked(parsed)
    selected = []
    for c in sorted(host.containers.values(), key=lambda c: -c.created_wall):
        if not show_all and not c.up:
            continue
        ok = _matches(c, parsed.many("--filter", "-f"))
        if isinstance(ok, str):
            return fail(ok)
        if ok:
            selected.append(c)
    rows = [_ps_row(c, no_trunc, size) for c in selected]
    if parsed.has("-q", "--quiet"):
        return Done(stdout="".join(r["ID"] + "\n" for r in rows))
    fmt = parsed.one("--format")
    if fmt is not None and fmt != "table":
        if fmt.strip() == "{{json .}}":
            return Done(stdout="".join(go_json(r) + "\n" for r in rows))
        return Done(stdout="".join(render_template(fmt, r) + "\n" for r in rows))
    table = [["CONTAINER ID", "IMAGE", "COMMAND", "CREATED", "STATUS", "PORTS", "NAMES"]]
    for r in rows:
        table.append(
            [r["ID"], r["Image"], r["Command"], r["RunningFor"], r["Status"], "", r["Names"]]
        )
    return Done(stdout=tabwriter(table, minwidth=10))


def logs(host: HostState, args: list[str]) -> Done:
    parsed = parse(
        args, {"--tail", "-n", "--since", "--until"}, {"-t", "--timestamps", "-f"}, "logs"
    )
    if isinstance(parsed, Done):
        return parsed
    if len(parsed.rest) != 1:
        return fail('"docker logs" requires exactly 1 argument.', 1)
    c = host.container(parsed.rest[0])
    if c is None:
        return no_such(parsed.rest[0])
    lines = c.logs
    tail = parsed.one("--tail", "-n")
    if tail is not None and tail != "all":
        lines = lines[-int(tail) :] if int(tail) > 0 else []
    return Done(stdout="".join(line + "\n" for line in lines))


# `docker inspect CONTAINER` prints the engine's answer as it is, indented by four spaces
# (docker/cli cli/command/inspect/inspector.go `NewIndentedInspector`, read at commit 28064c20);
# its fields are moby's api/types/container/container.go
# `InspectResponse` (`ContainerJSONBase` embedded, then Mounts, Config, NetworkSettings; read at
# moby commit 927e07e4) and hostconfig.go `HostConfig`. Those sparkd reads are filled in as the
# real engine fills them (tests/realdocker compares the shapes); the rest keep their types.
_GPU_REQUEST = {
    "Driver": "",
    "Count": -1,
    "DeviceIDs": None,
    "Capabilities": [["gpu"]],
    "Options": {},
}


def _inspect_value(host: HostState, c: Container) -> dict[str, Any]:
    main_pid = c.processes[0].pid if c.running and c.processes else 0
    root = f"/var/lib/docker/containers/{c.id}"
    binds = [f"{m.source}:{m.destination}" + (":ro" if m.read_only else "") for m in c.mounts]
    return {
        "Id": c.id,
        "Created": rfc3339(c.created_wall),
        "Path": ENTRYPOINT,
        "Args": c.command,
        "State": {
            "Status": c.status,
            "Running": c.up,
            "Paused": False,
            "Restarting": c.restarting,
            "OOMKilled": c.oom_killed,
            "Dead": False,
            "Pid": main_pid,
            "ExitCode": c.exit_code,
            "Error": "",
            "StartedAt": rfc3339(c.started_wall),
            "FinishedAt": rfc3339(c.finished_wall),
        },
        "Image": c.image_id or image_id(host, c.image),
        "ResolvConfPath": f"{root}/resolv.conf",
        "HostnamePath": f"{root}/hostname",
        "HostsPath": f"{root}/hosts",
        "LogPath": f"{root}/{c.id}-json.log",
        "Name": "/" + c.name,
        "RestartCount": c.restart_count,
        "Driver": "overlay2",
        "Platform": "linux",
        "MountLabel": "",
        "ProcessLabel": "",
        "AppArmorProfile": "",
        # null with no exec running, as Go marshals a nil slice.
        "ExecIDs": list(c.exec_ids) or None,
        "HostConfig": {
            "Binds": binds or None,
            "ContainerIDFile": "",
            "LogConfig": {"Type": "json-file", "Config": {}},
            "NetworkMode": c.network,
            "PortBindings": {},
            "RestartPolicy": {"Name": c.restart, "MaximumRetryCount": 0},
            "AutoRemove": False,
            "VolumeDriver": "",
            "VolumesFrom": None,
            "CapAdd": None,
            "CapDrop": None,
            "CgroupnsMode": "private",
            "Dns": [],
            "DnsOptions": [],
            "DnsSearch": [],
            "ExtraHosts": None,
            "GroupAdd": None,
            "IpcMode": "private",
            "Cgroup": "",
            "Links": None,
            "OomScoreAdj": 0,
            "PidMode": "",
            "Privileged": False,
            "PublishAllPorts": False,
            "ReadonlyRootfs": False,
            "SecurityOpt": None,
            "UTSMode": "",
            "UsernsMode": "",
            "ShmSize": _bytes(c.shm_size) if c.shm_size else 67108864,
            "Runtime": "runc",
            "Isolation": "",
            "CpuShares": 0,
            "Memory": 0,
            "DeviceRequests": [dict(_GPU_REQUEST)] if c.gpus else None,
            "Init": None,
        },
        "GraphDriver": {
            "Data": {
                "MergedDir": f"/var/lib/docker/overlay2/{c.id}/merged",
                "UpperDir": f"/var/lib/docker/overlay2/{c.id}/diff",
                "WorkDir": f"/var/lib/docker/overlay2/{c.id}/work",
            },
            "Name": "overlay2",
        },
        "Mounts": [
            {
                "Type": "bind",
                "Source": m.source,
                "Destination": m.destination,
                "Mode": "ro" if m.read_only else "",
                "RW": not m.read_only,
                "Propagation": "rprivate",
            }
            for m in c.mounts
        ],
        "Config": {
            "Hostname": host.name,
            "Domainname": "",
            "User": "",
            "AttachStdin": False,
            "AttachStdout": False,
            "AttachStderr": False,
            "Tty": False,
            "OpenStdin": False,
            "StdinOnce": False,
            # The image's own first, then `docker run -e`'s (the engine appends or replaces).
            "Env": [*IMAGE_ENV, *(f"{k}={v}" for k, v in c.env.items())],
            "Cmd": c.command,
            "Image": c.image,
            "Volumes": None,
            "WorkingDir": "",
            "Entrypoint": [ENTRYPOINT],
            "OnBuild": None,
            "Labels": dict(c.labels),
        },
        "NetworkSettings": {
            "SandboxID": "",
            "SandboxKey": "",
            "Ports": {},
            "Networks": {
                c.network: {
                    "IPAMConfig": None,
                    "Links": None,
                    "Aliases": None,
                    "MacAddress": "",
                    "NetworkID": "",
                    "EndpointID": "",
                    "Gateway": "",
                    "IPAddress": "",
                    "IPPrefixLen": 0,
                    "IPv6Gateway": "",
                    "GlobalIPv6Address": "",
                    "GlobalIPv6PrefixLen": 0,
                    "DriverOpts": None,
                    "DNSNames": None,
                }
            },
        },
    }


def inspect(host: HostState, args: list[str]) -> Done:
    parsed = parse(args, {"--format", "-f", "--type"}, {"-s", "--size"}, "inspect")
    if isinstance(parsed, Done):
        return parsed
    kind = parsed.one("--type")
    found, missing = [], []
    for ref in parsed.rest:
        c = host.container(ref) if kind in (None, "container") else None
        image = find_image(host, ref) if c is None and kind in (None, "image") else None
        if c is not None:
            found.append(_inspect_value(host, c))
        elif image is not None:
            found.append(image_value(host, image))
        else:
            missing.append(ref)
    fmt = parsed.one("--format", "-f")
    if fmt is not None:
        # With nothing found the CLI still prints the (empty) result's line.
        out = "".join(render_template(fmt, v) + "\n" for v in found) or "\n"
    else:
        out = go_json(found, indent=4) + "\n" if found else "[]\n"
    err = "".join(f"Error: No such object: {m}\n" for m in missing)
    return Done(out, err, 1 if missing else 0)


def top(host: HostState, args: list[str]) -> Done:
    if not args:
        return fail('"docker top" requires at least 1 argument.', 1)
    c = host.container(args[0])
    if c is None:
        return no_such(args[0])
    if c.restarting:
        return is_restarting(c)
    if not c.running:
        return not_running(c)
    return _ps_table(c.processes, args[1:])


def _bytes(size: str) -> int:
    units = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    size = size.strip().lower()
    if size and size[-1] in units:
        return int(float(size[:-1]) * units[size[-1]])
    return int(size)


_PS_COLUMNS: dict[str, str] = {
    "pid": "PID",
    "ppid": "PPID",
    "user": "USER",
    "uid": "UID",
    "etimes": "ELAPSED",
    "etime": "ELAPSED",
    "times": "TIME",
    "time": "TIME",
    "cputime": "TIME",
    "cputimes": "TIME",
    "args": "COMMAND",
    "cmd": "CMD",
    "command": "COMMAND",
    "comm": "COMMAND",
}


def _etime(seconds: int) -> str:
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    text = f"{minutes:02d}:{secs:02d}"
    if hours or days:
        text = f"{hours:02d}:{text}"
    if days:
        text = f"{days}-{text}"
    return text


def _cputime(seconds: int) -> str:
    """procps' TIME column: [DD-]HH:MM:SS of cumulative CPU time."""
    days, rem = divmod(seconds, 86400)
    text = f"{rem // 3600:02d}:{rem % 3600 // 60:02d}:{rem % 60:02d}"
    return f"{days}-{text}" if days else text


def _ps_table(processes: list[SimProcess], ps_args: list[str]) -> Done:
    columns = ["uid", "pid", "ppid", "c", "stime", "tty", "time", "cmd"]
    i = 0
    while i < len(ps_args):
        arg = ps_args[i]
        if arg in ("-o", "-eo", "-ao", "-e", "-A", "-ef", "aux", "-aux", "axo", "-axo"):
            if arg.endswith("o"):
                if i + 1 >= len(ps_args):
                    return fail(f"{DAEMON}: ps: error: list of format specifiers expected", 1)
                columns = ps_args[i + 1].split(",")
                i += 1
        elif arg.startswith("-o"):
            columns = arg[2:].split(",")
        else:
            return fail(f"{DAEMON}: ps: error: unsupported option (BSD syntax)\n", 1)
        i += 1
    now = time.monotonic()
    headers = {"uid": "UID", "c": "C", "stime": "STIME", "tty": "TTY"}
    rows: list[list[str]] = []
    titles = []
    for col in columns:
        name = col.split("=")[0]
        if name not in _PS_COLUMNS and name not in headers:
            return fail(f'{DAEMON}: ps: error: unknown user-defined format specifier "{name}"', 1)
        titles.append(
            col.split("=", 1)[1] if "=" in col else _PS_COLUMNS.get(name, headers.get(name, ""))
        )
    rows.append(titles)
    for proc in processes:
        elapsed = max(0, int(now - proc.started))
        cpu = int(proc.cpu_seconds(now))
        values = {
            "pid": str(proc.pid),
            "ppid": str(proc.ppid),
            "user": proc.user,
            "uid": proc.user,
            "etimes": str(elapsed),
            "etime": _etime(elapsed),
            "args": proc.args,
            "cmd": proc.args,
            "command": proc.args,
            "comm": proc.args.split()[0].rsplit("/", 1)[-1] if proc.args else "",
            "c": "0",
            "stime": time.strftime("%H:%M", time.localtime(time.time() - elapsed)),
            "tty": "?",
            "time": _cputime(cpu),
            "cputime": _cputime(cpu),
            "times": str(cpu),
            "cputimes": str(cpu),
        }
        rows.append([values[c.split("=")[0]] for c in columns])
    return Done(stdout=tabwriter(rows))

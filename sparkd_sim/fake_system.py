"""`systemctl`, `nvidia-smi`, `ip`, `df`, `kill` and `cat` (boot id) of a simulated host."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from sparkd_sim.protocol import Done, fail
from sparkd_sim.reference import MANAGEMENT_INTERFACE
from sparkd_sim.state import HostState

KillPid = Callable[[HostState, int, int], bool]
"""Deliver signal `sig` to simulated PID `pid`; False if there is no such process."""

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

# -- systemctl ---------------------------------------------------------------------------------

_SHOW_DEFAULT = ["Id", "LoadState", "ActiveState", "SubState", "UnitFileState"]


def _unit_name(name: str) -> str:
    return name if "." in name else name + ".service"


def systemctl(host: HostState, args: list[str]) -> Done:
    props: list[str] = []
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-p", "--property"):
            if i + 1 >= len(args):
                return fail(f"systemctl: option '{arg}' requires an argument", 1)
            props.extend(args[i + 1].split(","))
            i += 1
        elif arg.startswith("--property="):
            props.extend(arg.split("=", 1)[1].split(","))
        elif arg.startswith("-p") and len(arg) > 2:
            props.extend(arg[2:].split(","))
        elif arg in ("--quiet", "-q", "--now", "--value"):
            positional.append(arg)
        elif arg in ("--no-pager", "--no-block", "--system"):
            pass
        elif arg == "--":  # getopt's end of options, as real systemctl accepts
            positional.extend(args[i + 1 :])
            break
        elif arg.startswith("-"):
            return fail(f"systemctl: unrecognized option '{arg}'", 1)
        else:
            positional.append(arg)
        i += 1
    quiet = "--quiet" in positional or "-q" in positional
    now = "--now" in positional
    value_only = "--value" in positional
    positional = [p for p in positional if not p.startswith("-")]
    if not positional:
        return fail("systemctl: listing units is not simulated", 1)
    verb, names = positional[0], [_unit_name(n) for n in positional[1:]]
    if verb == "show":
        return _show(host, names, props or _SHOW_DEFAULT, value_only)
    if not names and verb in ("stop", "start", "restart", "disable", "enable", "is-active"):
        return fail("Too few arguments.", 1)
    if verb == "stop":
        return _stop(host, names)
    if verb == "start" or verb == "restart":
        missing = [n for n in names if n not in host.units]
        if missing:
            return fail(f"Failed to {verb} {missing[0]}: Unit {missing[0]} not found.", 5)
        for n in names:
            host.units[n].active = True
        return Done()
    if verb == "disable":
        return _disable(host, names, now)
    if verb == "enable":
        err = ""
        for n in names:
            unit = host.units.get(n)
            if unit is None:
                return fail(f"Failed to enable unit: Unit file {n} does not exist.", 1)
            if not unit.enabled:
                unit.enabled = True
                err += (
                    f"Created symlink /etc/systemd/system/multi-user.target.wants/{n} → "
                    f"/etc/systemd/system/{n}.\n"
                )
        return Done(stderr=err)
    if verb == "is-active":
        out, rc = "", 3
        states = [
            "active" if n in host.units and host.units[n].active else "inactive" for n in names
        ]
        rc = 0 if all(s == "active" for s in states) else 3
        out = "".join(s + "\n" for s in states)
        return Done(stdout="" if quiet else out, rc=rc)
    if verb == "is-enabled":
        out, err, rc = "", "", 0
        for n in names:
            unit = host.units.get(n)
            if unit is None:
                err += f"Failed to get unit file state for {n}: No such file or directory\n"
                rc = 1
            else:
                out += ("enabled" if unit.enabled else "disabled") + "\n"
                rc = rc or (0 if unit.enabled else 1)
        return Done("" if quiet else out, err, rc)
    return fail(f"Unknown command verb {verb}.", 1)


def _show(host: HostState, names: list[str], props: list[str], value_only: bool) -> Done:
    blocks = []
    for name in names:
        unit = host.units.get(name)
        values = {
            "Id": name,
            "Names": name,
            "LoadState": "loaded" if unit else "not-found",
            "ActiveState": "active" if unit and unit.active else "inactive",
            "SubState": "running" if unit and unit.active else "dead",
            "UnitFileState": ("enabled" if unit.enabled else "disabled") if unit else "",
            "Description": unit.description if unit else name,
            "MainPID": "0",
        }
        lines = [values.get(p, "") if value_only else f"{p}={values.get(p, '')}" for p in props]
        blocks.append("".join(line + "\n" for line in lines))
    return Done(stdout="\n".join(blocks))


def _stop(host: HostState, names: list[str]) -> Done:
    err = ""
    rc = 0
    for name in names:
        unit = host.units.get(name)
        if unit is None:
            err += f"Failed to stop {name}: Unit {name} not loaded.\n"
            rc = 5
        else:
            unit.active = False
    return Done(stderr=err, rc=rc)


def _disable(host: HostState, names: list[str], now: bool) -> Done:
    err = ""
    for name in names:
        unit = host.units.get(name)
        if unit is None:
            return fail(f"Failed to disable unit: Unit file {name} does not exist.", 1)
        if unit.enabled:
            unit.enabled = False
            err += f'Removed "/etc/systemd/system/multi-user.target.wants/{name}".\n'
        if now:
            unit.active = False
    return Done(stderr=err)


# -- nvidia-smi --------------------------------------------------------------------------------

_GPU_FIELDS: dict[str, tuple[str, str | None]] = {
    # name -> (header, unit shown after the value unless nounits)
    "index": ("index", None),
    "uuid": ("uuid", None),
    "name": ("name", None),
    "driver_version": ("driver_version", None),
    "memory.total": ("memory.total [MiB]", "MiB"),
    "memory.used": ("memory.used [MiB]", "MiB"),
    "memory.free": ("memory.free [MiB]", "MiB"),
    "utilization.gpu": ("utilization.gpu [%]", "%"),
    "temperature.gpu": ("temperature.gpu", None),
    "pci.bus_id": ("pci.bus_id", None),
    "count": ("count", None),
    "power.draw": ("power.draw [W]", "W"),
}
_APP_FIELDS: dict[str, tuple[str, str | None]] = {
    "pid": ("pid", None),
    "process_name": ("process_name", None),
    "name": ("process_name", None),
    "used_memory": ("used_gpu_memory [MiB]", "MiB"),
    "used_gpu_memory": ("used_gpu_memory [MiB]", "MiB"),
    "gpu_uuid": ("gpu_uuid", None),
}


# What nvidia-smi prints, and its status, once the GPU fell off the bus (Xid 79).
GPU_LOST = "Unable to determine the device handle for GPU0000:0F:01.0: Unknown Error"
GPU_LOST_RC = 15


def nvidia_smi(host: HostState, args: list[str]) -> Done:
    if host.gpu_lost and not any(a.startswith("-h") or a == "--help" for a in args):
        return fail(GPU_LOST, GPU_LOST_RC)
    query_gpu = query_apps = fmt = None
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "--query-gpu":
            query_gpu = value
        elif key == "--query-compute-apps":
            query_apps = value
        elif key == "--format":
            fmt = value
        elif arg == "-L" or arg == "--list-gpus":
            return Done(stdout=f"GPU 0: NVIDIA GB10 (UUID: {host.gpu_uuid})\n")
        else:
            return fail(
                "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 2
            )
    if query_gpu is None and query_apps is None:
        return Done(stdout=_table(host))
    if fmt is None:
        return fail("Option --format is required for --query-* options.", 2)
    options = fmt.split(",")
    if options[0] != "csv":
        return fail(f'"{fmt}" is not a valid format.', 2)
    header = "noheader" not in options
    units = "nounits" not in options
    if query_gpu is not None:
        fields = query_gpu.split(",")
        bad = [f for f in fields if f not in _GPU_FIELDS]
        if bad:
            return fail(
                f'Field "{bad[0]}" is not a valid field to query.\n\n'
                "Please run 'nvidia-smi --help-query-gpu' for more information.",
                2,
            )
        values = {
            "index": "0",
            "uuid": host.gpu_uuid,
            "name": "NVIDIA GB10",
            "driver_version": "580.142",
            "memory.total": "[N/A]",
            "memory.used": "[N/A]",
            "memory.free": "[N/A]",
            "utilization.gpu": "0",
            "temperature.gpu": "41",
            "pci.bus_id": "0000000F:01:00.0",
            "count": "1",
            "power.draw": "[N/A]",
        }
        return Done(
            stdout=_csv(
                [_GPU_FIELDS[f] for f in fields], [[values[f] for f in fields]], header, units
            )
        )
    assert query_apps is not None
    fields = query_apps.split(",")
    bad = [f for f in fields if f not in _APP_FIELDS]
    if bad:
        return fail(
            f'Field "{bad[0]}" is not a valid field to query.\n\n'
            "Please run 'nvidia-smi --help-query-compute-apps' for more information.",
            2,
        )
    rows = []
    for proc in host.gpu_processes:
        if proc.graphics:
            continue
        values = {
            "pid": str(proc.pid),
            "process_name": proc.name,
            "name": proc.name,
            "used_memory": str(proc.used_mib),
            "used_gpu_memory": str(proc.used_mib),
            "gpu_uuid": host.gpu_uuid,
        }
        rows.append([values[f] for f in fields])
    return Done(stdout=_csv([_APP_FIELDS[f] for f in fields], rows, header, units))


def _csv(
    columns: list[tuple[str, str | None]], rows: list[list[str]], header: bool, units: bool
) -> str:
    out = []
    if header:
        out.append(", ".join(h if units else h.split(" [")[0] for h, _ in columns))
    for row in rows:
        cells = []
        for (_, unit), value in zip(columns, row, strict=True):
            show_unit = units and unit is not None and not value.startswith("[")
            cells.append(f"{value} {unit}" if show_unit else value)
        out.append(", ".join(cells))
    return "".join(line + "\n" for line in out)


def _table(host: HostState) -> str:
    rule = "+" + "-" * 89 + "+"
    split = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    lines = [
        rule,
        "| NVIDIA-SMI 580.142"
        + " " * 16
        + "Driver Version: 580.142"
        + " " * 8
        + "CUDA Version: 13.0     |",
        split,
        "|   0  NVIDIA GB10" + " " * 20 + "On  |   0000000F:01:00.0 Off |" + " " * 18 + "N/A |",
        "| N/A   41C    P8"
        + " " * 14
        + "4W /  N/A  | Not Supported"
        + " " * 10
        + "|      0%      Default |",
        split,
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI              PID   Type   Process name" + " " * 24 + "GPU Memory |",
        "|        ID   ID" + " " * 63 + "Usage      |",
        "|" + "=" * 89 + "|",
    ]
    for proc in host.gpu_processes:
        kind = "G" if proc.graphics else "C"
        usage = f"{proc.used_mib}MiB"
        lines.append(
            f"|    0   N/A  N/A    {proc.pid:>12}      {kind}   {proc.name:<36}{usage:>9} |"
        )
    lines.append(rule)
    return "".join(line + "\n" for line in lines)


# -- ip ----------------------------------------------------------------------------------------


def ip(host: HostState, args: list[str]) -> Done:
    as_json = False
    family = None
    rest = []
    for arg in args:
        if arg in ("-j", "-json", "--json"):
            as_json = True
        elif arg in ("-4", "-6"):
            family = arg
        elif arg in ("-br", "-brief", "-p", "-pretty"):
            continue
        else:
            rest.append(arg)
    if rest and rest[0] in ("route", "r", "ro"):
        return _route(host, rest[1:], as_json)
    if not rest or rest[0] not in ("addr", "address", "a", "link"):
        obj = rest[0] if rest else ""
        return fail(f'Object "{obj}" is unknown, try "ip help".', 255)
    words = rest[1:]
    if words and words[0] in ("show", "list", "ls"):
        words = words[1:]
    if words and words[0] == "dev":
        words = words[1:]
    device = words[0] if words else None
    if device is not None and device != host.interface:
        return fail(f'Device "{device}" does not exist.', 1)
    addr_info = []
    if family != "-6":
        addr_info.append(
            {
                "family": "inet",
                "local": host.data_ip,
                "prefixlen": 24,
                "broadcast": host.data_ip.rsplit(".", 1)[0] + ".255",
                "scope": "global",
                "noprefixroute": True,
                "label": host.interface,
                "valid_life_time": 4294967295,
                "preferred_life_time": 4294967295,
            }
        )
    link = {
        "ifindex": 2,
        "ifname": host.interface,
        "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
        "mtu": 9000,
        "qdisc": "mq",
        "operstate": "UP",
        "group": "default",
        "txqlen": 1000,
        "link_type": "ether",
        "address": "4c:bb:47:2c:10:" + f"{int(host.address.rsplit('.', 1)[1]) % 256:02x}",
        "broadcast": "ff:ff:ff:ff:ff:ff",
        "addr_info": addr_info,
    }
    if as_json:
        return Done(stdout=json.dumps([link], separators=(",", ":")) + "\n")
    text = (
        f"2: {host.interface}: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP "
        f"group default qlen 1000\n    link/ether {link['address']} brd ff:ff:ff:ff:ff:ff\n"
    )
    for info in addr_info:
        text += (
            f"    inet {info['local']}/24 brd {info['broadcast']} scope global noprefixroute "
            f"{host.interface}\n       valid_lft forever preferred_lft forever\n"
        )
    return Done(stdout=text)


def _route(host: HostState, words: list[str], as_json: bool) -> Done:
    """`ip route [show]` and `ip route get ADDR`: the default route leaves by the management
    network when the data IP is on a network of its own (as on a real Spark)."""
    separate = host.data_ip != host.address
    mgmt_dev = MANAGEMENT_INTERFACE if separate else host.interface
    gateway = host.address.rsplit(".", 1)[0] + ".1"
    data_net = host.data_ip.rsplit(".", 1)[0] + ".0/24"
    if words and words[0] == "get":
        if len(words) < 2:
            return fail('Error: an inet prefix is expected rather than "".', 1)
        target = words[1]
        on_data = target.rsplit(".", 1)[0] == host.data_ip.rsplit(".", 1)[0]
        dev, src = (host.interface, host.data_ip) if on_data else (mgmt_dev, host.address)
        via = "" if on_data else f"via {gateway} "
        return Done(stdout=f"{target} {via}dev {dev} src {src} uid 0 \n    cache \n")
    if words and words[0] not in ("show", "list", "ls"):
        return fail(f'Command "{words[0]}" is unknown, try "ip route help".', 255)
    routes = [
        {
            "dst": "default",
            "gateway": gateway,
            "dev": mgmt_dev,
            "protocol": "dhcp",
            "prefsrc": host.address,
            "metric": 100,
            "flags": [],
        },
        {
            "dst": data_net,
            "dev": host.interface,
            "protocol": "kernel",
            "scope": "link",
            "prefsrc": host.data_ip,
            "flags": [],
        },
    ]
    if as_json:
        return Done(stdout=json.dumps(routes, separators=(",", ":")) + "\n")
    return Done(
        stdout=(
            f"default via {gateway} dev {mgmt_dev} proto dhcp src {host.address} metric 100 \n"
            f"{data_net} dev {host.interface} proto kernel scope link src {host.data_ip} \n"
        )
    )


# -- df ----------------------------------------------------------------------------------------

DOCKER_ROOT = "/var/lib/docker"


def df(host: HostState, args: list[str]) -> Done:
    block = 1024
    output: list[str] | None = None
    posix = False
    paths = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-B"):
            value = arg[2:] or (args[i + 1] if i + 1 < len(args) else "")
            if not arg[2:]:
                i += 1
            block = _block_size(value)
        elif arg.startswith("--block-size="):
            block = _block_size(arg.split("=", 1)[1])
        elif arg.startswith("--output="):
            output = arg.split("=", 1)[1].split(",")
        elif arg in ("-P", "--portability"):
            posix = True
        elif arg in ("-k",):
            block = 1024
        elif arg.startswith("-"):
            return fail(
                f"df: invalid option -- '{arg.lstrip('-')}'\nTry 'df --help' for more information.",
                1,
            )
        else:
            paths.append(arg)
        i += 1
    # As GNU df: a path that does not exist is an error line (exit 1), the others still get
    # their rows. Docker's data root exists on every simulated host (it runs Docker).
    missing = [p for p in paths if not os.path.exists(p) and p != DOCKER_ROOT]
    errors = "".join(f"df: {p}: No such file or directory\n" for p in missing)
    paths = [p for p in paths if p not in missing]
    if missing and not paths:
        return fail(errors.rstrip("\n"), 1)
    total, avail = host.disk_total_bytes, host.disk_avail_bytes
    used = total - avail
    if output is not None:
        headers = {
            "avail": "Avail",
            "size": "Size",
            "used": "Used",
            "target": "Mounted on",
            "source": "Filesystem",
            "pcent": "Use%",
        }
        if block == 1:
            headers.update(size="1B-blocks")
        values = {
            "avail": str(-(-avail // block)),
            "size": str(-(-total // block)),
            "used": str(-(-used // block)),
            "target": "/",
            "source": "/dev/nvme0n1p2",
            "pcent": f"{-(-used * 100 // total)}%",
        }
        bad = [o for o in output if o not in values]
        if bad:
            return fail(
                f"df: option --output: field '{bad[0]}' unknown\n"
                "Try 'df --help' for more information.",
                1,
            )
        rows = [[headers[o] for o in output]] + [
            [values[o] for o in output] for _ in paths or ["/"]
        ]
        widths = [max(len(r[c]) for r in rows) for c in range(len(output))]
        text = "".join(
            " ".join(
                cell.rjust(widths[c])
                if output[c] not in ("target", "source")
                else cell.ljust(widths[c])
                for c, cell in enumerate(row)
            ).rstrip()
            + "\n"
            for row in rows
        )
        return Done(stdout=text, stderr=errors, rc=1 if missing else 0)
    header = (
        "Filesystem     1024-blocks       Used  Available Capacity Mounted on\n"
        if posix or block == 1024
        else "Filesystem       1B-blocks          Used     Available Use% Mounted on\n"
    )
    line = (
        f"/dev/nvme0n1p2 {total // block:>11} {used // block:>10} {avail // block:>10} "
        f"{-(-used * 100 // total):>7}% /\n"
    )
    return Done(stdout=header + line * max(1, len(paths)), stderr=errors, rc=1 if missing else 0)


def _block_size(value: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3, "": 1}
    digits = value.rstrip("KMGkmg")
    suffix = value[len(digits) :].upper()
    return int(digits or "1") * units.get(suffix, 1)


# -- kill and cat ------------------------------------------------------------------------------

_SIGNALS = {
    "HUP": 1,
    "INT": 2,
    "QUIT": 3,
    "KILL": 9,
    "USR1": 10,
    "USR2": 12,
    "TERM": 15,
    "CONT": 18,
    "STOP": 19,
    "TSTP": 20,
    "0": 0,
}


def kill(host: HostState, args: list[str], deliver: KillPid) -> Done:
    sig = 15
    pids: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            pids.extend(args[i + 1 :])
            break
        if arg in ("-s", "--signal"):
            if i + 1 >= len(args):
                return fail("kill: option requires an argument -- 's'", 1)
            name = args[i + 1].upper().removeprefix("SIG")
            i += 1
            if name not in _SIGNALS and not name.isdigit():
                return fail(f"kill: unknown signal: {args[i]}", 1)
            sig = int(name) if name.isdigit() else _SIGNALS[name]
        elif arg.startswith("-") and len(arg) > 1:
            name = arg[1:].upper().removeprefix("SIG")
            if name.isdigit():
                sig = int(name)
            elif name in _SIGNALS:
                sig = _SIGNALS[name]
            else:
                return fail(f"kill: unknown signal: {arg[1:]}", 1)
        else:
            pids.append(arg)
        i += 1
    if not pids:
        return fail("\nUsage:\n kill [options] <pid> [...]\n", 1)
    err = ""
    for pid in pids:
        if not pid.isdigit():
            err += f"kill: failed to parse argument: '{pid}'\n"
            continue
        if not deliver(host, int(pid), sig):
            err += f"kill: ({pid}): No such process\n"
    return Done(stderr=err, rc=1 if err else 0)


def cat_boot_id(host: HostState, args: list[str]) -> Done:
    if args == [BOOT_ID_PATH]:
        return Done(stdout=host.boot_id + "\n")
    # The client only forwards the boot id; anything else is a world/client mismatch.
    return fail(f"cat: {' '.join(args)}: not forwarded by the simulated cat", 1)

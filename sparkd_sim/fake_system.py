"""`systemctl`, `df`, `kill` and `cat` (boot id) of a simulated host (`nvidia-smi` and `ip` have
modules of their own)."""

from __future__ import annotations

import os
from collections.abc import Callable

from sparkd_sim.protocol import Done, fail
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
        elif arg == "--no-legend" or arg.startswith(("--type=", "--state=")):
            positional.append(arg)
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
    options = [p for p in positional if p.startswith("-")]
    positional = [p for p in positional if not p.startswith("-")]
    if not positional:
        return fail("systemctl: listing units is not simulated", 1)
    verb, names = positional[0], [_unit_name(n) for n in positional[1:]]
    if verb == "show":
        return _show(host, names, props or _SHOW_DEFAULT, value_only)
    if verb == "list-unit-files":
        return _list_unit_files(host, names, options)
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


def _list_unit_files(host: HostState, patterns: list[str], options: list[str]) -> Done:
    """`systemctl list-unit-files [--type=T] [--state=S] [--no-legend] [PATTERN...]` as systemd
    252 (Debian 12) prints it (src/systemctl/systemctl-list-unit-files.c v252: a table of UNIT
    FILE, STATE and PRESET, the name column as wide as the longest name; without --no-legend a
    header and an `N unit files listed.` line). The simulated units are services; their preset
    is `enabled` (Debian's 90-systemd.preset enables what a package ships)."""
    import fnmatch

    types = [o.split("=", 1)[1] for o in options if o.startswith("--type=")]
    states = [s for o in options if o.startswith("--state=") for s in o.split("=", 1)[1].split(",")]
    rows = []
    for name in sorted(host.units):
        state = "enabled" if host.units[name].enabled else "disabled"
        if types and name.rpartition(".")[2] not in types:
            continue
        if states and state not in states:
            continue
        if patterns and not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            continue
        rows.append((name, state, "enabled"))
    legend = "--no-legend" not in options
    width = max([len(r[0]) for r in rows] + ([len("UNIT FILE")] if legend else [0]))
    out = ""
    if legend:
        out += f"{'UNIT FILE':<{width}} {'STATE':<8} PRESET\n"
    for name, state, preset in rows:
        out += f"{name:<{width}} {state:<8} {preset}\n"
    if legend:
        out += f"\n{len(rows)} unit files listed.\n"
    return Done(stdout=out)


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

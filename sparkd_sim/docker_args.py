"""docker's CLI as it reads a command line: flags before the first positional argument, and the
errors the daemon and the CLI print."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkd_sim.protocol import Done, fail
from sparkd_sim.state import Container

DAEMON = "Error response from daemon"


def no_such(ref: str) -> Done:
    return fail(f"{DAEMON}: No such container: {ref}")


def not_running(c: Container) -> Done:
    return fail(f"{DAEMON}: Container {c.id} is not running")


def is_restarting(c: Container) -> Done:
    return fail(f"{DAEMON}: Container {c.id} is restarting, wait until the container is running")


def _unknown_flag(cmd: str, flag: str) -> Done:
    name = flag.lstrip("-")
    kind = "flag" if flag.startswith("--") else "shorthand flag"
    shown = f"--{name}" if flag.startswith("--") else f"'{name[0]}' in {flag}"
    return fail(f"unknown {kind}: {shown}\nSee 'docker {cmd} --help'.", rc=125)


@dataclass
class Parsed:
    flags: dict[str, list[str]] = field(default_factory=dict)
    rest: list[str] = field(default_factory=list)

    def one(self, *names: str) -> str | None:
        for name in names:
            if name in self.flags:
                return self.flags[name][-1]
        return None

    def many(self, *names: str) -> list[str]:
        return [v for name in names for v in self.flags.get(name, [])]

    def has(self, *names: str) -> bool:
        return any(name in self.flags for name in names)


def parse(args: list[str], value_flags: set[str], bool_flags: set[str], cmd: str) -> Parsed | Done:
    """Flags up to the first positional argument, as docker's CLI (interspersed off) parses."""
    parsed = Parsed()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            parsed.rest = args[i + 1 :]
            return parsed
        if not arg.startswith("-") or arg == "-":
            parsed.rest = args[i:]
            return parsed
        name, eq, value = arg.partition("=")
        if name in value_flags:
            if not eq:
                if i + 1 >= len(args):
                    return fail(f"flag needs an argument: {name}\nSee 'docker {cmd} --help'.", 125)
                i += 1
                value = args[i]
            parsed.flags.setdefault(name, []).append(value)
        elif name in bool_flags:
            parsed.flags.setdefault(name, []).append(value or "true")
        elif (
            not name.startswith("--")
            and len(name) > 2
            and all(f"-{c}" in bool_flags for c in name[1:])
        ):
            for c in name[1:]:
                parsed.flags.setdefault(f"-{c}", []).append("true")
        else:
            return _unknown_flag(cmd, name)
        i += 1
    return parsed

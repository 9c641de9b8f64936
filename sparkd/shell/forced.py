"""An `authorized_keys` forced command that lets through only the catalogue's command shapes.

For each host, the exact text of every command sparkd sends it (built by `catalogue` from the
config, so with the config's timeouts, units, image and paths), plus anchored patterns for the
parts that vary at run time: a PID (digits, never 0 or 1), a container name matching
`cleanup.container_patterns`, the model's spec hash when the API key (and so its fingerprint)
may change. The wrapper is a Python 3 program using the standard library only: it runs on the
hosts. A command it refuses exits 126 with one line to syslog and stderr naming the command's
first word only (the full text may hold secrets).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from sparkd import __version__
from sparkd.core.spec import key_fingerprint, model_spec_hash
from sparkd.settings import ClusterSpec, HostSpec, SshSpec
from sparkd.shell import catalogue

WRAPPER_PATH = "/usr/local/sbin/sparkd-forced-command"
REFUSED_EXIT = 126
SIGNALS = ("TERM", "KILL")
# A PID sparkd may signal (catalogue.PID_DIGITS); the wrapper also refuses one not below the
# host's own pid_max.
PID_PATTERN = f"(?P<pid>{catalogue.PID_DIGITS})"
# Docker's own rule for container names; the wrapper also checks cleanup.container_patterns.
CONTAINER_PATTERN = r"(?P<container>[A-Za-z0-9][A-Za-z0-9_.-]{0,254})"
SPEC_PATTERN = r"(?P<spec>[0-9a-f]{12})"
# Stand-ins put where the variable parts go, then replaced by the patterns above.
_PID = 4_194_303
_CONTAINER = "sparkd-forced-container-stand-in"
_API_KEY = "sparkd-forced-api-key-stand-in"


@dataclass(frozen=True)
class Allowed:
    """What one host's wrapper lets through: exact texts, and anchored regular expressions."""

    exact: tuple[str, ...]
    patterns: tuple[str, ...]
    container_patterns: tuple[str, ...]


def _substitute(text: str, stand_in: str, first: str, again: str | None = None) -> str:
    """`text` as a regular expression matching only itself, with `stand_in` replaced by the
    pattern `first` (and later occurrences by `again`)."""
    parts = re.escape(text).split(re.escape(stand_in))
    if len(parts) < 2 or (again is None and len(parts) != 2):
        raise ValueError(f"stand-in {stand_in!r} appears {len(parts) - 1} times")
    result = parts[0] + first + parts[1]
    for part in parts[2:]:
        result += f"{again}{part}"
    return result


def allowed_commands(cluster: ClusterSpec, host: HostSpec) -> Allowed:
    """Every command sparkd may send `host`, from the catalogue with the timeouts it runs them
    with (the actions' `ssh.command_timeout`, the fact script's share of it)."""
    seconds = cluster.ssh.command_timeout
    exact: list[str] = []
    patterns: list[str] = []
    for where, remote in catalogue.catalogue(cluster, seconds):
        if where.name != host.name:
            continue
        if remote.name == "kill_process":
            for signal in SIGNALS:
                text = catalogue.kill_process(cluster, _PID, signal, seconds).command
                patterns.append(_substitute(text, str(_PID), PID_PATTERN))
        elif remote.name == "remove_container":
            text = catalogue.remove_container(_CONTAINER, seconds).command
            patterns.append(_substitute(text, _CONTAINER, CONTAINER_PATTERN))
        elif remote.name == "signal_serve":
            exact += [catalogue.signal_serve(cluster, s, seconds).command for s in SIGNALS]
        elif remote.name == "start_model" and cluster.model.api_key_file is not None:
            # The spec hash holds the key's fingerprint: a rotated key must still launch.
            text = catalogue.start_model(cluster, seconds, _API_KEY).command
            spec = model_spec_hash(cluster, key_fingerprint(_API_KEY))
            patterns.append(_substitute(text, spec, SPEC_PATTERN, "(?P=spec)"))
        elif remote.name == "start_model":
            exact.append(catalogue.start_model(cluster, seconds, None).command)
        else:
            exact.append(remote.command)
    return Allowed(
        exact=tuple(dict.fromkeys(exact)),
        patterns=tuple(dict.fromkeys(patterns)),
        container_patterns=tuple(cluster.cleanup.container_patterns),
    )


def public_key(ssh: SshSpec) -> str:
    """The public half of `ssh.key_file` (from the key, or its `.pub` beside it)."""
    try:
        key = asyncssh.read_private_key(ssh.key_file)
        return key.export_public_key().decode().strip() + " sparkd"
    except (OSError, ValueError, asyncssh.KeyImportError):
        pass
    try:
        return Path(f"{ssh.key_file}.pub").read_text().strip()
    except OSError:
        return f"<public key of {ssh.key_file}>"


def authorized_keys_line(
    cluster: ClusterSpec, host: HostSpec, key: str, path: str = WRAPPER_PATH
) -> str:
    """`restrict` forbids forwarding, a PTY, agent and X11 forwarding and ~/.ssh/rc; the head
    gets port forwarding back for its destinations only: the model endpoint the probe opens a
    channel to, and Ray's dashboard on its loopback. (Remote forwarding is forbidden in
    sshd_config: no key option can.)"""
    options = [f'command="{path}"', "restrict"]
    if host.name == cluster.head.name:
        target = cluster.model_host
        if ":" in target:
            target = f"[{target}]"
        options += ["port-forwarding", f'permitopen="{target}:{cluster.model.port}"']
        if cluster.ray.dashboard:
            # Ray's state, read from the dashboard on the head's loopback (shell.ray_http).
            options.append(f'permitopen="127.0.0.1:{cluster.ray.dashboard_port}"')
    return f"{','.join(options)} {key}"


def wrapper(cluster: ClusterSpec, host: HostSpec, key: str, path: str = WRAPPER_PATH) -> str:
    """The wrapper program for `host`, its header saying how to install it."""
    allowed = allowed_commands(cluster, host)
    line = authorized_keys_line(cluster, host, key, path)
    header = [
        "#!/usr/bin/python3",
        f"# sparkd {__version__} forced command for host {host.name} of cluster {cluster.name}.",
        "# It holds the exact commands for this config (timeouts, units, image, model, paths):",
        "# REGENERATE AND REINSTALL IT WHENEVER THE CONFIG OR SPARKD CHANGES, or sparkd's",
        "# commands are refused (exit 126).",
        f"# Install as root: {path}, owned by root, mode 0755. Check a command with",
        f"#   SSH_ORIGINAL_COMMAND='...' {path} --check",
        f"# Then, in ~{cluster.ssh.user}/.ssh/authorized_keys on {host.name}, instead of the",
        "# key's plain line:",
        f"# {line}",
    ]
    if host.name == cluster.head.name:
        header += [
            "# The key may then open channels to the model endpoint only; a key option cannot",
            "# also forbid remote forwarding (ssh -R), so add to the end of sshd_config:",
            f"#   Match User {cluster.ssh.user}",
            "#       AllowTcpForwarding local",
        ]
    body = _BODY.format(
        exact=_tuple(allowed.exact),
        patterns=_tuple(allowed.patterns),
        container_patterns=_tuple(allowed.container_patterns),
        refused=REFUSED_EXIT,
    )
    return "\n".join(header) + "\n" + body


def _tuple(values: tuple[str, ...]) -> str:
    if not values:
        return "()"
    return "(\n" + "".join(f"    {value!r},\n" for value in values) + ")"


_BODY = """
import fnmatch
import os
import re
import sys

EXACT = frozenset({exact})
PATTERNS = {patterns}
CONTAINER_PATTERNS = {container_patterns}
REFUSED = {refused}


def allowed(command):
    if command in EXACT:
        return True
    for pattern in PATTERNS:
        match = re.fullmatch(pattern, command)
        if match is None:
            continue
        name = match.groupdict().get("container")
        if name is not None and not any(
            fnmatch.fnmatchcase(name, p) for p in CONTAINER_PATTERNS
        ):
            continue
        pid = match.groupdict().get("pid")
        if pid is not None and int(pid) >= pid_max():
            continue
        return True
    return False


def pid_max():
    try:
        with open("/proc/sys/kernel/pid_max") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 4194304


def first_word(command):
    words = command.split(None, 1)
    if not words:
        return "(no command)"
    return re.sub(r"[^A-Za-z0-9_./:@+=-]", "?", words[0][:64])


def refuse(command):
    message = "sparkd forced command: refused %s" % first_word(command)
    try:
        import syslog

        syslog.openlog("sparkd-forced-command", syslog.LOG_PID, syslog.LOG_AUTHPRIV)
        syslog.syslog(syslog.LOG_WARNING, message)
    except Exception:
        pass
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    os._exit(REFUSED)


def main():
    command = os.environ.get("SSH_ORIGINAL_COMMAND")
    if command is None or not allowed(command):
        refuse(command or "")
    if sys.argv[1:] == ["--check"]:
        sys.exit(0)
    os.execv("/bin/sh", ["sh", "-c", command])


if __name__ == "__main__":
    main()
"""

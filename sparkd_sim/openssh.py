"""A simulated host behind a real OpenSSH sshd (Debian's openssh-server), for the test tier that
checks sparkd against OpenSSH itself rather than against asyncssh's server.

One `sshd -D` per host, on the host's own loopback address, with its own host key and the
world's client key as the only authorized key. sshd runs every command through a ForceCommand
wrapper, which reports the command to the world (its "ssh" record) and then runs it with `bash -c`
in the same clean environment the asyncssh server gives its sessions.

Faults act on sshd's processes by PID: stopping the listener and every per-connection process
drops the host; SIGSTOP on all of them leaves TCP accepted and unanswered (a blackhole).
Needs root: sshd's privilege separation does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from sparkd_sim.sshd import SimSshHost

# The account sshd logs the world's sessions in as: `nobody` has no login shell, and sshd runs
# every command (the ForceCommand too) through the account's shell.
LOGIN_USER = "sparkd-sim"
LOGIN_HOME = Path("/var/lib/sparkd-sim")
_START_TIMEOUT = 10.0


def find_sshd() -> str | None:
    """sshd's absolute path (it re-executes itself, so a relative one will not do)."""
    found = shutil.which("sshd", path="/usr/sbin:/usr/bin:/sbin:/bin")
    return os.path.abspath(found) if found is not None else None


def ensure_login_user(name: str = LOGIN_USER, home: Path = LOGIN_HOME) -> None:
    """Create the unprivileged login account if it is missing (root only).

    Its password field is `*`, not useradd's `!`: without PAM, sshd refuses a locked account even
    for key logins. Its home stays empty, so the shell sshd starts reads no startup files.
    """
    home.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--home-dir", str(home),
             "--shell", "/bin/bash", "--password", "*", name],
            check=True,
            capture_output=True,
        )  # fmt: skip


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields follow its last ")".
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree = _children()
    found: list[int] = []
    todo = list(tree.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(tree.get(child, ()))
    return found


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _read_from(path: Path, offset: int) -> str:
    # A few hundred bytes of sshd's log, read between sleeps: not worth a thread.
    return path.read_bytes()[offset:].decode(errors="replace")


def _alive(pid: int) -> bool:
    """Running or stopped; a zombie has closed everything it had open."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class OpenSshHost(SimSshHost):
    """`SimSshHost`'s interface (listen, close, blackhole, run_local) over a real sshd."""

    def __init__(self, *, sshd: str, directory: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sshd = sshd
        self._dir = directory
        self._proc: asyncio.subprocess.Process | None = None
        # sshd's own processes (listener and per-connection ones) held by SIGSTOP.
        self._frozen: list[int] = []

    @property
    def pid(self) -> int | None:
        """The listening sshd's PID, while there is one."""
        return self._proc.pid if self._proc is not None else None

    # -- listener states -----------------------------------------------------------------------

    async def listen(self) -> int:
        if self._frozen:
            # Out of a blackhole: the same processes answer again, connections included.
            _signal(self._frozen, signal.SIGCONT)
            self._frozen.clear()
            return self.port
        if self._proc is not None:
            return self.port
        if self.port == 0:
            with socket.socket() as sock:
                sock.bind((self.address, 0))
                self.port = sock.getsockname()[1]
        config = self._write_files()
        log = self._dir / "sshd.log"
        log.touch()
        start = log.stat().st_size
        self._proc = await asyncio.create_subprocess_exec(
            self._sshd, "-D", "-f", str(config), "-E", str(log),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        await self._until_listening(log, start)
        return self.port

    async def _until_listening(self, log: Path, start: int) -> None:
        # sshd logs this line once its socket listens: no probe connection needed.
        deadline = time.monotonic() + _START_TIMEOUT
        proc = self._proc
        assert proc is not None
        while True:
            text = _read_from(log, start)
            if "Server listening on" in text:
                return
            if proc.returncode is not None or time.monotonic() > deadline:
                await self._stop_sshd()
                raise RuntimeError(f"sshd for {self.address} did not start: {text.strip()}")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Refuse new connections and drop the established ones (host down or unreachable)."""
        await self._stop_sshd()
        super().kill_sessions()

    async def blackhole(self) -> None:
        """Accept TCP and never answer; established connections go silent."""
        if self._proc is None:
            return
        # The stopped listener's backlog still completes handshakes: TCP is accepted, and
        # nothing answers. Only sshd's processes stop; commands already running go on.
        _signal([self._proc.pid], signal.SIGSTOP)
        sshd = [p for p in descendants(self._proc.pid) if _exe(p) == self._sshd]
        _signal(sshd, signal.SIGSTOP)
        self._frozen = [self._proc.pid, *sshd]

    def kill_sessions(self) -> None:
        super().kill_sessions()
        if self._proc is not None:
            sessions = [p for p in descendants(self._proc.pid) if _exe(p) != self._sshd]
            _signal(sessions, signal.SIGKILL)

    async def shutdown(self) -> None:
        await self.close()
        # Anything a session left behind (a command `timeout` or `setsid` took out of sshd's
        # tree) still carries this host's session environment.
        _signal(self.session_processes(), signal.SIGKILL)

    async def _stop_sshd(self) -> None:
        proc, self._proc = self._proc, None
        self._frozen.clear()
        if proc is None:
            return
        # Stopped first, so that no new connection forks while the tree is read; SIGKILL ends
        # stopped processes too.
        _signal([proc.pid], signal.SIGSTOP)
        tree = descendants(proc.pid)
        _signal(tree, signal.SIGKILL)
        _signal([proc.pid], signal.SIGKILL)
        await proc.wait()
        # A kill lands when its target next runs: until then its connection is still open.
        deadline = time.monotonic() + _START_TIMEOUT
        while any(_alive(p) for p in tree):
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd processes {tree} of {self.address} outlived SIGKILL")
            await asyncio.sleep(0.005)

    def session_processes(self) -> list[int]:
        """Every process started in a session of this host (by its session environment)."""
        env = self.session_env()
        marks = [
            f"SPARKD_SIM_HOST={env['SPARKD_SIM_HOST']}".encode(),
            f"SPARKD_SIM_PORT={env['SPARKD_SIM_PORT']}".encode(),
        ]
        uid = pwd.getpwnam(self.run_as).pw_uid if self.run_as is not None else os.geteuid()
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat().st_uid != uid:
                    continue
                with open(f"/proc/{entry.name}/environ", "rb") as handle:
                    items = handle.read().split(b"\0")
            except OSError:
                continue
            if all(mark in items for mark in marks):
                found.append(int(entry.name))
        return found

    # -- sshd's files --------------------------------------------------------------------------

    def _write_files(self) -> Path:
        """Host key, authorized key, ForceCommand wrapper and config, under the host's sshd
        directory (readable by the login user: sshd reads authorized_keys as that user)."""
        self._dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        host_key = self._dir / "ssh_host_ed25519_key"
        host_key.write_bytes(self.host_key.export_private_key("openssh"))
        host_key.chmod(0o600)
        authorized = self._dir / "authorized_keys"
        authorized.write_bytes(self.client_key.export_public_key("openssh"))
        authorized.chmod(0o644)
        wrapper = self._dir / "session"
        wrapper.write_text(self._wrapper())
        wrapper.chmod(0o755)
        config = self._dir / "sshd_config"
        config.write_text(
            f"ListenAddress {self.address}:{self.port}\n"
            f"HostKey {host_key}\n"
            f"AuthorizedKeysFile {authorized}\n"
            f"AllowUsers {self.user}\n"
            f"ForceCommand {wrapper}\n"
            "PidFile none\n"
            "UsePAM no\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin no\n"
            # Keys and wrapper live under a temp dir whose ownership sshd would reject.
            "StrictModes no\n"
            "UseDNS no\n"
            # sparkd multiplexes its commands and model channels over one connection per host.
            "MaxSessions 64\n"
            "MaxStartups 64\n"
            # The model channel: direct-tcpip to the head's own address.
            "AllowTcpForwarding yes\n"
            "X11Forwarding no\n"
            "PrintMotd no\n"
            "LogLevel INFO\n"
        )
        return config

    @property
    def forced_command_path(self) -> Path:
        return self._dir / "forced-command"

    def install_forced_command(self, program: str) -> None:
        """Put `program` (sparkd's forced-command wrapper, say) in front of every command, run
        with `--check` and SSH_ORIGINAL_COMMAND as sshd's `command=` key option would run it."""
        path = self.forced_command_path
        path.write_text(program)
        path.chmod(0o755)

    def _wrapper(self) -> str:
        env = self.session_env()
        world = f"/dev/tcp/127.0.0.1/{env['SPARKD_SIM_PORT']}"
        assigns = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        host = shlex.quote(env["SPARKD_SIM_HOST"])
        return (
            "#!/bin/bash\n"
            "# sshd's ForceCommand for this simulated host: tell the world which command came,\n"
            "# then run it as the asyncssh server would, in the world's session environment.\n"
            "if [[ -z ${SSH_ORIGINAL_COMMAND+set} ]]; then\n"
            '    echo "This simulated host accepts commands only, no shell." >&2\n'
            "    exit 1\n"
            "fi\n"
            # An operator's authorized_keys `command=` program (install_forced_command) decides
            # first, as sshd would run it: what it refuses never reaches the host.
            f"gate={shlex.quote(str(self.forced_command_path))}\n"
            'if [[ -x $gate ]]; then "$gate" --check || exit $?; fi\n'
            f"exec 3<>{world} || exit 255\n"
            f'printf \'%s\\0\' {host} "" "$$" @ssh "" 1 "$SSH_ORIGINAL_COMMAND" >&3\n'
            # The answer means the record is in: the command's tool calls come after it.
            "IFS= read -r _ <&3\n"
            "exec 3<&-\n"
            f"cd {shlex.quote(self.cwd)} || exit 1\n"
            f'exec /usr/bin/env -i {assigns} /bin/bash -c "$SSH_ORIGINAL_COMMAND"\n'
        )

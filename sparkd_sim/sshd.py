"""One asyncssh server per simulated host: public-key login, commands run by a real `bash -c` in a
clean environment, and direct-tcpip channels to the host's own ports (refused like OpenSSH when
nothing listens)."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import asyncssh

from sparkd_sim.owned import OwnedCommand, Owner, owner_of

log = logging.getLogger(__name__)

SessionEnv = Callable[[], dict[str, str]]
CommandLogger = Callable[[str], None]

_LOCAL_NAMES = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


class _HostServer(asyncssh.SSHServer):
    def __init__(self, host: SimSshHost) -> None:
        self._host = host
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._host.connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._host.connections.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return username == self._host.user and (
            key.public_data == self._host.client_key.public_data
        )

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> Any:
        target = self._host.resolve(dest_host)
        if target is None or self._conn is None:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, "No route to host")
        conn = self._conn

        real_port = self._host.real_port(target, dest_port)
        if real_port is None:
            # Nothing of the world listens there: refused at once, and nothing is dialled.
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, "Connection refused")

        async def forward() -> Any:
            try:
                return await conn.forward_connection(target, real_port)
            except asyncssh.ChannelOpenError:
                # OpenSSH reports a refused connect with this reason text.
                raise asyncssh.ChannelOpenError(
                    asyncssh.OPEN_CONNECT_FAILED, "Connection refused"
                ) from None

        return forward()


# No generated repr: the host's keys stay out of anything that prints the object.
@dataclass(eq=False, repr=False)
class SimSshHost:
    address: str
    host_key: asyncssh.SSHKey
    client_key: asyncssh.SSHKey
    user: str
    session_env: SessionEnv
    cwd: str
    record: CommandLogger
    other_addresses: Callable[[], set[str]]
    run_as: str | None
    # Where a simulated (address, port) really listens: model servers bind ephemeral ports,
    # so worlds in different processes never collide on the same loopback address.
    real_port: Callable[[str, int], int | None] = lambda address, port: port
    # A host's other addresses (its data IP) lead to it: vLLM listens on all of them.
    aliases: Callable[[], dict[str, str]] = dict
    port: int = field(default=0, init=False)
    connections: set[asyncssh.SSHServerConnection] = field(default_factory=set, init=False)
    _server: asyncssh.SSHAcceptor | None = field(default=None, init=False)
    _blackhole: asyncio.Server | None = field(default=None, init=False)
    _held: list[asyncio.StreamWriter] = field(default_factory=list, init=False)
    _sessions: set[asyncio.subprocess.Process] = field(default_factory=set, init=False)
    # The `late-delivery` fault: the next owned command reaches the host this much later.
    late: float | None = field(default=None, init=False)
    delayed: int = field(default=0, init=False)
    owned: list[OwnedCommand] = field(default_factory=list, init=False)
    # The owners of the owned commands started and not yet in `owned`.
    running: list[Owner] = field(default_factory=list, init=False)

    def resolve(self, dest_host: str) -> str | None:
        """Where a direct-tcpip request for `dest_host` goes; never outside loopback."""
        if dest_host in _LOCAL_NAMES or dest_host == self.address:
            return self.address
        if dest_host in self.other_addresses():
            return dest_host
        return self.aliases().get(dest_host)

    # -- listener states -----------------------------------------------------------------------

    async def listen(self) -> int:
        await self._close_blackhole()
        self._server = await asyncssh.create_server(
            lambda: _HostServer(self),
            self.address,
            self.port,
            server_host_keys=[self.host_key],
            process_factory=self._handle,
            encoding=None,
            allow_scp=False,
            line_editor=False,
            reuse_address=True,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def close(self) -> None:
        """Refuse new connections and drop the established ones (host down or unreachable)."""
        await self._stop_listening()
        for conn in list(self.connections):
            conn.abort()
        self.connections.clear()
        await self._close_blackhole()
        self.kill_sessions()

    async def blackhole(self) -> None:
        """Accept TCP and never answer; established connections go silent."""
        await self._stop_listening()
        for conn in list(self.connections):
            transport = getattr(conn, "_transport", None)
            if transport is not None:
                transport.pause_reading()

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._held.append(writer)

        self._blackhole = await asyncio.start_server(
            hold, self.address, self.port, reuse_address=True
        )

    async def _close_blackhole(self) -> None:
        if self._blackhole is not None:
            self._blackhole.close()
            self._blackhole = None
        for writer in self._held:
            writer.transport.abort()
        self._held.clear()
        for conn in list(self.connections):
            transport = getattr(conn, "_transport", None)
            if transport is not None and not transport.is_closing():
                with contextlib.suppress(Exception):
                    transport.resume_reading()

    async def shutdown(self) -> None:
        """The world is stopping: nothing of this host may go on running."""
        await self.close()

    def kill_sessions(self) -> None:
        for proc in list(self._sessions):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    # -- sessions ------------------------------------------------------------------------------

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        command = process.command
        if command is None:
            process.stderr.write(b"This simulated host accepts commands only, no shell.\n")
            process.exit(1)
            return
        owner = owner_of(command)
        if owner is not None and self.late is not None:
            delay, self.late = self.late, None
            self.delayed += 1
            await asyncio.sleep(delay)
        started = time.time()
        self.record(command)
        if owner is not None:
            # Before it starts: its fence may write the host's record before the spawn returns.
            self.running.append(owner)
        try:
            proc = await self._spawn(command)
        except OSError as exc:
            if owner is not None:
                self.running.remove(owner)
            process.stderr.write(f"bash: cannot start: {exc}\n".encode())
            process.exit(126)
            return
        self._sessions.add(proc)
        try:
            rc = await self._pump(process, proc)
        finally:
            self._sessions.discard(proc)
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            if owner is not None:
                # With no wait before it lands in `owned`: a reader finds it in one or the other.
                self.running.remove(owner)
        if owner is not None:
            done = OwnedCommand(started, self.address, owner, rc, command, proc.pid, time.time())
            self.owned.append(done)
        with contextlib.suppress(Exception):
            process.exit(rc)

    async def _spawn(self, command: str) -> asyncio.subprocess.Process:
        """`bash -c COMMAND` as the session user, in a clean environment, in its own group."""
        argv = ["/bin/bash", "-c", command]
        user_kwargs: dict[str, Any] = {}
        if self.run_as is not None:
            setpriv = shutil.which("setpriv", path="/usr/bin:/bin")
            if setpriv is not None:
                # setpriv lets Python spawn with vfork; `user=` forces a fork of this whole
                # process, which costs several milliseconds per command.
                group = f"--regid={self._run_as_group()}"
                argv = [setpriv, f"--reuid={self.run_as}", group, "--clear-groups", *argv]
            else:
                user_kwargs = {"user": self.run_as, "group": self._run_as_group()}
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.session_env(),
            cwd=self.cwd,
            start_new_session=True,
            **user_kwargs,
        )

    async def run_local(self, command: str) -> tuple[int, str, str]:
        """Run a command as an SSH session would, without SSH (the world's own setup steps)."""
        self.record(command)
        proc = await self._spawn(command)
        self._sessions.add(proc)
        try:
            out, err = await proc.communicate(b"")
        finally:
            self._sessions.discard(proc)
        rc = proc.returncode if proc.returncode is not None else 255
        return rc, out.decode(errors="replace"), err.decode(errors="replace")

    def _run_as_group(self) -> str:
        gid = pwd.getpwnam(self.run_as or "nobody").pw_gid
        return grp.getgrgid(gid).gr_name

    @staticmethod
    async def _pump(
        process: asyncssh.SSHServerProcess[bytes], proc: asyncio.subprocess.Process
    ) -> int:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

        async def copy_out(src: asyncio.StreamReader, dst: asyncssh.SSHWriter[bytes]) -> None:
            while chunk := await src.read(65536):
                dst.write(chunk)
                with contextlib.suppress(Exception):
                    await dst.drain()

        async def copy_in() -> None:
            assert proc.stdin is not None
            try:
                while chunk := await process.stdin.read(65536):
                    proc.stdin.write(chunk)
                    await proc.stdin.drain()
            except (asyncssh.Error, ConnectionError, BrokenPipeError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    proc.stdin.close()

        feeder = asyncio.ensure_future(copy_in())
        outputs: asyncio.Future[tuple[None, None]] = asyncio.ensure_future(
            asyncio.gather(
                copy_out(proc.stdout, process.stdout), copy_out(proc.stderr, process.stderr)
            )
        )
        # A client that goes away (its own timeout, a dropped connection) takes the command
        # with it, as sshd's SIGHUP would.
        closed: asyncio.Future[None] = asyncio.ensure_future(process.channel.wait_closed())
        try:
            await asyncio.wait([outputs, closed], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
            if not outputs.done():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            await outputs
            rc = await proc.wait()
        finally:
            feeder.cancel()
            closed.cancel()
        return rc if rc >= 0 else 128 - rc

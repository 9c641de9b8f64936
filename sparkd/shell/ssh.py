"""The SSH transport: one persistent, verified connection per host, and the only way sparkd runs
commands on GPU hosts.

Every failure leaves this module as an `SshFailure` carrying a classified `HostError`, so callers
turn transport trouble into snapshot values without knowing asyncssh.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from sparkd.core.text import printable
from sparkd.model.observed import HostError
from sparkd.model.spec import HostSpec, SshSpec
from sparkd.shell.deadline import bounded
from sparkd.shell.ssh_errors import (
    CommandResult,
    KeyFileError,
    KnownHostsFileError,
    SshFailure,
    classify,
    host_error,
)
from sparkd.shell.ssh_streams import open_stream

__all__ = ["CommandResult", "HostConnection", "SshFailure", "SshPool", "classify"]

KEEPALIVE_COUNT_MAX = 3
# AES-GCM first: one AEAD call per packet (AES instructions on x86 and Arm servers), where
# asyncssh's chacha20-poly1305 sets up two cipher contexts per packet; measured here, about 1 ms
# less of sparkd's CPU per host-observation. All of them are in OpenSSH's own default list.
ENCRYPTION_ALGS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)
# Failures that can come out of asyncssh or the socket layer while connecting or running.
_TRANSPORT_ERRORS = (OSError, asyncssh.Error, KeyFileError, KnownHostsFileError)


class HostConnection:
    """One lazily opened, reused SSH connection to a host, with a cap on concurrent channels.

    After a failed connect, further attempts wait out an exponential backoff; meanwhile calls
    fail fast with the last error. Concurrent callers share a single connect attempt.
    """

    def __init__(
        self,
        host: HostSpec,
        ssh: SshSpec,
        *,
        keepalive_interval: float = 15.0,
        reconnect_initial: float = 1.0,
        reconnect_max: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.ssh = ssh
        self._keepalive_interval = keepalive_interval
        self._reconnect_initial = reconnect_initial
        self._reconnect_max = reconnect_max
        self._clock = clock
        self._channels = asyncio.Semaphore(ssh.max_channels)
        self._conn: asyncssh.SSHClientConnection | None = None
        self._connecting: asyncio.Task[asyncssh.SSHClientConnection] | None = None
        self._delay = 0.0
        self._retry_at = -math.inf
        self._last_error: HostError | None = None
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    # The timeout is a parameter, not left to the caller's asyncio.timeout, because expiry must
    # become a classified `timeout` and the channel must be closed on the way out.
    async def run(
        self,
        command: str,
        *,
        timeout: float,  # noqa: ASYNC109
        input: str | None = None,
    ) -> CommandResult:
        """Run `command` to completion; `timeout` bounds everything, connecting included.

        A command killed by a signal fails as `exit_nonzero` with `result.exit_status == -1`.
        """
        name = _first_word(command)
        started = time.perf_counter()
        conn: asyncssh.SSHClientConnection | None = None
        try:
            # Woken past it (a paused process), an answer that arrived meanwhile still counts.
            async with bounded(timeout):
                conn = await self._connection()
                async with self._channels:
                    completed = await _exec(conn, command, input)
        except TimeoutError:
            raise SshFailure(
                host_error("timeout", f"`{name}` did not finish within {timeout:g}s")
            ) from None
        except OutputTooLarge as exc:
            raise SshFailure(
                host_error("exit_nonzero", f"`{name}` printed more than {exc.args[0]} characters")
            ) from None
        except _TRANSPORT_ERRORS as exc:
            raise SshFailure(self._classify_on(conn, exc)) from exc
        duration = time.perf_counter() - started
        stdout, stderr = _text(completed.stdout), _text(completed.stderr)
        if completed.exit_signal:
            signal_name = completed.exit_signal[0]
            result = CommandResult(-1, stdout, stderr, duration)
            detail = f"`{name}` was killed by signal {signal_name}"
            raise SshFailure(host_error("exit_nonzero", detail), result)
        if completed.exit_status is None:
            detail = f"connection dropped while `{name}` ran"
            raise SshFailure(host_error("conn_lost", detail))
        result = CommandResult(completed.exit_status, stdout, stderr, duration)
        if completed.exit_status != 0:
            detail = f"`{name}` exited with status {completed.exit_status}"
            raise SshFailure(host_error("exit_nonzero", detail), result)
        return result

    async def lines(self, command: str, *, max_line: int = 65536) -> AsyncGenerator[str, None]:
        """Run a long-lived command and yield its output line by line until it ends.

        Holds one session for as long as the caller reads (not a slot of the channel cap: it is
        meant to last). A line longer than `max_line` fails the stream as `exit_nonzero`.
        """
        name = _first_word(command)
        conn: asyncssh.SSHClientConnection | None = None
        try:
            conn = await self._connection()
            process = await conn.create_process(command, encoding="utf-8", errors="replace")
        except _TRANSPORT_ERRORS as exc:
            raise SshFailure(self._classify_on(conn, exc)) from exc
        pending = ""
        try:
            while True:
                try:
                    chunk = await process.stdout.read(READ_CHUNK)
                except _TRANSPORT_ERRORS as exc:
                    raise SshFailure(self._classify_on(conn, exc)) from exc
                if not chunk:
                    return
                pending += chunk
                *complete, pending = pending.split("\n")
                if len(pending) > max_line or any(len(line) > max_line for line in complete):
                    detail = f"`{name}` printed a line longer than {max_line} characters"
                    raise SshFailure(host_error("exit_nonzero", detail))
                for line in complete:
                    yield printable(line, lines=True)
        finally:
            process.close()

    async def open_connection(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A direct-tcpip channel to host:port as the SSH server sees it.

        A refusal on the far side fails the channel open (`refused`), so it can never pass for
        an accepted connection that then reads EOF. These channels are not sessions (sshd's
        MaxSessions does not count them) and are held for as long as the caller keeps the
        stream, so they do not take a slot of the channel cap.
        """
        conn: asyncssh.SSHClientConnection | None = None
        try:
            conn = await self._connection()
            return await open_stream(conn, host, port)
        except _TRANSPORT_ERRORS as exc:
            raise SshFailure(self._classify_on(conn, exc)) from exc

    async def close(self) -> None:
        self._closed = True
        attempt = self._connecting
        if attempt is not None:
            attempt.cancel()
            # Let asyncssh release the half-open socket before saying we are closed.
            await asyncio.wait({attempt})
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()

    async def _connection(self) -> asyncssh.SSHClientConnection:
        if self._closed:
            raise SshFailure(host_error("conn_lost", "connection closed by sparkd"))
        conn = self._conn
        if conn is not None and not conn.is_closed():
            return conn
        self._conn = None
        if self._connecting is None:
            now = self._clock()
            if self._last_error is not None and now < self._retry_at:
                wait = self._retry_at - now
                detail = f"backing off {wait:.1f}s after: {self._last_error.detail}"
                raise SshFailure(host_error(self._last_error.kind, detail))
            self._connecting = asyncio.create_task(self._connect())
            self._connecting.add_done_callback(_consume_exception)
        attempt = self._connecting
        try:
            # Shielded: a caller giving up (its own timeout) must not abort the shared attempt.
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if attempt.cancelled() and current is not None and current.cancelling() == 0:
                # close() cancelled the attempt, not this caller: report it, don't cancel it.
                raise SshFailure(host_error("conn_lost", "connection closed by sparkd")) from None
            raise

    async def _connect(self) -> asyncssh.SSHClientConnection:
        try:
            client_key, known_hosts = _load_credentials(self.ssh)
            conn = await asyncssh.connect(
                self.host.address,
                self.host.port,
                username=self.ssh.user,
                known_hosts=known_hosts,
                client_keys=[client_key],
                preferred_auth="publickey",
                agent_path=None,
                config=None,
                gss_kex=False,
                gss_auth=False,
                connect_timeout=self.ssh.connect_timeout,
                login_timeout=self.ssh.connect_timeout,
                keepalive_interval=self._keepalive_interval,
                keepalive_count_max=KEEPALIVE_COUNT_MAX,
                encryption_algs=ENCRYPTION_ALGS,
            )
        except (*_TRANSPORT_ERRORS, TimeoutError) as exc:
            error = classify(exc)
            if isinstance(exc, TimeoutError):
                limit = self.ssh.connect_timeout
                error = host_error("timeout", f"no SSH login within {limit:g}s")
            self._last_error = error
            self._delay = min(
                self._reconnect_max, self._delay * 2 if self._delay else self._reconnect_initial
            )
            self._retry_at = self._clock() + self._delay
            raise SshFailure(error) from exc
        finally:
            self._connecting = None
        if self._closed:
            conn.close()
            raise SshFailure(host_error("conn_lost", "connection closed by sparkd"))
        self._conn = conn
        self._delay = 0.0
        self._retry_at = -math.inf
        self._last_error = None
        return conn

    @staticmethod
    def _classify_on(conn: asyncssh.SSHClientConnection | None, exc: BaseException) -> HostError:
        # asyncssh reports a channel opened on a dead connection with the same code as a far
        # side refusal: only the connection's state tells them apart.
        if isinstance(exc, asyncssh.ChannelOpenError) and conn is not None and conn.is_closed():
            return host_error("conn_lost", "connection closed before the channel opened")
        return classify(exc)


class SshPool:
    """Every host connection of every cluster, one per (address, port, user).

    A different spec for the same key (a reloaded config with a new key file or timeouts)
    replaces the connection; the old one is closed once its callers are done with it.
    """

    def __init__(
        self,
        *,
        keepalive_interval: float = 15.0,
        reconnect_initial: float = 1.0,
        reconnect_max: float = 60.0,
    ) -> None:
        # Every connection the pool opens keeps alive and backs off alike.
        self._open = functools.partial(
            HostConnection,
            keepalive_interval=keepalive_interval,
            reconnect_initial=reconnect_initial,
            reconnect_max=reconnect_max,
        )
        self._connections: dict[tuple[str, int, str], HostConnection] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def connection(self, host: HostSpec, ssh: SshSpec) -> HostConnection:
        key = (host.address, host.port, ssh.user)
        found = self._connections.get(key)
        if found is not None and found.ssh != ssh:
            # Its callers belong to a controller the reload already stopped.
            closing = asyncio.get_running_loop().create_task(found.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            found = None
        if found is None:
            found = self._open(host, ssh)
            self._connections[key] = found
        return found

    async def close(self) -> None:
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*self._closing, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in connections))


# No fact script or tool output is anywhere near this; a host printing more is broken or
# hostile, and reading on would only grow the daemon.
MAX_OUTPUT = 8 * 1024 * 1024
READ_CHUNK = 65536


class OutputTooLarge(Exception):
    pass


@dataclass(frozen=True)
class _Completed:
    exit_status: int | None
    exit_signal: tuple[str, bool, str, str] | None
    stdout: str
    stderr: str


async def _exec(
    conn: asyncssh.SSHClientConnection, command: str, input: str | None, limit: int = MAX_OUTPUT
) -> _Completed:
    """Run to completion, reading at most `limit` characters of output in all."""
    process = await conn.create_process(command, input=input, encoding="utf-8", errors="replace")
    total = 0

    async def drain(reader: asyncssh.SSHReader[str]) -> str:
        nonlocal total
        parts: list[str] = []
        while chunk := await reader.read(READ_CHUNK):
            total += len(chunk)
            if total > limit:
                raise OutputTooLarge(limit)
            parts.append(chunk)
        return "".join(parts)

    try:
        stdout, stderr = await asyncio.gather(drain(process.stdout), drain(process.stderr))
        await process.wait_closed()
        return _Completed(process.exit_status, process.exit_signal, stdout, stderr)
    finally:
        # On a local timeout the channel must not linger and hold one of the server's sessions.
        process.close()


def _load_credentials(ssh: SshSpec) -> tuple[asyncssh.SSHKey, asyncssh.SSHKnownHosts]:
    """Read the client key and known_hosts now, so a bad file is named rather than guessed at."""
    try:
        key = asyncssh.read_private_key(ssh.key_file)
    except OSError as exc:
        raise KeyFileError(ssh.key_file, _os_reason(exc)) from None
    except (asyncssh.KeyImportError, ValueError):
        raise KeyFileError(ssh.key_file, "not a usable private key") from None
    try:
        known_hosts = asyncssh.read_known_hosts(str(ssh.known_hosts_file))
    except OSError as exc:
        raise KnownHostsFileError(ssh.known_hosts_file, _os_reason(exc)) from None
    except ValueError:
        raise KnownHostsFileError(ssh.known_hosts_file, "not a valid known_hosts file") from None
    return key, known_hosts


def _os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _consume_exception(task: asyncio.Task[asyncssh.SSHClientConnection]) -> None:
    # Callers that gave up no longer await the attempt; its failure is already recorded.
    if not task.cancelled():
        task.exception()


def _first_word(command: str) -> str:
    """The program name, for details: never arguments, which may carry anything."""
    for word in command.split():
        if "=" not in word:
            return Path(word).name[:40]
    return "command"


def _text(data: object) -> str:
    if data is None:
        return ""
    # Every byte a host's tools print enters here: controls go before anything parses it.
    if isinstance(data, bytes):
        return printable(data.decode("utf-8", "replace"), lines=True)
    return printable(str(data), lines=True)

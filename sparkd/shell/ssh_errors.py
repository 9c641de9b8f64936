"""SSH failures as values: every exception the transport can meet maps to one `HostError` kind.

Classification looks at exception types and errno only, never at message text: messages change
between asyncssh and Python releases, types and errno values do not.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from sparkd.core.text import printable
from sparkd.model.observed import HostError, HostErrorKind

DETAIL_MAX = 160

_UNREACHABLE_ERRNOS = frozenset(
    {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN, errno.EADDRNOTAVAIL}
)
_LOST_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ENOTCONN})


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str
    duration: float


class SshFailure(Exception):
    """A classified failure of the transport; `result` is set for `exit_nonzero`."""

    def __init__(self, error: HostError, result: CommandResult | None = None) -> None:
        super().__init__(f"{error.kind}: {error.detail}")
        self.error = error
        self.result = result

    @property
    def kind(self) -> HostErrorKind:
        return self.error.kind


class CredentialFileError(Exception):
    """A key or known_hosts file that cannot be used. Carries the path, never the contents."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class KeyFileError(CredentialFileError):
    pass


class KnownHostsFileError(CredentialFileError):
    pass


def host_error(kind: HostErrorKind, detail: str) -> HostError:
    if len(detail) > DETAIL_MAX:
        detail = detail[: DETAIL_MAX - 3] + "..."
    return HostError(kind=kind, detail=detail)


def classify(exc: BaseException) -> HostError:
    """Map an exception raised while connecting or talking to a host onto a `HostError`."""
    if isinstance(exc, SshFailure):
        return exc.error
    if isinstance(exc, KeyFileError):
        return host_error("auth", f"cannot use key file {exc.path}: {exc.reason}")
    if isinstance(exc, KnownHostsFileError):
        return host_error("host_key", f"cannot use known_hosts file {exc.path}: {exc.reason}")
    # Before asyncssh.Error: asyncssh.TimeoutError is also one (a ProcessError).
    # asyncio.TimeoutError is the builtin TimeoutError on 3.11.
    if isinstance(exc, TimeoutError):
        return host_error("timeout", "timed out")
    if isinstance(exc, asyncssh.Error):
        return _classify_ssh(exc)
    if isinstance(exc, BaseExceptionGroup):
        return _classify_group(exc)
    if isinstance(exc, OSError):
        return _classify_os(exc)
    return host_error("conn_lost", f"unexpected {type(exc).__name__}")


def _classify_ssh(exc: asyncssh.Error) -> HostError:
    reason = _reason(exc)
    if isinstance(exc, asyncssh.PermissionDenied):
        return host_error("auth", "server rejected the client key")
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return host_error("host_key", "host key does not match known_hosts")
    if isinstance(exc, asyncssh.ChannelOpenError):
        if exc.code == asyncssh.OPEN_CONNECT_FAILED:
            return host_error("refused", f"channel refused: {reason}")
        # Administratively prohibited (AllowTcpForwarding no) or a resource shortage says
        # nothing about the far side: not a refusal, so never counted against the model.
        return host_error("conn_lost", f"channel open failed (code {exc.code}): {reason}")
    if isinstance(exc, asyncssh.ConnectionLost):
        return host_error("conn_lost", f"connection lost: {reason}")
    return host_error("conn_lost", f"disconnected ({type(exc).__name__}): {reason}")


def _classify_os(exc: OSError) -> HostError:
    if isinstance(exc, socket.gaierror):
        return host_error("unreachable", "cannot resolve the address")
    if isinstance(exc, ConnectionRefusedError):
        return host_error("refused", "connection refused")
    if isinstance(exc, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return host_error("conn_lost", f"connection dropped ({type(exc).__name__})")
    code = exc.errno
    if code is None:
        # asyncio folds the failures of several addresses into one bare OSError: look for the
        # real ones it chained, if any; with none, no address answered.
        underlying = exc.__cause__ or exc.__context__
        if underlying is not None and underlying is not exc:
            return classify(underlying)
        return host_error("unreachable", "no address of the host answered")
    name = errno.errorcode.get(code, str(code))
    if code == errno.ECONNREFUSED:
        return host_error("refused", f"connection refused ({name})")
    if code == errno.ETIMEDOUT:
        return host_error("timeout", f"connect timed out ({name})")
    if code in _LOST_ERRNOS:
        return host_error("conn_lost", f"connection dropped ({name})")
    if code in _UNREACHABLE_ERRNOS:
        return host_error("unreachable", f"no route to host ({name})")
    return host_error("unreachable", f"connect failed ({name})")


def _classify_group(group: BaseExceptionGroup[BaseException]) -> HostError:
    errors = [classify(e) for e in group.exceptions]
    # A refusal proves the host is up, which says more than any sibling failure.
    return next((e for e in errors if e.kind == "refused"), errors[0])


def _reason(exc: asyncssh.Error) -> str:
    # The reason may be the server's own words (a disconnect message).
    return printable(" ".join(str(exc.reason).split())) or type(exc).__name__

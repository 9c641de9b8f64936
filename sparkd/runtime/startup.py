"""Config that fails only when used: an unusable state dir, a listen address that cannot be
bound. Each is one line naming the setting, with the exit status (sysexits) to leave with."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from sparkd.model.exits import EX_CANTCREAT, EX_CONFIG
from sparkd.runtime.state import EVENTS_FILE, LOCK_FILE, StateDir


class StartupError(Exception):
    """The daemon cannot start because of its config (a busy port, an unusable state dir):
    one line naming the setting, and the exit status (sysexits) to leave with."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code = code
        self.line = line


def open_state_dir(path: Path) -> None:
    """Create the state dir (0700) or check the one there; raise StartupError (73) saying why
    it cannot be used."""
    where = f"daemon.state_dir: {path}"
    if path.exists() and not path.is_dir():
        raise StartupError(EX_CANTCREAT, f"{where} is not a directory")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(EX_CANTCREAT, f"{where} cannot be created: {_reason(exc)}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise StartupError(EX_CANTCREAT, f"{where} is not writable by this user")
    for name in (LOCK_FILE, EVENTS_FILE):
        # A directory (or a FIFO) where sparkd keeps a file would fail every write or hang.
        held = path / name
        if held.exists() and not held.is_file():
            raise StartupError(EX_CANTCREAT, f"{where}: {name} is not a regular file")


@contextlib.contextmanager
def held_state_dir(state: StateDir) -> Iterator[None]:
    """The state dir opened (open_state_dir) and locked for the block: LockHeld while another
    process holds it, StartupError (73) when it cannot be used."""
    open_state_dir(state.path)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(state.lock())
        except OSError as exc:
            raise state_dir_error(state.path, exc) from None
        yield


def state_dir_error(path: Path, exc: OSError) -> StartupError:
    return StartupError(EX_CANTCREAT, f"daemon.state_dir: {path}: {_reason(exc)}")


def listen_error(listen: str, exc: OSError) -> StartupError:
    busy = exc.errno == errno.EADDRINUSE
    reason = "is in use" if busy else f"cannot be bound: {_reason(exc)}"
    return StartupError(EX_CONFIG, f"daemon.listen: {listen} {reason}")


def _reason(exc: OSError) -> str:
    # asyncio rewrites a bind error's strerror into a sentence; the errno says it plainly.
    if exc.errno:
        return os.strerror(exc.errno)
    return exc.strerror or str(exc) or type(exc).__name__

"""What a fake tool asks the world and what the world answers (see `bin/sim-tool`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCall:
    host: str
    container: str
    pid: int
    tool: str
    api_key: str
    args: list[str]

    @property
    def argv(self) -> list[str]:
        return [self.tool, *self.args]


@dataclass
class Done:
    """A finished command: its whole output and exit status."""

    stdout: str = ""
    stderr: str = ""
    rc: int = 0


def fail(message: str, rc: int = 1) -> Done:
    return Done(stderr=message if message.endswith("\n") else message + "\n", rc=rc)


@dataclass
class Stream:
    """A long-lived command: stdout arrives piece by piece, the exit status at the end."""

    output: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    exit_code: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    stderr: str = ""
    on_disconnect: Callable[[], None] | None = None

    def write(self, text: str) -> None:
        self.output.put_nowait(text)

    def finish(self, rc: int) -> None:
        if not self.exit_code.done():
            self.exit_code.set_result(rc)
            self.output.put_nowait(None)


@dataclass
class Exec:
    """Run `argv` on the host in a clean environment (how `docker exec` enters a container)."""

    env: dict[str, str]
    argv: list[str]
    detach: bool
    on_started: Callable[[int], None] | None = None
    on_exit: Callable[[int], None] | None = None


Reply = Done | Stream | Exec

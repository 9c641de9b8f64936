"""A timeout woken long past its time, as a paused process is (SIGSTOP, a frozen VM): the
answer that arrived meanwhile is read before the timeout stands, in an SSH command's bound and
in an action's. A timeout noticed in time expires as asyncio's does."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import pytest

from sparkd.model.plan import Action
from sparkd.shell.deadline import LATE, bounded
from sparkd.shell.execute import Executor
from sparkd.shell.ssh import SshPool
from tests.toy import reference_cluster

LIMIT = 0.2

Timeout = Callable[[float], AbstractAsyncContextManager[object]]


@pytest.fixture
async def line() -> AsyncIterator[tuple[asyncio.StreamReader, socket.socket]]:
    """A stream to read from, and the socket its far end writes with."""
    near, far = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=near)
    yield reader, far
    writer.close()
    far.close()


def freeze() -> None:
    """The loop does not run until well past LIMIT, as in a paused process."""
    time.sleep(LIMIT + LATE + 0.3)


def answer_while_frozen(far: socket.socket) -> None:
    """The answer is sent, then the loop is frozen: it wakes to the answer and the expired
    timer at once."""
    far.sendall(b"done\n")
    freeze()


async def waiting(task: asyncio.Task[object]) -> None:
    """Once the task ran its first step: it waits for the answer, its timer armed."""
    await asyncio.sleep(0)
    assert not task.done()


async def read_within(bound: Timeout, reader: asyncio.StreamReader) -> bytes:
    async with bound(LIMIT):
        return await reader.readline()


async def test_a_late_wake_reads_the_answer_that_arrived_meanwhile(
    line: tuple[asyncio.StreamReader, socket.socket],
) -> None:
    reader, far = line
    task = asyncio.create_task(read_within(bounded, reader))
    await waiting(task)
    answer_while_frozen(far)
    assert await task == b"done\n"


async def test_asyncios_own_timeout_takes_it_for_no_answer(
    line: tuple[asyncio.StreamReader, socket.socket],
) -> None:
    """What `bounded` is for: the premise of the test above holds."""
    reader, far = line
    task = asyncio.create_task(read_within(asyncio.timeout, reader))
    await waiting(task)
    answer_while_frozen(far)
    with pytest.raises(TimeoutError):
        await task


async def test_no_answer_is_a_timeout(line: tuple[asyncio.StreamReader, socket.socket]) -> None:
    reader, _ = line
    with pytest.raises(TimeoutError):
        await read_within(bounded, reader)
    task = asyncio.create_task(read_within(bounded, reader))
    await waiting(task)
    freeze()  # woken late, and still nothing came
    with pytest.raises(TimeoutError):
        await task


async def test_an_action_answered_while_its_owner_was_frozen_is_not_a_timeout(
    line: tuple[asyncio.StreamReader, socket.socket],
) -> None:
    reader, far = line
    executor = Executor(reference_cluster(), SshPool())

    async def dispatch(action: Action) -> str:
        return (await reader.readline()).decode().strip()

    executor.action_timeout = lambda action: LIMIT  # type: ignore[method-assign]
    executor._dispatch = dispatch  # type: ignore[method-assign]
    action = Action(kind="restart_model", host="spark-a", target="m", reason="test")
    task = asyncio.create_task(executor.run_one(action))
    await waiting(task)
    answer_while_frozen(far)
    outcome = await task
    assert (outcome.result, outcome.detail) == ("ok", "done")

"""Loopback TCP endpoint the fake tools talk to (protocol described in `bin/sim-tool`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable

from sparkd_sim.protocol import Done, Exec, Reply, Stream, ToolCall

log = logging.getLogger(__name__)

Handler = Callable[[ToolCall], Awaitable[Reply]]
_FIXED_FIELDS = 6  # host, container, pid, tool, api key, argc


async def _read_field(reader: asyncio.StreamReader) -> str:
    raw = await reader.readuntil(b"\0")
    return raw[:-1].decode("utf-8", "surrogateescape")


async def read_call(reader: asyncio.StreamReader) -> ToolCall:
    fixed = [await _read_field(reader) for _ in range(_FIXED_FIELDS)]
    host, container, pid, tool, api_key, argc = fixed
    args = [await _read_field(reader) for _ in range(int(argc))]
    return ToolCall(host, container, int(pid), tool, api_key, args)


def _header(kind: str, rc: int, stderr: str, req: int) -> bytes:
    lines = stderr.splitlines()
    body = "".join(line + "\n" for line in lines)
    return f"{kind} {rc} {len(lines)} {req}\n{body}".encode("utf-8", "surrogateescape")


class ToolServer:
    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._ids = itertools.count(1)
        self._stream_results: dict[int, asyncio.Future[int]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=512)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            call = await read_call(reader)
            if call.tool == "@status":
                await self._answer_status(call, writer)
            else:
                await self._answer(call, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            log.debug("tool connection dropped: %s", exc)
        except asyncio.CancelledError:
            # Only stop() cancels these; asyncio's stream callback would log the cancellation
            # of a client handler as an error, so end quietly instead.
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer_status(self, call: ToolCall, writer: asyncio.StreamWriter) -> None:
        future = self._stream_results.pop(int(call.args[0]), None)
        rc = await future if future is not None else 1
        writer.write(f"{rc}\n".encode())
        await writer.drain()

    async def _answer(
        self, call: ToolCall, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            reply = await self._handler(call)
        except Exception:
            log.exception("fake %s failed on %s", call.tool, call.args)
            reply = Done(stderr=f"{call.tool}: internal error in the simulated world\n", rc=125)
        req = next(self._ids)
        if isinstance(reply, Done):
            # "quiet" spares the client starting `cat` for an empty stdout.
            kind = "done" if reply.stdout else "quiet"
            writer.write(_header(kind, reply.rc, reply.stderr, req))
            writer.write(reply.stdout.encode("utf-8", "surrogateescape"))
            await writer.drain()
        elif isinstance(reply, Stream):
            await self._stream(reply, req, reader, writer)
        else:
            await self._exec(reply, req, reader, writer)

    async def _stream(
        self, reply: Stream, req: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._stream_results[req] = reply.exit_code
        writer.write(_header("stream", 0, reply.stderr, req))
        # The client never writes after its request, so EOF here means it went away.
        gone = asyncio.ensure_future(reader.read(1))
        try:
            while True:
                chunk_task = asyncio.ensure_future(reply.output.get())
                done, _ = await asyncio.wait(
                    {chunk_task, gone}, return_when=asyncio.FIRST_COMPLETED
                )
                if chunk_task not in done:
                    chunk_task.cancel()
                    if reply.on_disconnect is not None:
                        reply.on_disconnect()
                    self._stream_results.pop(req, None)
                    return
                chunk = chunk_task.result()
                if chunk is None:
                    await writer.drain()
                    return
                writer.write(chunk.encode("utf-8", "surrogateescape"))
                await writer.drain()
        finally:
            gone.cancel()

    async def _exec(
        self, reply: Exec, req: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        env_items = [f"{k}={v}" for k, v in reply.env.items()]
        fields = [
            "1" if reply.detach else "0",
            str(len(env_items)),
            *env_items,
            str(len(reply.argv)),
            *reply.argv,
        ]
        writer.write(_header("exec", 0, "", req))
        writer.write(b"".join(f.encode("utf-8", "surrogateescape") + b"\0" for f in fields))
        await writer.drain()
        pid_line = await reader.readline()
        if pid_line.strip().isdigit() and reply.on_started is not None:
            reply.on_started(int(pid_line))
        # Detached or not, the exit status follows when the process ends (exec_die).
        rc_line = await reader.readline()
        if reply.on_exit is not None:
            reply.on_exit(int(rc_line) if rc_line.strip().isdigit() else 255)

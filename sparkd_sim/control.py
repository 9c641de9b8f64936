"""Control socket of a running world: one JSON request per line, one JSON answer per line.

{"fault": "reboot", "host": "spark-b", "arg": null}  ->  {"ok": true, "message": "..."}
{"query": "requests", "host": "spark-a"}             ->  {"ok": true, "answer": [...]}
{"power": "cycle", "host": "spark-b"}                ->  {"ok": true, "message": "..."}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkd_sim.world import World


class ControlServer:
    def __init__(self, world: World) -> None:
        self._world = world
        self._server: asyncio.AbstractServer | None = None
        self._path: Path | None = None

    async def start(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._path = path
        self._server = await asyncio.start_unix_server(self._serve, str(path))
        os.chmod(path, 0o600)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(json.dumps(await self._answer(line)).encode() + b"\n")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            if "power" in request:
                message = await self._world.power(str(request["power"]), str(request["host"]))
                return {"ok": True, "message": message}
            if "query" in request:
                answer = self._world.query(str(request["query"]), str(request["host"]))
                return {"ok": True, "answer": answer}
            message = await self._world.fault(
                str(request["fault"]), str(request["host"]), request.get("arg")
            )
        except (ValueError, KeyError, TypeError) as exc:
            return {"ok": False, "message": str(exc).strip("'\"")}
        return {"ok": True, "message": message}


async def send_fault(path: Path, fault: str, host: str, arg: str | None) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(json.dumps({"fault": fault, "host": host, "arg": arg}).encode() + b"\n")
        await writer.drain()
        answer: dict[str, Any] = json.loads(await reader.readline())
        return answer
    finally:
        writer.close()


async def send_query(path: Path, query: str, host: str) -> list[dict[str, Any]]:
    """Ask a running world (`World.query`); raises ValueError with the world's reason."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(json.dumps({"query": query, "host": host}).encode() + b"\n")
        await writer.drain()
        answer: dict[str, Any] = json.loads(await reader.readline())
    finally:
        writer.close()
    if not answer.get("ok"):
        raise ValueError(str(answer.get("message", "query failed")))
    result: list[dict[str, Any]] = answer["answer"]
    return result


async def send_power(path: Path, action: str, host: str) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(json.dumps({"power": action, "host": host}).encode() + b"\n")
        await writer.drain()
        answer: dict[str, Any] = json.loads(await reader.readline())
        return answer
    finally:
        writer.close()

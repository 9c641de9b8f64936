"""A direct-tcpip channel presented as a plain asyncio stream pair.

Callers (the HTTP client) then speak to the far side exactly as over `asyncio.open_connection`,
and never see asyncssh types.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncssh


class _ChannelTransport(asyncio.Transport):
    """The asyncio transport face of an SSH TCP channel."""

    def __init__(self, channel: asyncssh.SSHTCPChannel[bytes]) -> None:
        super().__init__()
        self._channel = channel
        self._reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._channel.write(bytes(data))

    def write_eof(self) -> None:
        self._channel.write_eof()

    def can_write_eof(self) -> bool:
        return self._channel.can_write_eof()

    def close(self) -> None:
        self._channel.close()

    def abort(self) -> None:
        self._channel.abort()

    def is_closing(self) -> bool:
        return self._channel.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._channel.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._reading = False
        self._channel.pause_reading()

    def resume_reading(self) -> None:
        self._reading = True
        self._channel.resume_reading()

    def is_reading(self) -> bool:
        return self._reading

    def get_write_buffer_size(self) -> int:
        return self._channel.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._channel.set_write_buffer_limits(high, low)


class _StreamSession(asyncssh.SSHTCPSession[bytes]):
    """Feeds channel events to a `StreamReaderProtocol` (whose callbacks take no datatype)."""

    def __init__(self, protocol: asyncio.StreamReaderProtocol) -> None:
        self.protocol = protocol
        self.transport: _ChannelTransport | None = None

    def connection_made(self, chan: asyncssh.SSHTCPChannel[bytes]) -> None:
        self.transport = _ChannelTransport(chan)
        self.protocol.connection_made(self.transport)

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self.protocol.data_received(data)

    def eof_received(self) -> bool:
        return bool(self.protocol.eof_received())

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()


async def open_stream(
    conn: asyncssh.SSHClientConnection, host: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a direct-tcpip channel to host:port as seen from the SSH server."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    session = _StreamSession(protocol)
    await conn.create_connection(lambda: session, host, port)
    assert session.transport is not None  # set by connection_made before the open returns
    writer = asyncio.StreamWriter(session.transport, protocol, reader, loop)
    return reader, writer

"""A deliberately scriptable (and misbehaving) nsqd for the client's error-path tests.

``FakeNsqd`` listens on port 0 in the test's loop, parses what the client sends with the
real ``CommandParser`` and answers according to ``mode``:

- ``"ok"``: answers IDENTIFY with ``settings`` (JSON), SUB/PUB/MPUB/DPUB/CLS as nsqd does,
  records every command, and can ``push`` message or heartbeat frames;
- ``"garbage"``: answers IDENTIFY with a frame whose size field is 2 (not a frame);
- ``"silent"``: reads and never answers;
- ``"close"``: closes the connection as soon as IDENTIFY arrives;
- ``"pub-error"``: answers PUB with ``E_PUB_FAILED`` and closes, as nsqd does.

When ``settings`` say ``snappy`` or ``deflate``, the IDENTIFY reply, the compressed ``OK`` and
a compressed heartbeat leave in one ``write`` (the hardest case for a client: it must switch
codecs in the middle of a segment); from then on both directions use the codec.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import orjson

from pynsqd.wire.commands import Command, CommandParser
from pynsqd.wire.compression import Codec, make_codec
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.frames import CLOSE_WAIT_FRAME, HEARTBEAT_FRAME, OK_FRAME, encode_error, encode_frame, encode_response
from pynsqd.wire.message import encode_message


class FakeNsqd:
    def __init__(self, mode: str = "ok", settings: dict[str, Any] | None = None) -> None:
        self.mode = mode
        self.settings = settings if settings is not None else {"max_rdy_count": 2500, "version": "1.3.0"}
        self.commands: list[Command] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.changed = asyncio.Event()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def close(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def names(self) -> list[bytes]:
        return [c[0] for c in self.commands]

    def push(self, data: bytes) -> None:
        for w in self.writers:
            w.write(data)

    def push_message(self, msg_id: bytes, body: bytes, attempts: int = 1) -> None:
        self.push(encode_frame(2, encode_message(1, attempts, msg_id, body)))

    def push_heartbeat(self) -> None:
        self.push(HEARTBEAT_FRAME)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        try:
            await reader.readexactly(4)
            parser = CommandParser()
            codec: Codec | None = None
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                if codec is not None:
                    data = b"".join(codec.decode(data))
                for item in parser.feed(data):
                    if isinstance(item, ProtocolError):
                        writer.write(encode_error(item))
                        writer.close()
                        return
                    self.commands.append(item)
                    self.changed.set()
                    name = next((n for n in ("snappy", "deflate") if self.settings.get(n)), "")
                    if item[0] == b"IDENTIFY" and name and self.mode == "ok":
                        codec = make_codec(name)
                        writer.write(encode_response(orjson.dumps(self.settings))
                                     + codec.encode(OK_FRAME + HEARTBEAT_FRAME))
                        writer = _Compressing(writer, codec)  # type: ignore[assignment]
                        continue
                    if not self._answer(item, writer):
                        writer.close()
                        return
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return

    def _answer(self, cmd: Command, writer: asyncio.StreamWriter) -> bool:
        name = cmd[0]
        if self.mode == "silent":
            return True
        if name == b"IDENTIFY":
            if self.mode == "garbage":
                writer.write(struct.pack(">ii", 2, 0))
                return True
            if self.mode == "close":
                return False
            writer.write(encode_response(orjson.dumps(self.settings)))
        elif name in (b"SUB", b"MPUB", b"DPUB"):
            writer.write(OK_FRAME)
        elif name == b"PUB":
            if self.mode == "pub-error":
                writer.write(encode_error(ProtocolError("E_PUB_FAILED", "PUB failed exiting")))
                return False
            writer.write(OK_FRAME)
        elif name == b"CLS":
            writer.write(CLOSE_WAIT_FRAME)
        return True


class _Compressing:
    """A ``StreamWriter`` stand-in that compresses every write."""

    def __init__(self, writer: asyncio.StreamWriter, codec: Codec) -> None:
        self._writer = writer
        self._codec = codec

    def write(self, data: bytes) -> None:
        self._writer.write(self._codec.encode(data))

    def close(self) -> None:
        self._writer.close()

    async def drain(self) -> None:
        await self._writer.drain()

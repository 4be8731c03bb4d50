"""Asyncio producers and consumers for multi-shard load tests (our wire codec, real sockets).

``Consumer`` keeps one subscription alive: it reconnects after its connection dies, FINs
every message, and records which bodies it got on which connection, so a test can say
exactly which messages were delivered on a connection that a crash cut.
"""

from __future__ import annotations

import asyncio
import contextlib

from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import encode_fin, encode_mpub, encode_rdy, encode_sub
from pynsqd.wire.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, FrameParser
from pynsqd.wire.message import decode_message


class Consumer:
    """One channel's consumer; ``received`` maps body → times delivered."""

    def __init__(self, address: tuple[str, int], topic: str, channel: str, rdy: int = 100) -> None:
        self.address = address
        self.topic = topic
        self.channel = channel
        self.rdy = rdy
        self.received: dict[bytes, int] = {}
        self.connections = 0
        self.subscribed = asyncio.Event()
        self.unfinished_on_lost: set[bytes] = set()  # delivered on a connection that died
        self.attempts: dict[bytes, list[int]] = {}  # body → attempts of each delivery
        self._task: asyncio.Task[None] | None = None
        self._stop = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._stop = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while not self._stop:
            delivered: set[bytes] = set()
            try:
                await self._session(delivered)
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                pass
            self.subscribed.clear()
            self.unfinished_on_lost |= delivered
            await asyncio.sleep(0.05)

    async def _session(self, delivered: set[bytes]) -> None:
        reader, writer = await asyncio.open_connection(*self.address)
        try:
            writer.write(MAGIC_V2 + encode_sub(self.topic, self.channel) + encode_rdy(self.rdy))
            parser = FrameParser()
            self.connections += 1
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    raise ConnectionError("closed")
                out = []
                for kind, payload in parser.feed(data):
                    if kind == FRAME_RESPONSE and payload == b"OK":
                        self.subscribed.set()
                    elif kind == FRAME_RESPONSE and payload == b"_heartbeat_":
                        out.append(b"NOP\n")
                    elif kind == FRAME_ERROR:
                        raise ConnectionError(payload.decode())
                    elif kind == FRAME_MESSAGE:
                        _, attempts, msg_id, body = decode_message(payload)
                        self.received[body] = self.received.get(body, 0) + 1
                        self.attempts.setdefault(body, []).append(attempts)
                        delivered.add(body)
                        out.append(encode_fin(msg_id))
                if out:
                    writer.write(b"".join(out))
        finally:
            writer.close()


class Producer:
    """One connection publishing MPUB batches; ``acked`` holds every body that got OK."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.acked: list[bytes] = []
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._parser = FrameParser()
        self._frames: list[tuple[int, bytes]] = []
        self._keeper: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(*self.address)
        self._writer.write(MAGIC_V2)
        self._keeper = asyncio.get_running_loop().create_task(_close_when_cancelled(self._writer))

    async def mpub(self, topic: str, bodies: list[bytes]) -> None:
        """Publish and wait for the answer. Raises ``ConnectionError`` on an error frame."""
        assert self._reader is not None and self._writer is not None
        self._writer.write(encode_mpub(topic, bodies))
        while not self._frames:
            data = await self._reader.read(1 << 16)
            if not data:
                raise ConnectionError("closed")
            self._frames.extend(f for f in self._parser.feed(data) if f != (FRAME_RESPONSE, b"_heartbeat_"))
        kind, payload = self._frames.pop(0)
        if (kind, payload) != (FRAME_RESPONSE, b"OK"):
            raise ConnectionError(payload.decode())
        self.acked.extend(bodies)

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
        if self._writer is not None:
            self._writer.close()


async def _close_when_cancelled(writer: asyncio.StreamWriter) -> None:
    """Hold a producer's connection in a task, as a consumer's is: when a test fails before
    ``close``, the loop's runner cancels the task, which closes the connection (a transport
    left open keeps the loop from closing, uvloop's EBUSY, and warns after the test)."""
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        writer.close()

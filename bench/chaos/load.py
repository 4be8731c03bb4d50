"""The soak's clients, on one asyncio loop: producers over TCP (PUB, MPUB, DPUB) and HTTP
(``/pub``, ``/mpub``, ``/pub?defer=``), and consumers that FIN, REQ (at once or with a delay)
and hold messages with TOUCH. Every one records into the ``Ledger``; each reconnects to the
node's current address after its connection dies (the node may come back on other ports).

Each body is ``<sequence> <padding>``: the sequence is unique over the run.
"""

from __future__ import annotations

import abc
import asyncio
import json
import random
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from bench.chaos.ledger import FIN, REQ, Delivery, Ledger, Publish
from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import (
    encode_dpub,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
)
from pynsqd.wire.compression import Codec, make_codec
from pynsqd.wire.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, FrameParser
from pynsqd.wire.message import decode_message

Address = Callable[[], tuple[tuple[str, int], tuple[str, int]]]  # → (tcp, http) of the node now
ANSWER_WAIT = 10.0  # seconds a producer waits for OK before it gives the connection up
RECONNECT_PAUSE = 0.2


def body(rng: random.Random, seq: int) -> bytes:
    return b"%d " % seq + b"x" * rng.randrange(8, 200)


def seq_of(data: bytes) -> int | None:
    head = data.split(b" ", 1)[0]
    return int(head) if head.isdigit() else None


@dataclass
class Mix:
    """What the clients do, as probabilities and bounds."""

    defer_ms: tuple[int, int] = (200, 10_000)
    req_delay_ms: tuple[int, int] = (200, 10_000)
    hold_s: tuple[float, float] = (0.3, 2.0)
    touch_every: float = 0.25
    max_attempts: int = 4  # from this attempt on, a consumer FINs whatever it gets


class Reader(Protocol):
    async def read(self, n: int) -> bytes: ...


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool: ...

    def close(self) -> None: ...


class Frames:
    """Frames read from a stream, heartbeats answered with NOP."""

    def __init__(self, reader: Reader, writer: Writer) -> None:
        self.reader, self.writer = reader, writer
        self.parser = FrameParser()
        self.pending: list[tuple[int, bytes]] = []

    async def next(self) -> tuple[int, bytes]:
        while not self.pending:
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("closed by the node")
            for frame in self.parser.feed(data):
                if not isinstance(frame, tuple):
                    raise ConnectionError(f"bad frame: {frame}")
                if frame == (FRAME_RESPONSE, b"_heartbeat_"):
                    self.writer.write(b"NOP\n")
                else:
                    self.pending.append((frame[0], bytes(frame[1])))
        return self.pending.pop(0)


class Producer(abc.ABC):
    """What both producers share: where they publish, how fast, and the ledger entry of
    each new message."""

    def __init__(self, ledger: Ledger, address: Address, topics: list[str], rate: float,
                 rng: random.Random, mix: Mix) -> None:
        self.ledger, self.address, self.topics, self.rate, self.rng, self.mix = ledger, address, topics, rate, rng, mix
        self.errors = 0
        self.errors_at: list[float] = []  # when each error happened
        self.latencies: list[tuple[float, float]] = []  # (sent, seconds until acknowledged) per publish

    def _failed(self) -> None:
        self.errors += 1
        self.errors_at.append(time.monotonic())

    @abc.abstractmethod
    async def run(self, stop: asyncio.Event) -> None:
        """Publish until ``stop`` is set."""

    def _new(self, topic: str, kind: str, now: float, defer_ms: int = 0) -> tuple[Publish, bytes]:
        seq = self.ledger.next_seq()
        return self.ledger.publish(seq, topic, kind, now, defer_ms), body(self.rng, seq)


class TcpProducer(Producer):
    """One connection, one command at a time: PUB, MPUB of 2-20 or DPUB, at ``rate`` msgs/s."""

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(*self.address()[0]), ANSWER_WAIT)
            except (OSError, TimeoutError):
                self._failed()
                await asyncio.sleep(RECONNECT_PAUSE)
                continue
            try:
                writer.write(MAGIC_V2)
                await self._publish_until(stop, Frames(reader, writer))
            except (OSError, ConnectionError, TimeoutError):
                self._failed()
                await asyncio.sleep(RECONNECT_PAUSE)
            finally:
                writer.close()

    async def _publish_until(self, stop: asyncio.Event, frames: Frames) -> None:
        rng = self.rng
        while not stop.is_set():
            topic = rng.choice(self.topics)
            roll = rng.random()
            now = time.monotonic()
            if roll < 0.5:
                pubs = [self._new(topic, "tcp-pub", now)]
                frame = encode_pub(topic, pubs[0][1])
            elif roll < 0.8:
                pubs = [self._new(topic, "tcp-mpub", now) for _ in range(rng.randrange(2, 21))]
                frame = encode_mpub(topic, [b for _, b in pubs])
            else:
                delay = rng.randrange(*self.mix.defer_ms)
                pubs = [self._new(topic, "tcp-dpub", now, delay)]
                frame = encode_dpub(topic, delay, pubs[0][1])
            frames.writer.write(frame)
            kind, data = await asyncio.wait_for(frames.next(), ANSWER_WAIT)
            if (kind, data) != (FRAME_RESPONSE, b"OK"):
                raise ConnectionError(data.decode("utf-8", "replace"))  # E_*_FAILED: not acknowledged
            self.latencies.append((now, time.monotonic() - now))
            for p, _ in pubs:
                p.acked = True
            await asyncio.sleep(len(pubs) / self.rate)


class HttpProducer(Producer):
    """``/pub``, ``/pub?defer=`` and ``/mpub`` (newline-separated) at ``rate`` msgs/s."""

    async def run(self, stop: asyncio.Event) -> None:
        rng = self.rng
        async with httpx.AsyncClient(timeout=ANSWER_WAIT) as http:
            while not stop.is_set():
                topic = rng.choice(self.topics)
                roll = rng.random()
                now = time.monotonic()
                host, port = self.address()[1]
                base = f"http://{host}:{port}"
                if roll < 0.5:
                    pubs = [self._new(topic, "http-pub", now)]
                    url, params = f"{base}/pub", {"topic": topic}
                elif roll < 0.8:
                    pubs = [self._new(topic, "http-mpub", now) for _ in range(rng.randrange(2, 21))]
                    url, params = f"{base}/mpub", {"topic": topic}
                else:
                    delay = rng.randrange(*self.mix.defer_ms)
                    pubs = [self._new(topic, "http-dpub", now, delay)]
                    url, params = f"{base}/pub", {"topic": topic, "defer": str(delay)}
                try:
                    resp = await http.post(url, params=params, content=b"\n".join(b for _, b in pubs))
                except httpx.HTTPError:
                    self._failed()
                    await asyncio.sleep(RECONNECT_PAUSE)
                    continue
                if resp.status_code == 200:
                    self.latencies.append((now, time.monotonic() - now))
                    for p, _ in pubs:
                        p.acked = True
                else:
                    self._failed()
                await asyncio.sleep(len(pubs) / self.rate)


class Consumer:
    """One subscription kept alive. Per message: FIN (most), REQ 0, REQ with a delay, or hold
    with TOUCH then FIN; from ``mix.max_attempts`` on, and once ``finish_all`` is set, FIN.
    A ``pauses`` consumer stops taking messages (RDY 0) for a while now and then, so its
    channel builds a backlog that spills to disk."""

    def __init__(self, ledger: Ledger, address: Address, topic: str, channel: str, rdy: int,
                 rng: random.Random, mix: Mix, pauses: bool = False) -> None:
        self.ledger, self.address, self.topic, self.channel = ledger, address, topic, channel
        self.rdy, self.rng, self.mix, self.pauses = rdy, rng, mix, pauses
        self.finish_all = False
        self.connected = 0
        self.closed_by: Counter[str] = Counter()  # why its connections ended

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(*self.address()[0]), ANSWER_WAIT)
            except (OSError, TimeoutError):
                await asyncio.sleep(RECONNECT_PAUSE)
                continue
            conn = self.ledger.open_connection(self.topic, self.channel, time.monotonic())
            holds: list[asyncio.Task[None]] = []
            helpers = [asyncio.create_task(self._close_on(stop, writer))]
            if self.pauses:
                helpers.append(asyncio.create_task(self._pause(writer)))
            try:
                frames = await self._greet(reader, writer)
                frames.writer.write(encode_sub(self.topic, self.channel) + encode_rdy(self.rdy))
                self.connected += 1
                await self._consume(conn, frames, holds)
            except (OSError, ConnectionError) as exc:
                self.closed_by[str(exc)[:80] or type(exc).__name__] += 1
            finally:
                self.ledger.close_connection(conn, time.monotonic())
                for task in [*holds, *helpers]:
                    task.cancel()
                writer.close()
            if not stop.is_set():
                await asyncio.sleep(RECONNECT_PAUSE)

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Frames:
        """The connection up to its SUB (here: the magic)."""
        writer.write(MAGIC_V2)
        return Frames(reader, writer)

    async def _consume(self, conn: int, frames: Frames, holds: list[asyncio.Task[None]]) -> None:
        writer = frames.writer
        while True:
            kind, data = await frames.next()
            if kind == FRAME_ERROR:
                if data.startswith(b"E_FIN_FAILED"):
                    self.ledger.fin_failed += 1
                    continue
                if data.startswith((b"E_REQ_FAILED", b"E_TOUCH_FAILED")):
                    continue
                raise ConnectionError(data.decode("utf-8", "replace"))
            if kind != FRAME_MESSAGE:
                continue
            _, attempts, msg_id, payload = decode_message(data)
            now = time.monotonic()
            seq = seq_of(payload)
            if seq is None or seq not in self.ledger.published:
                self.ledger.unknown_bodies += 1
                writer.write(encode_fin(msg_id))
                continue
            d = self.ledger.deliver(conn, seq, msg_id, attempts, now)
            roll = self.rng.random()
            if self.finish_all or attempts >= self.mix.max_attempts or roll < 0.7:
                writer.write(encode_fin(msg_id))
                d.action, d.action_at = FIN, now
            elif roll < 0.8:
                writer.write(encode_req(msg_id, 0))
                d.action, d.action_at = REQ, now
            elif roll < 0.9:
                delay = self.rng.randrange(*self.mix.req_delay_ms)
                writer.write(encode_req(msg_id, delay))
                d.action, d.action_at, d.req_delay_ms = REQ, now, delay
            else:
                holds[:] = [t for t in holds if not t.done()]
                holds.append(asyncio.create_task(self._hold(writer, msg_id, d)))

    async def _hold(self, writer: Writer, msg_id: bytes, d: Delivery) -> None:
        end = time.monotonic() + self.rng.uniform(*self.mix.hold_s)
        while time.monotonic() < end and not self.finish_all:
            await asyncio.sleep(self.mix.touch_every)
            if writer.is_closing():
                return
            writer.write(encode_touch(msg_id))
        if writer.is_closing():
            return
        writer.write(encode_fin(msg_id))
        d.action, d.action_at = FIN, time.monotonic()

    @staticmethod
    async def _close_on(stop: asyncio.Event, writer: asyncio.StreamWriter) -> None:
        await stop.wait()
        writer.close()

    async def _pause(self, writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(self.rng.uniform(3, 8))
            if self.finish_all:
                return
            writer.write(encode_rdy(0))
            await asyncio.sleep(self.rng.uniform(5, 15))
            writer.write(encode_rdy(self.rdy))


class UpgradedConsumer(Consumer):
    """A ``Consumer`` whose connections negotiate TLS (``tls``: a client context) or snappy
    or deflate (``compression``) in IDENTIFY before they subscribe."""

    def __init__(self, *args: Any, tls: ssl.SSLContext | None = None, compression: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tls, self.compression = tls, compression

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Frames:
        fields: dict[str, Any] = {"feature_negotiation": True, "tls_v1": self.tls is not None}
        if self.compression:
            fields[self.compression] = True
        writer.write(MAGIC_V2 + encode_identify(json.dumps(fields).encode()))
        await _frame(reader)  # the IDENTIFY response, in the clear; nothing after it is
        frames = Frames(reader, writer)
        if self.tls is not None:
            await writer.start_tls(self.tls, server_hostname="localhost")
            await _ok(frames)
        if self.compression:
            codec = make_codec(self.compression)
            frames = Frames(_Decoding(reader, codec), _Encoding(writer, codec))
            await _ok(frames)
        return frames


async def _frame(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    return await reader.readexactly(int.from_bytes(head, "big"))


async def _ok(frames: Frames) -> None:
    if await frames.next() != (FRAME_RESPONSE, b"OK"):
        raise ConnectionError("upgrade not acknowledged")


class _Decoding:
    """A stream reader seen through a codec."""

    def __init__(self, reader: asyncio.StreamReader, codec: Codec) -> None:
        self.reader, self.codec = reader, codec

    async def read(self, n: int) -> bytes:
        while True:
            data = await self.reader.read(n)
            if not data:
                return b""
            out = b"".join(self.codec.decode(data))
            if out:
                return out


class _Encoding:
    """A stream writer seen through a codec."""

    def __init__(self, writer: asyncio.StreamWriter, codec: Codec) -> None:
        self.writer, self.codec = writer, codec

    def write(self, data: bytes) -> None:
        self.writer.write(self.codec.encode(data))

    def is_closing(self) -> bool:
        return self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()

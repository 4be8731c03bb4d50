"""One TCP connection to nsqd: the asyncio adapter around the sans-IO frame codec.

Theory of operation. ``NSQProtocol`` is a thin ``asyncio.Protocol``: ``data_received`` feeds
``pynsqd.wire.frames.FrameParser`` and dispatches each frame:

- ``_heartbeat_`` response → answer ``NOP`` at once (nsqd closes a connection that stays
  silent for two heartbeat intervals);
- any other response → the oldest waiting command's future (nsqd answers the commands that
  have a response — IDENTIFY, AUTH, SUB, PUB, MPUB, DPUB, CLS — one each, in order);
- an error frame with a non-fatal code (``E_FIN_FAILED``/``E_REQ_FAILED``/``E_TOUCH_FAILED``,
  answers to commands that have no response) → the ``on_error`` callback; a fatal one → the
  oldest waiting future as ``ResponseError`` (nsqd closes the connection right after);
- a message frame → the ``on_message`` callback, with the decoded message; or, once
  ``deliver_batches`` switched the connection to batch mode, runs of consecutive message
  frames → ``on_batch(frames, offsets)``, undecoded (``pynsqd.client.batch.FrameSplitter``
  splits the stream; other frames are dispatched as above, in stream order).

Writes are gathered: ``send`` appends to a buffer that is flushed once per loop iteration, so
the FINs a handler issues for a whole batch of messages leave in one ``write``. A connection
lost wakes every waiting future with ``ConnectionClosedError`` and calls ``on_close``.

Upgrades (``pynsqd.client.handshake`` drives them). The stream may change encoding right after
a response: the IDENTIFY reply is followed by a TLS handshake or by compressed bytes (nsqd
sends the compressed ``OK`` at once, often in the same segment), and the ``OK`` after TLS by
compressed bytes. ``command(..., hold=True)`` makes the protocol stop parsing after that
command's response and keep whatever follows, undecoded, until ``resume(codec)``: from then
on received bytes go through ``codec.decode`` before the frame parser and every flush
through ``codec.encode`` (the codecs of ``pynsqd.wire.compression``, shared with the server).
During a TLS handshake ``hold_output`` keeps queued commands (a heartbeat's ``NOP``) until
``use_transport`` installs the TLS transport.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any, cast

from pynsqd.client.batch import FrameSplitter, MessageRun
from pynsqd.client.errors import ConnectionClosedError, NSQError, NSQTimeoutError, ProtocolViolationError, ResponseError
from pynsqd.wire.commands import NOP
from pynsqd.wire.compression import Codec, CompressionError
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, FrameParser
from pynsqd.wire.message import decode_message

log = logging.getLogger("pynsqd.client")

DEFAULT_MAX_RDY_COUNT = 2500  # what a server without feature negotiation is assumed to allow

RawMessage = tuple[int, int, bytes, bytes]  # timestamp_ns, attempts, id, body


class NSQProtocol(asyncio.Protocol):
    """The frame-level adapter; see the module docstring. Create it via
    ``pynsqd.client.handshake.open_connection``."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.transport: asyncio.Transport | None = None
        self._parser = FrameParser()
        self._waiters: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.closed = asyncio.Event()
        self.close_reason: BaseException | None = None
        self.on_message: Callable[[RawMessage], None] = _drop_message
        self.on_error: Callable[[ResponseError], None] = _log_error
        self.on_close: Callable[[NSQProtocol], None] = _ignore_close
        self.codec: Codec | None = None  # snappy/deflate once negotiated
        self.auth: dict[str, Any] | None = None  # nsqd's AUTH reply (identity, …)
        self.hold_output = False  # a TLS handshake is running: keep queued output
        self._hold = False  # stop parsing after the next response to a command
        self._held: bytearray | None = None  # bytes received since then, still encoded
        self._splitter: FrameSplitter | None = None  # batch mode (``deliver_batches``)
        self.on_batch: Callable[[bytes, list[int]], None] | None = None

    # --- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self._held is not None:
            self._held += data
        elif self.codec is None:
            self._frames(data)
        else:
            try:
                for piece in self.codec.decode(data):
                    if not self._frames(piece):
                        return
            except CompressionError as exc:
                self._fail(ProtocolViolationError(f"bad {self.codec.name} stream from {self.address}: {exc}"))

    def deliver_batches(self, on_batch: Callable[[bytes, list[int]], None]) -> None:
        """From now on hand message frames over in runs, undecoded: ``on_batch(frames,
        offsets)`` per run (``pynsqd.client.batch``) instead of ``on_message`` per message.
        Call it once the stream's encoding is settled (after SUB), before RDY."""
        self.on_batch = on_batch
        self._splitter = FrameSplitter(self._parser.take_buffered())

    def _frames(self, data: bytes) -> bool:
        """Dispatch the frames ``data`` completes; False once the connection was failed."""
        if self._splitter is not None:
            return self._runs(self._splitter, data)
        while True:
            items = self._parser.feed(data, 1 if self._hold else 0)
            data = b""
            for item in items:
                if isinstance(item, ProtocolError):
                    self._fail(ProtocolViolationError(f"bad frame from {self.address}: {item}"))
                    return False
                if not self._frame(*item):
                    return False
            if not self._hold or not items:
                return True

    def _runs(self, splitter: FrameSplitter, data: bytes) -> bool:
        for item in splitter.feed(data):
            if isinstance(item, MessageRun):
                assert self.on_batch is not None
                self.on_batch(item.frames, item.offsets)
            elif isinstance(item, ProtocolError):
                self._fail(ProtocolViolationError(f"bad frame from {self.address}: {item}"))
                return False
            elif not self._frame(*item):
                return False
        return True

    def _frame(self, frame_type: int, payload: bytes) -> bool:
        if frame_type == FRAME_MESSAGE:
            try:
                raw = decode_message(payload)
            except ValueError as exc:
                self._fail(ProtocolViolationError(f"bad message from {self.address}: {exc}"))
                return False
            self.on_message(raw)
        elif frame_type == FRAME_RESPONSE:
            if payload == HEARTBEAT:
                self.send(NOP)
            elif self._waiters:
                fut = self._waiters.popleft()
                if not fut.done():
                    fut.set_result(payload)
                if self._hold:  # what follows may be encoded differently: keep it for resume()
                    self._hold = False
                    self._held = bytearray(self._parser.take_buffered())
            else:
                log.warning("%s: unexpected response %r", self.address, payload[:80])
        elif frame_type == FRAME_ERROR:
            error = ResponseError.from_frame(payload)
            if not error.fatal or not self._waiters:
                self.on_error(error)
            else:
                fut = self._waiters.popleft()
                if not fut.done():
                    fut.set_exception(error)
            if error.fatal:  # nsqd closes after a fatal error: stop using the connection now
                self.abort(ConnectionClosedError(f"nsqd closed the connection after {error}"))
                return False
        else:
            self._fail(ProtocolViolationError(f"unknown frame type {frame_type} from {self.address}"))
            return False
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed.is_set():  # a failed TLS handshake may report it twice
            return
        if self.close_reason is None:
            self.close_reason = ConnectionClosedError(f"connection to {self.address} closed")
            if exc is not None:
                self.close_reason.__cause__ = exc
        self.transport = None
        self._can_write.set()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(self._closed_error())
        self.closed.set()
        self.on_close(self)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # --- writing ----------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, data: bytes) -> None:
        """Queue ``data`` for the next flush (same loop iteration). Dropped once closed."""
        if self.transport is None:
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self.hold_output:
            return
        if self._out and self.transport is not None and not self.transport.is_closing():
            data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
            self._out.clear()
            self.transport.write(data if self.codec is None else self.codec.encode(data))
        else:
            self._out.clear()

    async def command(self, data: bytes, wait: float | None = None, hold: bool = False) -> bytes:
        """Send a command that nsqd answers; return the response payload. ``hold``: stop
        reading after it (see the module docstring) until ``resume``.

        Raises ``ResponseError`` (error frame), ``ConnectionClosedError``, ``NSQTimeoutError``.
        """
        if not self.is_open:
            raise self._closed_error()
        if not self._can_write.is_set():
            await self._can_write.wait()
            if not self.is_open:
                raise self._closed_error()
        fut = self.expect(hold)
        self.send(data)
        return await self.response(fut, wait)

    def expect(self, hold: bool = False) -> asyncio.Future[bytes]:
        """Register for the next response without sending anything (the ``OK`` nsqd sends
        after an upgrade). Await it with ``response``."""
        if hold and self.codec is not None:
            raise ValueError("cannot hold a compressed stream: nothing is negotiated after compression")
        fut: asyncio.Future[bytes] = self._loop.create_future()
        if not self.is_open:
            fut.set_exception(self._closed_error())
            return fut
        self._waiters.append(fut)
        self._hold = hold
        return fut

    async def response(self, fut: asyncio.Future[bytes], wait: float | None) -> bytes:
        """Await ``fut`` (from ``expect``) for at most ``wait`` seconds."""
        if wait is None:
            return await fut
        try:
            return await asyncio.wait_for(fut, wait)
        except TimeoutError as exc:
            self.abort(NSQTimeoutError(f"no response from {self.address} in {wait}s"))
            raise NSQTimeoutError(f"no response from {self.address} in {wait}s") from exc

    def resume(self, codec: Codec | None = None) -> None:
        """End a hold: from now on decode with ``codec`` (if given), starting with the bytes
        kept since the held response."""
        held, self._held = bytes(self._held or b""), None
        if codec is not None:
            self.codec = codec
        if held:
            self.data_received(held)

    @property
    def held_bytes(self) -> int:
        return len(self._held or b"")

    def use_transport(self, transport: asyncio.BaseTransport) -> None:
        """Carry on over ``transport`` (the TLS one) and send what was held meanwhile."""
        self.transport = cast(asyncio.Transport, transport)
        self.hold_output = False
        if self._out:
            self.flush()

    def _closed_error(self) -> NSQError:
        reason = self.close_reason
        if isinstance(reason, NSQError):  # closed for a reason of ours: raise that kind again
            err = type(reason)(str(reason))
            err.__cause__ = reason.__cause__
            return err
        err = ConnectionClosedError(f"connection to {self.address} closed: {reason}" if reason else
                                    f"connection to {self.address} closed")
        err.__cause__ = reason
        return err

    def _fail(self, reason: BaseException) -> None:
        log.error("%s: %s", self.address, reason)
        self.abort(reason)

    def abort(self, reason: BaseException | None = None) -> None:
        """Close at once (unsent data is dropped)."""
        if reason is not None and self.close_reason is None:
            self.close_reason = reason
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close after flushing what is queued."""
        self.flush()
        if self.transport is not None:
            self.transport.close()


def _drop_message(raw: RawMessage) -> None:
    log.warning("message %r received on a connection without a handler", raw[2])


def _log_error(error: ResponseError) -> None:
    log.warning("nsqd: %s", error)


def _ignore_close(proto: NSQProtocol) -> None:
    return None

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
- a message frame → the ``on_message`` callback, with the decoded message.

Writes are gathered: ``send`` appends to a buffer that is flushed once per loop iteration, so
the FINs a handler issues for a whole batch of messages leave in one ``write``. A connection
lost wakes every waiting future with ``ConnectionClosedError`` and calls ``on_close``.

``open_connection`` is the one place where socket errors become ``ConnectError`` /
``NSQTimeoutError`` (``raise … from exc``); it also does the magic and the IDENTIFY exchange.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Callable
from typing import Any, cast

import orjson

from pynsqd.client.errors import (
    ConnectError,
    ConnectionClosedError,
    NSQError,
    NSQTimeoutError,
    ProtocolViolationError,
    ResponseError,
)
from pynsqd.wire import MAGIC_V2
from pynsqd.wire.commands import NOP, encode_identify
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, FrameParser
from pynsqd.wire.message import decode_message

log = logging.getLogger("pynsqd.client")

DEFAULT_MAX_RDY_COUNT = 2500  # what a server without feature negotiation is assumed to allow

RawMessage = tuple[int, int, bytes, bytes]  # timestamp_ns, attempts, id, body


class NSQProtocol(asyncio.Protocol):
    """The frame-level adapter; see the module docstring. Create it via ``open_connection``."""

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

    # --- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        for item in self._parser.feed(data):
            if isinstance(item, ProtocolError):
                self._fail(ProtocolViolationError(f"bad frame from {self.address}: {item}"))
                return
            frame_type, payload = item
            if frame_type == FRAME_MESSAGE:
                try:
                    raw = decode_message(payload)
                except ValueError as exc:
                    self._fail(ProtocolViolationError(f"bad message from {self.address}: {exc}"))
                    return
                self.on_message(raw)
            elif frame_type == FRAME_RESPONSE:
                if payload == HEARTBEAT:
                    self.send(NOP)
                elif self._waiters:
                    fut = self._waiters.popleft()
                    if not fut.done():
                        fut.set_result(payload)
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
                    return
            else:
                self._fail(ProtocolViolationError(f"unknown frame type {frame_type} from {self.address}"))
                return

    def connection_lost(self, exc: Exception | None) -> None:
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
        if self._out and self.transport is not None and not self.transport.is_closing():
            data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
            self._out.clear()
            self.transport.write(data)
        else:
            self._out.clear()

    async def command(self, data: bytes, wait: float | None = None) -> bytes:
        """Send a command that nsqd answers; return the response payload.

        Raises ``ResponseError`` (error frame), ``ConnectionClosedError``, ``NSQTimeoutError``.
        """
        if not self.is_open:
            raise self._closed_error()
        if not self._can_write.is_set():
            await self._can_write.wait()
            if not self.is_open:
                raise self._closed_error()
        fut: asyncio.Future[bytes] = self._loop.create_future()
        self._waiters.append(fut)
        self.send(data)
        if wait is None:
            return await fut
        try:
            return await asyncio.wait_for(fut, wait)
        except TimeoutError as exc:
            self.abort(NSQTimeoutError(f"no response from {self.address} in {wait}s"))
            raise NSQTimeoutError(f"no response from {self.address} in {wait}s") from exc

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


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) → ``(host, port)``; raises ``ValueError``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid nsqd address {address!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


async def open_connection(address: str, identify: dict[str, Any], connect_timeout: float = 5.0
                          ) -> tuple[NSQProtocol, dict[str, Any]]:
    """Connect to nsqd at ``address``, send the magic and IDENTIFY; return the protocol and
    the negotiated settings (the IDENTIFY JSON, or ``{}`` when nsqd answered ``OK``).

    Raises ``ConnectError``, ``NSQTimeoutError``, ``ResponseError`` (IDENTIFY refused) or
    ``ProtocolViolationError`` (an answer that is neither ``OK`` nor JSON).
    """
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    try:
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: NSQProtocol(address), host, port), connect_timeout)
    except TimeoutError as exc:
        raise NSQTimeoutError(f"connect to {address} timed out after {connect_timeout}s") from exc
    except OSError as exc:
        raise ConnectError(f"connect to {address} failed: {exc.strerror or exc}") from exc
    sock = proto.transport.get_extra_info("socket") if proto.transport else None
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    proto.send(MAGIC_V2)
    try:
        reply = await proto.command(encode_identify(orjson.dumps(identify)), connect_timeout)
    except BaseException:
        proto.abort()
        raise
    if reply == b"OK":
        return proto, {}
    try:
        settings = orjson.loads(reply)
    except orjson.JSONDecodeError as exc:
        proto.abort()
        raise ProtocolViolationError(f"IDENTIFY reply from {address} is not JSON: {reply[:80]!r}") from exc
    if not isinstance(settings, dict):
        proto.abort()
        raise ProtocolViolationError(f"IDENTIFY reply from {address} is not a JSON object")
    return proto, settings

"""The control channel between the supervisor and a shard: unix SEQPACKET + orjson.

Theory of operation
-------------------
Each shard has one ``socketpair(AF_UNIX, SOCK_SEQPACKET)`` with the supervisor; the
supervisor is the hub, so shard↔shard requests (admin calls, stats) go through it. What it
carries are the typed messages of ``messages.py``: each is sent as a JSON header (orjson), an
optional raw payload (the unread bytes of a handed-over connection, a proxied HTTP body) and
optional file descriptors (``SCM_RIGHTS``). On the wire
one message is one or more datagrams ``[1B more-flag][chunk]``: SEQPACKET keeps datagram
boundaries, so there is no length framing to parse, and a large message (a stats document of
a busy node) is split into ``DATAGRAM``-sized datagrams that the receiver joins. Descriptors
travel with the first datagram, up to ``MAX_FDS`` of them, and the receiver has room for that
many (a receiver with less loses the rest: the kernel closes them). A datagram the kernel
takes at once carries the sender's own descriptors; one that must wait holds duplicates.

Sending never blocks the event loop: the socket is non-blocking, and what the kernel does not
take (EAGAIN) waits in a queue drained when the socket is writable again. ``call`` sends a
request with a fresh ``rid`` and returns the reply message that carries that ``rid`` back (as
``re``); ``reply`` answers one. A closed peer fails every pending call with
``ConnectionError``. A received message reaches the handler as a ``Received``: descriptors the
handler does not ``take`` are closed when it returns.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import orjson

from pynsqd.node.messages import ControlMessage, decode_message

log = logging.getLogger("pynsqd.control")

DATAGRAM = 60 * 1024
MAX_FDS = 253  # descriptors one message may carry (Linux's SCM_MAX_FD); a receiver takes them all
PROXY_WAIT = 5.0  # seconds the supervisor gives a proxied admin call at its owner shard
CALL_WAIT = 30.0  # seconds a call waits for its answer: a shard's at the supervisor, the supervisor's at a shard
SOCKET_BUFFER = 4 * 1024 * 1024
_HEAD = struct.Struct(">I")



class Received:
    """A message from the peer, its descriptors, and the ``rid`` to reply to (a call's)."""

    __slots__ = ("fds", "message", "rid")

    def __init__(self, message: ControlMessage, fds: list[int], rid: int | None) -> None:
        self.message = message
        self.fds = fds
        self.rid = rid

    def take_fds(self) -> list[int]:
        """The descriptors, now the caller's to close."""
        fds, self.fds = self.fds, []
        return fds


Handler = Callable[["ControlChannel", Received], None]


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """A connected SEQPACKET pair with large buffers (supervisor end, shard end)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                s.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
            except OSError:  # pragma: no cover - capped by net.core.wmem_max
                pass
    return a, b


def encode(header: dict[str, Any], payload: bytes = b"") -> list[bytes]:
    """A message as the datagrams that carry it."""
    head = orjson.dumps(header)
    data = _HEAD.pack(len(head)) + head + payload
    chunks = [data[i:i + DATAGRAM] for i in range(0, len(data), DATAGRAM)] or [b""]
    return [(b"\x01" if i < len(chunks) - 1 else b"\x00") + c for i, c in enumerate(chunks)]


def decode(data: bytes) -> tuple[dict[str, Any], bytes]:
    """Joined datagram bodies → (header, payload). Raises ``ValueError``."""
    if len(data) < 4:
        raise ValueError("control message too short")
    (n,) = _HEAD.unpack_from(data)
    header = orjson.loads(data[4:4 + n])
    if not isinstance(header, dict):
        raise ValueError("control header is not an object")
    return header, data[4 + n:]


class ControlChannel:
    """One end of a control socketpair, driven by the running loop."""

    def __init__(self, sock: socket.socket, handler: Handler, name: str = "") -> None:
        self.sock = sock
        self.name = name
        self.handler = handler
        self.closed = False
        self.on_close: Callable[[ControlChannel], None] | None = None
        sock.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._out: collections.deque[tuple[bytes, list[int]]] = collections.deque()
        self._writing = False
        self._partial: list[bytes] = []
        self._partial_fds: list[int] = []
        self._calls: dict[int, asyncio.Future[ControlMessage]] = {}
        self._next_rid = 0
        self._when_sent: list[Callable[[], None]] = []
        self._held: list[tuple[dict[str, Any], bytes, list[int]]] | None = None  # ``hold``

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self.sock.fileno(), self._readable)

    # --- sending --------------------------------------------------------------------------
    def send(self, message: ControlMessage, fds: list[int] | None = None) -> None:
        """Queue ``message``. ``fds`` are duplicated here (close yours whenever you like); the
        duplicates are closed once the kernel has taken the message."""
        header, payload = message.encode()
        self._send(header, payload, fds)

    def hold(self) -> None:
        """Keep every message but replies back until ``release`` (the peer is about to
        re-execute itself: it must find nothing half-read)."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        """Send what ``hold`` kept back, in order."""
        held, self._held = self._held, None
        for header, payload, fds in held or []:
            try:
                self._send(header, payload, fds)
            finally:
                for fd in fds:
                    os.close(fd)

    def detach(self) -> int:
        """Stop using the socket without closing it (it survives an ``exec``); its descriptor.
        What was received and not yet handled is lost: call when nothing is in flight."""
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
            if self._writing:
                self._loop.remove_writer(self.sock.fileno())
        self.closed = True
        return self.sock.detach()

    def _send(self, header: dict[str, Any], payload: bytes, fds: list[int] | None = None) -> None:
        if self.closed:
            raise ConnectionError(f"control channel {self.name} closed")
        if self._held is not None and "re" not in header:
            self._held.append((header, payload, [os.dup(fd) for fd in fds or []]))
            return
        if fds and len(fds) > MAX_FDS:
            raise ValueError(f"{len(fds)} descriptors in one control message (at most {MAX_FDS})")
        chunks = encode(header, payload)
        first = 0
        if fds and not self._out:
            # The common case: the kernel takes the first datagram now, with the caller's own
            # descriptors, so none is duplicated (a process out of descriptors can still hand
            # connections over). Only a datagram that must wait holds duplicates.
            try:
                socket.send_fds(self.sock, [chunks[0]], fds)
                first = 1
            except BlockingIOError:
                pass
            except OSError as exc:
                self._lost(exc)
                return
        for i in range(first, len(chunks)):
            self._out.append((chunks[i], [os.dup(fd) for fd in fds or []] if i == 0 else []))
        self._flush()

    def _flush(self) -> None:
        while self._out:
            chunk, fds = self._out[0]
            try:
                if fds:
                    socket.send_fds(self.sock, [chunk], fds)
                else:
                    self.sock.send(chunk)
            except BlockingIOError:
                if not self._writing and self._loop is not None:
                    self._writing = True
                    self._loop.add_writer(self.sock.fileno(), self._writable)
                return
            except OSError as exc:
                self._lost(exc)
                return
            self._out.popleft()
            for fd in fds:
                os.close(fd)

    def _writable(self) -> None:
        self._flush()
        if not self._out and self._writing and self._loop is not None:
            self._writing = False
            self._loop.remove_writer(self.sock.fileno())
        if not self._out and self._when_sent:
            callbacks, self._when_sent = self._when_sent, []
            for callback in callbacks:
                callback()

    def when_sent(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once everything sent so far is in the kernel: now, or once the
        datagrams waiting for room have gone (never, if the channel closes first)."""
        if not self._out:
            callback()
        else:
            self._when_sent.append(callback)

    async def sent(self) -> None:
        """Wait until everything sent so far is in the kernel (or the channel closed)."""
        if not self._out or self.closed or self._loop is None:
            return
        done: asyncio.Future[None] = self._loop.create_future()

        def sent() -> None:
            if not done.done():
                done.set_result(None)
        self.when_sent(sent)
        while not done.done() and not self.closed:
            await asyncio.wait([done], timeout=0.05)

    async def call(self, message: ControlMessage, fds: list[int] | None = None, wait: float = 10.0) -> ControlMessage:
        """Send a request and wait for its reply. Raises ``ConnectionError``/``TimeoutError``."""
        assert self._loop is not None
        self._next_rid += 1
        rid = self._next_rid
        fut: asyncio.Future[ControlMessage] = self._loop.create_future()
        self._calls[rid] = fut
        try:
            header, payload = message.encode()
            self._send({**header, "rid": rid}, payload, fds)
            return await asyncio.wait_for(fut, wait)
        finally:
            self._calls.pop(rid, None)

    def reply(self, request: Received, message: ControlMessage) -> None:
        """Answer ``request`` (a ``call`` of the peer) with ``message``."""
        if not self.closed:
            header, payload = message.encode()
            self._send({**header, "re": request.rid}, payload)

    # --- receiving ------------------------------------------------------------------------
    def _readable(self) -> None:
        for _ in range(64):
            try:
                data, fds, flags, _ = socket.recv_fds(self.sock, DATAGRAM + 1, MAX_FDS)
            except BlockingIOError:
                return
            except OSError as exc:
                self._lost(exc)
                return
            if flags & socket.MSG_CTRUNC:
                log.error("control(%s): descriptors sent with a message were lost (out of descriptors?)",
                          self.name)
            if not data:
                _close_all(fds)
                self._lost(None)
                return
            self._partial.append(data[1:])
            self._partial_fds.extend(fds)
            if data[:1] == b"\x01":
                continue
            raw = b"".join(self._partial)
            fds_all = self._partial_fds
            self._partial, self._partial_fds = [], []
            try:
                header, payload = decode(raw)
                message = decode_message(header, payload)
            except ValueError as exc:
                log.error("control(%s): bad message - %s", self.name, exc)
                _close_all(fds_all)
                continue
            if "re" in header:
                fut = self._calls.get(header["re"])
                if fut is not None and not fut.done():
                    fut.set_result(message)
                _close_all(fds_all)  # a reply carries none
                continue
            received = Received(message, fds_all, header.get("rid"))
            try:
                self.handler(self, received)
            except Exception:
                log.exception("control(%s): handler failed for %s", self.name, message.op)
            _close_all(received.fds)

    def _lost(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        self.close()
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"control channel {self.name} closed"))
        if self.on_close is not None:
            self.on_close(self)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
            if self._writing:
                self._loop.remove_writer(self.sock.fileno())
        for _, fds in self._out:
            for fd in fds:
                os.close(fd)
        self._out.clear()
        self.sock.close()


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)

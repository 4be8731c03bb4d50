"""One HTTP/1.1 connection of any pynsqd daemon (nsqd's shards, nsqlookupd, nsqadmin): the
requests ``httpparse.RequestParser`` reads, answered in order by the daemon's ASGI app.

Theory of operation
-------------------
``HTTPConnection`` is an ``asyncio.Protocol``; ``httpserver.HTTPServer`` makes one per
connection. Each read goes to the parser, which applies Go's ``net/http`` rules; each complete
request joins ``queue``, and after each read the queue is served strictly in order (HTTP/1.1
answers in request order, pipelined or not). A request runs the ASGI app in a task (tracked
in ``Connections``, so that a graceful stop waits for it) with its body buffered up to
``max_body`` bytes (past it the app sees an empty body); reading is paused meanwhile. The
answer is written once complete, in one write: the status line (``HTTP/1.0`` to an HTTP/1.0
request, as Go), a ``date`` field, the app's fields, ``content-length`` when the app gave
none, ``connection: close`` (HTTP/1.1) or ``keep-alive`` (an HTTP/1.0 request that asked for
it), and no body for ``HEAD``. An app exception answers ``500 Internal Server Error`` and
closes.

What Go refuses before a handler is refused the same way (``httpparse.Refusal``): Go's raw
answer, queued behind the answers owed before it, then a close — for a 431 after ``LINGER``
seconds of reading and dropping what still arrives, so that a client still sending can read
it (Go's ``closeWriteAndWait``). An ``Expect`` Go does not know gets Go's 417 and a close;
``Expect: 100-continue`` gets ``100 Continue`` when the request reaches the front of the
queue. The end of input inside a head is Go's 400.

Write back-pressure (``pause_writing``) pauses reading. ``shutdown()`` (graceful stop) closes
an idle connection at once and a busy one once everything it received was answered. For a
shard replaced by a new process: ``release()`` gives up an idle plain connection (a duplicate
of its socket, for the new process to serve), ``finish()`` makes the answer that leaves
nothing owed say ``Connection: close``.

A subclass serves some requests itself (nsqd's publishes, ``shard/httppub.py``) through three
hooks: ``classify`` (at each head: set the body limit, mark the request), ``dispatch`` (serve
a queued request; ``busy`` while it waits) and ``data_received`` itself.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

from pynsqd.httpkit import TEXT_TYPE
from pynsqd.httpparse import Refusal, Request, RequestParser

log = logging.getLogger("pynsqd.http")

LINGER = 0.5  # seconds a connection refused with 431 is read (and discarded) before it closes: Go's
DEFAULT_MAX_BODY = 1 << 20  # body bytes buffered for the app
ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CRASHED = b"Internal Server Error"
TEXT = [(b"content-type", TEXT_TYPE.encode())]
STATUS = {int(s): b"HTTP/1.1 %d %s\r\n" % (s, s.phrase.encode()) for s in HTTPStatus}


class Clock:
    """The date of the answers written this second (formatted once a second)."""

    __slots__ = ("line", "second", "value")

    def __init__(self) -> None:
        self.second = -1
        self.value = b""  # an IMF-fixdate
        self.line = b""

    def date(self) -> bytes:
        """``date: <IMF-fixdate>\\r\\n``; the same object until the second changes."""
        now = time.time()
        if int(now) != self.second:
            self.second = int(now)
            self.value = formatdate(now, usegmt=True).encode()
            self.line = b"date: " + self.value + b"\r\n"
        return self.line


CLOCK = Clock()


class Connections:
    """The live connections of one server and the app tasks they run (a graceful stop
    waits for both)."""

    def __init__(self) -> None:
        self.open: set[HTTPConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.emptied = asyncio.Event()  # set whenever the last connection closes

    def add(self, conn: HTTPConnection) -> None:
        self.open.add(conn)
        self.emptied.clear()

    def discard(self, conn: HTTPConnection) -> None:
        self.open.discard(conn)
        if not self.open:
            self.emptied.set()

    def track(self, task: asyncio.Task[None]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class _Raw:
    """Bytes written in their turn among the answers (``100 Continue``, a refusal)."""

    __slots__ = ("answer", "linger", "refusal")

    def __init__(self, answer: bytes, refusal: bool = False, linger: bool = False) -> None:
        self.answer = answer
        self.refusal = refusal  # then close (after ``LINGER`` with ``linger``)
        self.linger = linger


class HTTPConnection(asyncio.Protocol):
    """One HTTP connection (see the module doc): requests go to ``app``, with up to
    ``max_body`` bytes of body."""

    def __init__(self, app: ASGIApp, connections: Connections, max_body: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.connections = connections
        self.max_body = max_body
        self.parser = RequestParser(self.on_head, self.queue_request)
        self.queue: collections.deque[Request | _Raw] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.scheme = "http"
        self.client: Any = None
        self.server: Any = None
        self.refused = False  # answered a refusal: what still arrives is discarded
        self.busy = False  # a request of the queue waits (its app task, or the subclass's)
        self.joined = False  # ... to be answered later in this loop turn: reading goes on meanwhile
        self.closing = False
        self.last_answer = False  # ``finish``: the answer that leaves nothing owed says "close"
        self.read_paused = False
        self.write_paused = False
        self._lost: asyncio.Future[None] | None = None  # made when the app waits for a disconnect

    # --- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's is no subclass)
        self.connections.add(self)
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                self.client, self.server = sock.getpeername(), sock.getsockname()
            except OSError:
                pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.closing = True
        self.queue.clear()
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        try:
            self.parser.feed(data)
        except Refusal as refusal:
            self.refuse(refusal.answer, refusal.linger)
            return
        self.serve()

    def eof_received(self) -> bool:
        """The client sent its last byte: what it sent is still answered (a head cut short
        with Go's 400), then the connection closes. (Over TLS the transport closes itself.)"""
        if not self.refused:
            try:
                self.parser.feed_eof()
            except Refusal as refusal:
                self.refuse(refusal.answer, refusal.linger)
            else:
                self.closing = True
                self.serve()
        return self.scheme == "http"  # keep the transport open for the answers: ``serve`` closes it

    def pause_writing(self) -> None:
        self.write_paused = True
        self.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.busy:
            self.resume_reading()

    def shutdown(self) -> None:
        """Graceful stop: close when idle, else after everything received was answered."""
        self.closing = True
        if self.transport is not None:
            self.serve()

    def release(self) -> socket.socket | None:
        """Let another process serve this connection: only when it is idle between requests,
        nothing of the next one read and every answer written, so no request can be caught
        half-way (the next one waits in the socket for its new server). Returns a duplicate
        of the socket; this side is closed without touching the connection. None when it is
        not idle, or over TLS (whose state cannot move)."""
        transport = self.transport
        if (transport is None or transport.is_closing() or self.closing or self.refused or self.busy or self.queue
                or not self.parser.idle or self.scheme != "http" or transport.get_write_buffer_size()):
            return None
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        dup = socket.socket(fileno=os.dup(sock.fileno()))
        self.closing = True
        transport.abort()
        return dup

    def finish(self) -> None:
        """Close once what was received is answered, telling the client so in that answer
        (``Connection: close``): its next request goes to a new connection, never into one
        closed under it. An idle connection stays until then."""
        self.last_answer = True

    # --- requests -------------------------------------------------------------------------
    def on_head(self, req: Request) -> bool:
        """The parser read a head: ``classify`` it; send ``100 Continue`` in its turn when
        the client waits for it. False: read no body (the request is answered as it is)."""
        if not self.classify(req):
            return False
        if req.expect_continue:
            if self.queue or self.busy:
                self.queue.append(_Raw(_CONTINUE))
            else:
                assert self.transport is not None
                self.transport.write(_CONTINUE)
        return True

    def classify(self, req: Request) -> bool:
        """Decide how ``req`` is served before its body is read: here its body limit."""
        req.limit = self.max_body
        return True

    def queue_request(self, req: Request) -> None:
        self.queue.append(req)

    def refuse(self, answer: bytes, linger: bool) -> None:
        """Go's raw ``answer`` to a request it does not serve: after the answers owed before
        it, then close."""
        self.refused = True
        self.queue.append(_Raw(answer, refusal=True, linger=linger))
        self.serve()

    def serve(self) -> None:
        """Answer queued requests in order until one has to wait."""
        transport = self.transport
        assert transport is not None
        queue = self.queue
        while queue and not self.busy and not transport.is_closing():
            req = queue.popleft()
            if isinstance(req, _Raw):
                self._write_raw(req)
            elif req.expect_failed:
                self._expectation_failed(req)
            else:
                self.dispatch(req)
        if transport.is_closing() or self.refused:
            return
        if self.closing and not self.busy and not queue and (self.parser.idle or self.parser.stopped):
            transport.close()  # a graceful stop, or the client's end: everything received was answered
        elif queue or (self.busy and not self.joined):
            self.pause_reading()
        elif not self.write_paused:
            self.resume_reading()

    def dispatch(self, req: Request) -> None:
        """Serve ``req``: the app, in a task; reading waits until it is answered."""
        self.pause_reading()
        self.busy = True
        self.connections.track(asyncio.get_running_loop().create_task(self._asgi(req)))

    async def _asgi(self, req: Request) -> None:
        raw_path, _, query = req.target.partition(b"?")
        path = raw_path.decode("latin-1")
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                 "http_version": req.version, "server": self.server, "client": self.client,
                 "scheme": self.scheme, "method": req.method.decode("latin-1"), "root_path": "",
                 "path": unquote(path) if "%" in path else path, "raw_path": raw_path,
                 "query_string": query, "headers": req.headers}
        received = False
        status = 0
        headers: list[tuple[bytes, bytes]] = []
        out: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": req.body or b"", "more_body": False}
            if not self.closing:
                if self._lost is None:
                    self._lost = asyncio.get_running_loop().create_future()
                await self._lost
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                out.append(message.get("body", b""))

        try:
            await self.app(scope, receive, send)
        except Exception:
            log.exception("HTTP %s %s failed", scope["method"], path)
            status, headers, out = 500, list(TEXT), [_CRASHED]
            req.keep_alive = False
        self.busy = False
        if self.transport is None or self.transport.is_closing():
            return
        body = b"".join(out)
        if not any(k == b"content-length" for k, _ in headers):
            headers.append((b"content-length", b"%d" % len(body)))
        self.write(req, status or 500, headers, b"" if req.method == b"HEAD" else body, length=False)
        self.serve()

    # --- writing --------------------------------------------------------------------------
    def write(self, req: Request, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
              close: bool = False, length: bool = True) -> None:
        """``req``'s whole answer in one write; ``length``: add its ``content-length``. Closes
        after it when ``req`` (or ``close``) says so."""
        assert self.transport is not None
        close = close or not req.keep_alive or (self.last_answer and not self.queue and self.parser.idle)
        line = STATUS.get(status) or b"HTTP/1.1 %d \r\n" % status
        if not req.http11:
            line = b"HTTP/1.0" + line[8:]
        parts = [line, CLOCK.date()]
        for name, value in headers:
            parts += [name, b": ", value, b"\r\n"]
        if length:
            parts.append(b"content-length: %d\r\n" % len(body))
        if close and req.http11:
            parts.append(b"connection: close\r\n")
        elif not close and not req.http11:
            parts.append(b"connection: keep-alive\r\n")
        parts += [b"\r\n", body]
        self.transport.write(b"".join(parts))
        if close:
            self.transport.close()

    def _expectation_failed(self, req: Request) -> None:
        """Go's answer to an ``Expect`` other than ``100-continue``, then a close."""
        assert self.transport is not None
        CLOCK.date()
        version = b"HTTP/1.1" if req.http11 else b"HTTP/1.0"
        self.transport.write(version + b" 417 Expectation Failed\r\nConnection: close\r\nDate: " + CLOCK.value
                             + b"\r\nContent-Length: 0\r\n\r\n")
        self.transport.close()

    def _write_raw(self, raw: _Raw) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(raw.answer)
        if not raw.refusal:
            return
        self.refused = True
        self.queue.clear()
        if not raw.linger:
            transport.close()
            return
        if transport.can_write_eof():
            transport.write_eof()
        self.resume_reading()  # read and drop what the client still sends, then close
        asyncio.get_running_loop().call_later(LINGER, transport.close)

    def pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.transport.is_closing():
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and self.transport is not None and not self.transport.is_closing():
            self.read_paused = False
            self.transport.resume_reading()


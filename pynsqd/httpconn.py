"""One HTTP/1.1 connection of any pynsqd daemon: the app runs through ASGI, except nsqd's
``POST /pub`` and ``/mpub``, served inline; the head of every request is bounded.

Theory of operation
-------------------
uvicorn owns the listening sockets, TLS and shutdown (``httpserver.py``); the per-connection
protocol is ours (``http_protocol(publisher)`` → the class uvicorn instantiates for each
connection, with the same ``config`` / ``server_state`` arguments as its own). It exists for
two reasons. uvicorn's parser reads a head of any size (a 100 MB header line is buffered,
then served): here the request line and headers of each request are counted as they are read
and one past Go's limits (``httpkit.HEAD_LIMIT`` bytes, ``MAX_HEADER_FIELDS`` fields) gets
Go's ``431 Request Header Fields Too Large`` — at most ``FEED_STEP`` bytes are handed to the
parser at a time while a head is incomplete, so what a head holds in memory stays bounded
by the limit; an HTTP version other than 1.x gets Go's ``505``. Both then stop parsing,
discard what still arrives for ``LINGER`` seconds (so the client can read the answer while
it is still sending, as Go's ``closeWriteAndWait``) and close. And publishing is almost all
of nsqd's HTTP traffic: uvicorn's generic path costs a task, an ASGI scope and two ``send``
syscalls per request; here a publish is a synchronous call made from the parser's callback
and the answer is one pre-built write.

Bytes go to an ``httptools`` parser — except a read that is exactly one plain publish
(``_PLAIN_HEAD``: what HTTP clients and load generators send) while nothing is pending, which
is served at once without it (the parser's seven Python callbacks were about a quarter of a
``/pub``'s Python time); anything else, or any doubt, goes to the parser. Each complete
request becomes a ``_Request`` appended to ``queue``; after each ``feed_data`` the queue is
served strictly in order (HTTP/1.1 answers in request order, pipelined or not):

- with a ``publisher`` (nsqd), ``POST /pub`` / ``/mpub`` (exact paths; not when
  ``--tls-required`` refuses plain HTTP): the body was buffered up to the route's limit
  (``None`` past it), then ``publisher.publish_steps`` checks it in nsqd's order and yields
  the broker calls; a call that raises one of ``publisher.busy`` (the owner shard's inbound
  ring is full) stops the queue, stops reading, and is retried every ``BUSY_RETRY``
  seconds — never lost, never reordered. A call that returns a ``Later`` (a plain ``/pub``
  joins the loop turn's batch) stops the queue until the ``Later`` finishes, at the end of
  the same turn, with the answer; reading goes on meanwhile. ``Content-Length`` over the
  limit with ``Expect: 100-continue`` is refused at once (413, connection closed: the
  client never sent the body); otherwise ``100 Continue`` is sent.
- anything else: the ASGI app runs in a task (registered in ``server_state.tasks``, so a
  graceful shutdown waits for it) with the body (buffered up to ``max_body`` bytes; past it
  the app sees an empty body); its answer is written once it is complete,
  ``Content-Length`` added when the app gave none, no body for ``HEAD``. Reading is paused
  until then. An app exception answers uvicorn's ``500 Internal Server Error``.

Every answer carries uvicorn's default headers (``date``) and closes the connection when the
request asked for it (``Connection: close``, HTTP/1.0 without keep-alive). A malformed request
gets uvicorn's ``400 Invalid HTTP request received.`` and a close. Write back-pressure
(``pause_writing``) pauses reading. ``shutdown()`` (graceful stop) closes an idle connection at
once and a busy one once everything it received was answered.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import socket
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import unquote

import httptools
import orjson

from pynsqd.httpkit import (
    HEAD_LIMIT,
    HEAD_TOO_LARGE,
    JSON_TYPE,
    MAX_HEADER_FIELDS,
    TEXT_TYPE,
    VERSION_NOT_SUPPORTED,
    HTTPError,
)

log = logging.getLogger("pynsqd.http")

BUSY_RETRY = 0.001  # seconds between tries of a publish step that found no room
FEED_STEP = 65536  # bytes handed to the parser at once while a head is incomplete
LINGER = 0.5  # seconds a refused connection is read (and discarded) before it closes: Go's
DEFAULT_MAX_BODY = 1 << 20  # body bytes buffered for the app without a publisher
Step = tuple[Callable[..., Any], tuple[Any, ...]]  # a call: None, or a ``Later``; may raise one of ``busy``

_PUBLISH_PATHS = (b"/pub", b"/mpub")
# A plain publish, as HTTP clients and load generators send it, served without the parser:
# an HTTP/1.1 POST to /pub or /mpub whose URL holds only RFC 3986 characters, up to 32
# header fields of token names and printable values, exactly one Content-Length, and
# no field that changes how the message is framed or answered (``_NOT_PLAIN``).
_PLAIN_HEAD = re.compile(rb"POST ((?:/pub|/mpub)(?:\?[-A-Za-z0-9._~!$&'()*+,;=:@/?%]*)?) HTTP/1\.1\r\n"
                         rb"((?:[-!#$%&'*+.^_`|~0-9A-Za-z]+:[\t -~]*\r\n){0,32})\r\n")
_NOT_PLAIN = re.compile(rb"\n(?:connection|expect|transfer-encoding|upgrade):")  # in "\n" + the lowered fields
_NSQ = b"x-nsq-content-type: nsq; version=1.0\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_BAD_REQUEST = b"Invalid HTTP request received."
_CRASHED = b"Internal Server Error"
_TEXT = [(b"content-type", TEXT_TYPE.encode())]
_JSON = [(b"content-type", JSON_TYPE.encode()), (b"x-nsq-content-type", b"nsq; version=1.0")]
_STATUS = {int(s): b"HTTP/1.1 %d %s\r\n" % (s, s.phrase.encode()) for s in HTTPStatus}
_ok: list[Any] = [None, b""]  # (the default headers it was built with, the whole 200 OK answer)


class Publisher(Protocol):
    """What the fast path needs of ``NsqdHTTP``."""

    tls_required_port: int
    busy: tuple[type[Exception], ...]  # what a step raises when it must be retried later

    def body_limit(self, path: str) -> int: ...

    def check_length(self, path: str, content_length: int) -> None: ...

    def publish_steps(self, path: str, query: bytes, body: bytes | None) -> Any: ...


class Later:
    """What a publish step returns when its outcome comes later (``shard/pubgroup.py``: a
    batch published at the end of the loop turn): ``add`` a callback, called with ``None``
    (stored) or the ``HTTPError`` by ``finish``."""

    __slots__ = ("waiters",)

    def __init__(self) -> None:
        self.waiters: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def add(self, callback: Callable[..., None], *args: Any) -> None:
        """``callback(*args, error)`` once finished."""
        self.waiters.append((callback, args))

    def finish(self, error: HTTPError | None) -> None:
        for callback, args in self.waiters:
            callback(*args, error)
        self.waiters.clear()


class _Request:
    __slots__ = ("chunks", "content_length", "headers", "http_version", "keep_alive", "limit", "method",
                 "publish", "size", "url")

    def __init__(self) -> None:
        self.method = b""
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = 0
        self.publish = False  # served inline
        self.keep_alive = True
        self.content_length = -1
        self.http_version = "1.1"

    @property
    def body(self) -> bytes | None:
        return None if self.size > self.limit else b"".join(self.chunks)


class _Refusal:
    """Go's raw answer to a refused head, queued behind the answers owed before it."""

    __slots__ = ("answer",)

    def __init__(self, answer: bytes) -> None:
        self.answer = answer


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a refused head."""


def http_protocol(publisher: Publisher | None = None, max_body: int = DEFAULT_MAX_BODY) -> type[asyncio.Protocol]:
    """The connection protocol class for uvicorn's ``Config(http=...)``: with ``publisher``
    (nsqd), its publishes served inline; without, every request goes to the app with up to
    ``max_body`` bytes of body."""

    class Bound(HTTPConnection):
        pass
    Bound.publisher = publisher
    Bound.max_body = max_body
    return Bound


class HTTPConnection(asyncio.Protocol):
    """One HTTP connection (see the module doc)."""

    publisher: Publisher | None
    max_body: int

    def __init__(self, config: Any, server_state: Any, app_state: Any = None, _loop: Any = None) -> None:
        self.app = config.loaded_app
        self.state = server_state
        publisher = self.publisher
        self.max_other_body = (max(publisher.body_limit("/pub"), publisher.body_limit("/mpub"))
                               if publisher is not None else self.max_body)
        self.parser = httptools.HttpRequestParser(self)
        self.head_size = 0  # bytes of the current head fed so far
        self.in_head = True  # between requests or inside a head: what is read is counted
        self.refused = False  # answered 431/505: what still arrives is discarded
        self.queue: collections.deque[_Request | _Refusal] = collections.deque()
        self.current: _Request | None = None
        self.transport: asyncio.Transport | None = None
        self.scheme = "http"
        self.client: Any = None
        self.server: Any = None
        self.busy = False  # a request of the queue waits (a task, a full ring, a ``Later``)
        self.joined = False  # waiting on a ``Later``: answered this loop turn, reading goes on
        self.closing = False
        self.last_answer = False  # ``finish``: the answer that leaves nothing owed says "close"
        self.read_paused = False
        self.write_paused = False
        self._lost: asyncio.Future[None] | None = None  # made when the app waits for a disconnect

    # --- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's is no subclass)
        self.state.connections.add(self)
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                self.client, self.server = sock.getpeername(), sock.getsockname()
            except OSError:
                pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.connections.discard(self)
        self.closing = True
        self.queue.clear()
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if (self.publisher is not None and not self.head_size and self.in_head and not self.queue
                and not self.busy and not self.closing and self._publish_plain(data)):
            return
        if not self.in_head:
            fed = self._feed(data)
        elif len(data) <= FEED_STEP and self.head_size + len(data) < HEAD_LIMIT:
            self.head_size += len(data)  # the common case: a whole small request or more
            fed = self._feed(data)
        else:
            fed = self._feed_in_steps(memoryview(data))
        if not fed:
            return
        if self.in_head and self.head_size >= HEAD_LIMIT:
            self._refuse(HEAD_TOO_LARGE)
            return
        self._serve()

    def _publish_plain(self, data: bytes) -> bool:
        """Serve ``data`` if it is exactly one plain publish (see ``_PLAIN_HEAD``) while
        nothing else is pending, without the parser; False to parse it as usual."""
        head = _PLAIN_HEAD.match(data)
        if head is None:
            return False
        fields = b"\n" + head.group(2).lower()
        at = fields.find(b"\ncontent-length:") + 16
        if at == 15 or fields.count(b"content-length") != 1 or _NOT_PLAIN.search(fields):
            return False
        length = fields[at:fields.index(b"\r", at)].strip(b" \t")
        publisher = self.publisher
        assert publisher is not None
        if (not length.isdigit() or len(length) > 15 or len(data) - head.end() != int(length)
                or (publisher.tls_required_port and self.scheme != "https")):
            return False
        req = _Request()
        req.url = head.group(1)
        req.publish = True
        req.limit = publisher.body_limit(req.url.partition(b"?")[0].decode())
        req.content_length = req.size = len(data) - head.end()
        if req.size > req.limit:
            return False
        req.chunks.append(data[head.end():])
        self._publish(req, None)
        return True

    def _feed_in_steps(self, view: memoryview) -> bool:
        """Feed ``view`` at most ``FEED_STEP`` bytes at a time while a head is incomplete,
        counting them; False if the connection stopped parsing."""
        while view:
            if self.in_head:
                room = min(HEAD_LIMIT - self.head_size, FEED_STEP)
                if room <= 0:
                    self._refuse(HEAD_TOO_LARGE)
                    return False
                piece, view = view[:room], view[room:]
                self.head_size += len(piece)
            else:
                piece, view = view, view[len(view):]
            if not self._feed(piece):
                return False
        return True

    def _feed(self, data: bytes | memoryview) -> bool:
        """Parse ``data``; False if the connection stopped parsing (answered and closing)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # served as a plain request, as uvicorn does without a websocket library
        except httptools.HttpParserError as exc:
            if self.refused:
                return False  # a callback refused the request
            if "HTTP version" in str(exc):
                self._refuse(VERSION_NOT_SUPPORTED)
                return False
            self.queue.clear()
            self._write(400, _TEXT, _BAD_REQUEST, close=True)
            return False
        return not self.refused

    def _refuse(self, answer: bytes) -> None:
        """Go's answer to a head it will not read (431, 505): answer what came before it in
        order, then this; discard what arrives for ``LINGER`` seconds, then close."""
        self.refused = True
        self.current = None
        transport = self.transport
        assert transport is not None
        self._serve()
        if self.busy or self.queue:
            self.queue.append(_Refusal(answer))  # after the answers it owes
            return
        self._send_refusal(answer)

    def _send_refusal(self, answer: bytes) -> None:
        transport = self.transport
        assert transport is not None
        if transport.is_closing():
            return
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
        self._resume_reading()  # read and drop what the client still sends, then close
        asyncio.get_running_loop().call_later(LINGER, transport.close)

    def pause_writing(self) -> None:
        self.write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.busy:
            self._resume_reading()

    def shutdown(self) -> None:
        """Graceful stop (uvicorn calls it): close when idle, else after the current answer."""
        self.closing = True
        if self.transport is not None:
            self._serve()

    def release(self) -> socket.socket | None:
        """Let another process serve this connection: only when it is idle between requests,
        nothing of the next one read and every answer written, so no request can be caught
        half-way (the next one waits in the socket for its new server). Returns a duplicate
        of the socket; this side is closed without touching the connection. None when it is
        not idle, or over TLS (whose state cannot move)."""
        transport = self.transport
        if (transport is None or transport.is_closing() or self.closing or self.refused or self.busy or self.queue
                or self.current is not None or self.head_size or not self.in_head or self.scheme != "http"
                or transport.get_write_buffer_size()):
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

    # --- httptools callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.current = _Request()

    def on_url(self, url: bytes) -> None:
        if self.current is not None:
            self.current.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.current
        if req is None:
            return
        if len(req.headers) >= MAX_HEADER_FIELDS:
            self._refuse(HEAD_TOO_LARGE)
            raise _Refused
        req.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        req = self.current
        if req is None:
            return
        assert self.transport is not None
        self.in_head = False
        req.http_version = self.parser.get_http_version()
        if not req.http_version.startswith("1."):
            self._refuse(VERSION_NOT_SUPPORTED)
            raise _Refused
        req.method = self.parser.get_method()
        req.keep_alive = self.parser.should_keep_alive()
        expect = False
        for name, value in req.headers:
            if name == b"content-length":
                try:
                    req.content_length = int(value)
                except ValueError:
                    req.content_length = -1
            elif name == b"expect" and value.lower() == b"100-continue":
                expect = True
        path = req.url.partition(b"?")[0]
        publisher = self.publisher
        req.publish = (publisher is not None and req.method == b"POST" and path in _PUBLISH_PATHS
                       and not (publisher.tls_required_port and self.scheme != "https"))
        if req.publish:
            assert publisher is not None
            req.limit = publisher.body_limit(path.decode())
            if expect and req.content_length > req.limit:
                self.queue.append(req)  # answered in order; the body never comes: close after
                req.keep_alive = False
                self.current = None
                return
        else:
            req.limit = self.max_other_body
        if expect:
            self.transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        req = self.current
        if req is None:
            return  # the body of a request refused at its headers
        req.size += len(body)
        if req.size <= req.limit:
            req.chunks.append(body)

    def on_message_complete(self) -> None:
        self.in_head = True
        self.head_size = 0
        if self.current is not None:
            self.queue.append(self.current)
            self.current = None

    # --- serving --------------------------------------------------------------------------
    def _serve(self) -> None:
        """Answer queued requests in order until one has to wait."""
        transport = self.transport
        assert transport is not None
        while self.queue and not self.busy and not transport.is_closing():
            req = self.queue.popleft()
            if isinstance(req, _Refusal):
                self._send_refusal(req.answer)
                return
            if req.publish:
                self._publish(req, None)
            else:
                self._pause_reading()
                self.busy = True
                task = asyncio.get_running_loop().create_task(self._asgi(req))
                self.state.tasks.add(task)
                task.add_done_callback(self.state.tasks.discard)
        if transport.is_closing():
            return
        if self.refused:
            return
        if self.closing and not self.busy and not self.queue and self.current is None:
            transport.close()  # a graceful stop: everything received was answered
        elif self.queue or (self.busy and not self.joined):
            self._pause_reading()
        elif not self.write_paused:
            self._resume_reading()

    def _publish(self, req: _Request, steps: Any) -> None:
        """Run ``req``'s publish steps; on ``Backpressure`` retry later (the queue waits)."""
        pending: Step | None = None
        publisher = self.publisher
        assert publisher is not None
        try:
            if steps is None:
                raw_path, _, query = req.url.partition(b"?")
                path = raw_path.decode()
                publisher.check_length(path, req.content_length)
                steps = publisher.publish_steps(path, query, req.body)
            else:
                pending, steps = steps
            while True:
                if pending is None:
                    pending = next(steps, None)
                    if pending is None:
                        break
                action, args = pending
                later = action(*args)
                pending = None
                if later is not None:  # answered when ``later`` finishes
                    self.busy = self.joined = True
                    later.add(self._joined, req, steps)
                    return
        except publisher.busy:
            self.busy = True
            self._pause_reading()
            asyncio.get_running_loop().call_later(BUSY_RETRY, self._retry, req, (pending, steps))
            return
        except HTTPError as exc:
            self._write_error(exc, req)
            return
        self._write_ok(close=not req.keep_alive)

    def _joined(self, req: _Request, steps: Any, error: HTTPError | None) -> None:
        self.busy = self.joined = False
        if self.transport is None or self.transport.is_closing():
            return
        if error is not None:
            self._write_error(error, req)
        else:
            self._publish(req, (None, steps))
        self._serve()

    def _retry(self, req: _Request, state: Any) -> None:
        self.busy = False
        if self.transport is None or self.transport.is_closing():
            return  # the client went away: what it sent is not stored, and it was not told OK
        self._publish(req, state)
        self._serve()

    async def _asgi(self, req: _Request) -> None:
        raw_path, _, query = req.url.partition(b"?")
        path = raw_path.decode("latin-1")
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                 "http_version": req.http_version, "server": self.server, "client": self.client,
                 "scheme": self.scheme, "method": req.method.decode("ascii"), "root_path": "",
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
            status, headers, out = 500, list(_TEXT), [_CRASHED]
            req.keep_alive = False
        self.busy = False
        if self.transport is None or self.transport.is_closing():
            return
        body = b"".join(out)
        length = next((v for k, v in headers if k == b"content-length"), None)
        if length is None:
            headers.append((b"content-length", b"%d" % len(body)))
        self._write(status or 500, headers, b"" if req.method == b"HEAD" else body,
                    close=not req.keep_alive, length=False)
        self._serve()

    # --- writing --------------------------------------------------------------------------
    def _write(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, close: bool,
               length: bool = True) -> None:
        """One whole answer in one write; ``length``: add its ``Content-Length``."""
        assert self.transport is not None
        close = close or (self.last_answer and not self.queue and self.current is None)
        parts = [_STATUS.get(status) or b"HTTP/1.1 %d \r\n" % status]
        for name, value in self.state.default_headers:
            parts += [name, b": ", value, b"\r\n"]
        for name, value in headers:
            parts += [name, b": ", value, b"\r\n"]
        if length:
            parts.append(b"content-length: %d\r\n" % len(body))
        if close:
            parts.append(b"connection: close\r\n")
        parts += [b"\r\n", body]
        self.transport.write(b"".join(parts))
        if close:
            self.transport.close()

    def _write_error(self, error: HTTPError, req: _Request) -> None:
        self._write(error.status, _JSON, orjson.dumps({"message": error.message}), close=not req.keep_alive)

    def _write_ok(self, close: bool) -> None:
        assert self.transport is not None
        if close or self.last_answer:
            self._write(200, [*_TEXT, _JSON[1]], b"OK", close=True)
            return
        defaults = self.state.default_headers
        if _ok[0] is not defaults:  # uvicorn replaces the list each second (the date)
            parts = [b"HTTP/1.1 200 OK\r\n"]
            for name, value in defaults:
                parts += [name, b": ", value, b"\r\n"]
            parts += [b"content-type: ", TEXT_TYPE.encode(), b"\r\ncontent-length: 2\r\n", _NSQ, b"\r\nOK"]
            _ok[:] = [defaults, b"".join(parts)]
        self.transport.write(_ok[1])

    def _pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.transport.is_closing():
            self.read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.read_paused and self.transport is not None and not self.transport.is_closing():
            self.read_paused = False
            self.transport.resume_reading()

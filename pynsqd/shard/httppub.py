"""nsqd's ``POST /pub`` and ``/mpub`` served by the HTTP connection itself, never as ASGI.

Theory of operation
-------------------
Publishing is almost all of nsqd's HTTP traffic, and the generic path (``httpconn.py``) costs
a task, an ASGI scope and messages per request. ``PublishConnection`` serves the exact paths
``/pub`` and ``/mpub`` (POST, and not when ``--tls-required`` refuses plain HTTP) itself: a
publish is a synchronous call made as the request is read, and the answer one pre-built
write. Every other request goes to the app as on any connection.

A read that is exactly one plain publish while nothing else is pending (``_PLAIN_HEAD``: an
HTTP/1.1 POST to ``/pub`` or ``/mpub`` whose URL holds only RFC 3986 characters, at most 32
token-named fields of printable values, one ``Host`` of the bytes Go allows, one
``Content-Length`` matching the bytes read, no ``Connection`` but ``keep-alive``, and no
other field that changes how the request is framed or answered) is served at once, without
the parser: what HTTP clients and load generators send, and what Go would take as it is.
Anything else, or any doubt, goes through the parser, and its publishes are served in their
turn.

Either way the body was buffered up to the route's limit (``None`` past it), then
``publisher.publish_steps`` (``NsqdHTTP``, transport-free) checks it in nsqd's order and
yields the broker calls. A call that raises one of ``publisher.busy`` (the owner shard's
inbound ring is full) stops the queue, stops reading, and is retried every ``RING_RETRY``
seconds — never lost, never reordered. A call that returns a ``Later`` (a plain ``/pub``
joins the loop turn's batch, ``pubgroup.py``) stops the queue until the ``Later`` finishes,
at the end of the same turn, with the answer; reading goes on meanwhile. A ``Content-Length``
over the limit with ``Expect: 100-continue`` is refused at once (413, connection closed: the
client never sent the body). A body that could not be read whole is nsqd's ``500
INTERNAL_ERROR``, then a close.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from pynsqd.httpconn import CLOCK, TEXT, ASGIApp, Connections, HTTPConnection
from pynsqd.httpkit import JSON_TYPE, NSQ_HEADER, TEXT_TYPE, HTTPError
from pynsqd.httpparse import Request
from pynsqd.shard.broker import RING_RETRY

Step = tuple[Callable[..., Any], tuple[Any, ...]]  # a call: None, or a ``Later``; may raise one of ``busy``

_PUBLISH_PATHS = (b"/pub", b"/mpub")
_PLAIN_HEAD = re.compile(rb"POST ((/pub|/mpub)(?:\?[-A-Za-z0-9._~!$&'()*+,;=:@/?%]*)?) HTTP/1\.1\r\n"
                         rb"((?:[-!#$%&'*+.^_`|~0-9A-Za-z]+:[\t -~]*\r\n){0,32})\r\n")
# in "\n" + the lowered fields: one that changes how the request is framed or answered (a
# Connection but keep-alive); a host of the bytes Go takes
_NOT_PLAIN = re.compile(rb"\n(?:connection(?!:[ \t]*keep-alive[ \t]*\r)|expect|transfer-encoding|upgrade):")
_HOST = re.compile(rb"\nhost:[ \t]*[0-9a-z!$%&()*+,\-.:;=\[\]'_~]*[ \t]*\r")
_JSON = [(b"content-type", JSON_TYPE.encode()), NSQ_HEADER]
_OK_FIELDS = b"content-type: " + TEXT_TYPE.encode() + b"\r\ncontent-length: 2\r\nx-nsq-content-type: nsq; version=1.0"
_ok: list[Any] = [0.0, b""]  # (until when it holds: the next second, the whole 200 OK answer)


class Publisher(Protocol):
    """What the connection needs of ``NsqdHTTP``."""

    tls_required_port: int
    busy: tuple[type[Exception], ...]  # what a step raises when it must be retried later

    def body_limit(self, path: str) -> int: ...

    def check_length(self, path: str, content_length: int) -> None: ...

    def publish_steps(self, path: str, query: bytes, body: bytes | None) -> Any: ...


class Later:
    """What a publish step returns when its outcome comes later (``pubgroup.py``: a batch
    published at the end of the loop turn): ``add`` a callback, called with ``None``
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


class PublishConnection(HTTPConnection):
    """One connection of an nsqd shard: its publishes served here, the rest by ``app``."""

    def __init__(self, app: ASGIApp, publisher: Publisher, connections: Connections) -> None:
        super().__init__(app, connections, max(publisher.body_limit("/pub"), publisher.body_limit("/mpub")))
        self.publisher = publisher

    def data_received(self, data: bytes) -> None:
        if (not self.queue and not self.busy and not self.closing and not self.refused and self.parser.idle
                and self._publish_plain(data)):
            return
        super().data_received(data)

    def _publish_plain(self, data: bytes) -> bool:
        """Serve ``data`` if it is exactly one plain publish (see the module doc) while
        nothing else is pending, without the parser; False to parse it as usual."""
        head = _PLAIN_HEAD.match(data)
        if head is None:
            return False
        target, path, fields = head.groups()
        fields = b"\n" + fields.lower()
        at = fields.find(b"\ncontent-length:") + 16
        if (at == 15 or fields.count(b"content-length") != 1 or _NOT_PLAIN.search(fields)
                or fields.count(b"\nhost:") != 1 or _HOST.search(fields) is None):
            return False
        length = fields[at:fields.index(b"\r", at)].strip(b" \t")
        end = head.end()
        size = len(data) - end
        publisher = self.publisher
        if (not length.isdigit() or len(length) > 15 or size != int(length)
                or (publisher.tls_required_port and self.scheme != "https")):
            return False
        req = Request(b"POST", target, "1.1", True)
        req.publish = True
        req.limit = publisher.body_limit("/pub" if path == b"/pub" else "/mpub")
        req.content_length = req.size = size
        if size > req.limit:
            return False
        req.chunks.append(data[end:])
        self.parser.after_post = True  # as if the parser had read it
        self._publish(req, None)
        return True

    def classify(self, req: Request) -> bool:
        publisher = self.publisher
        path = req.target.partition(b"?")[0]
        if (req.method != b"POST" or path not in _PUBLISH_PATHS
                or (publisher.tls_required_port and self.scheme != "https")):
            return super().classify(req)
        req.publish = True
        req.limit = publisher.body_limit(path.decode())
        if req.expect_continue and req.content_length > req.limit:
            req.keep_alive = False  # answered 413 in its turn; the body never comes
            return False
        return True

    def dispatch(self, req: Request) -> None:
        if req.publish:
            self._publish(req, None)
        else:
            super().dispatch(req)

    def _publish(self, req: Request, steps: Any) -> None:
        """Run ``req``'s publish steps; on ``busy`` retry later (the queue waits)."""
        pending: Step | None = None
        publisher = self.publisher
        try:
            if steps is None:
                raw_path, _, query = req.target.partition(b"?")
                path = raw_path.decode()
                publisher.check_length(path, req.content_length)
                if req.broken:
                    raise HTTPError(500, "INTERNAL_ERROR")  # nsqd's answer to a body it could not read
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
            self.pause_reading()
            asyncio.get_running_loop().call_later(RING_RETRY, self._retry, req, (pending, steps))
            return
        except HTTPError as exc:
            self.write(req, exc.status, _JSON, orjson.dumps({"message": exc.message}))
            return
        self._write_ok(req)

    def _joined(self, req: Request, steps: Any, error: HTTPError | None) -> None:
        self.busy = self.joined = False
        if self.transport is None or self.transport.is_closing():
            return
        if error is not None:
            self.write(req, error.status, _JSON, orjson.dumps({"message": error.message}))
        else:
            self._publish(req, (None, steps))
        self.serve()

    def _retry(self, req: Request, state: Any) -> None:
        self.busy = False
        if self.transport is None or self.transport.is_closing():
            return  # the client went away: what it sent is not stored, and it was not told OK
        self._publish(req, state)
        self.serve()

    def _write_ok(self, req: Request) -> None:
        assert self.transport is not None
        if not req.keep_alive or not req.http11 or self.last_answer:
            self.write(req, 200, [*TEXT, NSQ_HEADER], b"OK")
            return
        if time.time() >= _ok[0]:  # a new second: a new date
            _ok[:] = [float(int(time.time()) + 1), b"HTTP/1.1 200 OK\r\n" + CLOCK.date() + _OK_FIELDS + b"\r\n\r\nOK"]
        self.transport.write(_ok[1])

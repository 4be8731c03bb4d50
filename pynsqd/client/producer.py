"""Publishing: ``Producer`` (asyncio, TCP with pipelined commands, or HTTP) and
``SyncProducer`` (the same, blocking, for scripts).

Theory of operation. A ``Producer`` holds at most one TCP connection to one nsqd. Commands
are pipelined: any number of ``publish`` calls may be outstanding, nsqd answers them one by
one in order, and ``NSQProtocol`` hands each answer to the oldest waiting call. A failed
command raises ``ResponseError`` with nsqd's ``E_*`` code; nsqd closes the connection after
every publish error, so the next call reconnects (lazily, under a lock). Nothing is retried
automatically: a message whose answer was lost may or may not have been stored, and only the
caller can decide whether a duplicate is acceptable.

``SyncProducer`` runs a ``Producer`` on an event loop in a daemon thread (so heartbeats are
answered while the script is busy elsewhere) and blocks on each call.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

from pynsqd.client import http as nsq_http
from pynsqd.client.config import Features, Identity, TLSOptions
from pynsqd.client.connection import NSQProtocol
from pynsqd.client.errors import ClientClosedError
from pynsqd.client.handshake import open_connection
from pynsqd.wire.commands import encode_dpub, encode_mpub, encode_pub
from pynsqd.wire.names import is_valid_topic_name

T = TypeVar("T")
_SIZE = struct.Struct(">i")


def _check_topic(topic: str) -> None:
    if not is_valid_topic_name(topic):
        raise ValueError(f"invalid topic name {topic!r}")


class Producer:
    """Publishes to one nsqd. ``await connect()`` (optional: the first publish connects), then
    ``publish`` / ``multi_publish`` / ``deferred_publish``; ``await close()`` at the end (or use
    ``async with``). ``http_address`` enables ``publish_http`` / ``multi_publish_http``.
    ``tls_v1``, ``tls_options``, ``snappy``, ``deflate``, ``deflate_level`` and ``auth_secret``
    are negotiated on the TCP connection (see the package docstring); ``auth`` then holds
    nsqd's AUTH reply.

    Every method raises a subclass of ``NSQError``; see the package docstring.
    """

    def __init__(self, address: str = "", *, http_address: str = "", identity: Identity | None = None,
                 connect_timeout: float = 5.0, response_timeout: float | None = 60.0,
                 tls_v1: bool = False, tls_options: TLSOptions | ssl.SSLContext | None = None,
                 snappy: bool = False, deflate: bool = False, deflate_level: int = 6,
                 auth_secret: str | bytes = "") -> None:
        self.features = Features.make(tls_v1, tls_options, snappy, deflate, deflate_level, auth_secret)
        self.address = address
        self.http_address = http_address
        self.identity = identity or Identity()
        self.connect_timeout = connect_timeout
        self.response_timeout = response_timeout
        self.settings: dict[str, Any] = {}
        self._proto: NSQProtocol | None = None
        self._lock: asyncio.Lock | None = None
        self._http: Any = None
        self._closed = False

    async def __aenter__(self) -> Producer:
        if self.address:
            await self.connect()
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def auth(self) -> dict[str, Any] | None:
        """nsqd's AUTH reply (``identity``, ``identity_url``, ``permission_count``), if any."""
        return self._proto.auth if self._proto is not None else None

    @property
    def connected(self) -> bool:
        return self._proto is not None and self._proto.is_open

    async def connect(self) -> None:
        """Open the TCP connection if it is not open. Raises ``ConnectError``,
        ``NSQTimeoutError``, ``ResponseError`` or ``ClientClosedError``."""
        await self._connection()

    async def _connection(self) -> NSQProtocol:
        if self._closed:
            raise ClientClosedError("producer is closed")
        proto = self._proto
        if proto is not None and proto.is_open:
            return proto
        if not self.address:
            raise ValueError("this Producer has no nsqd TCP address")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._proto is not None and self._proto.is_open:
                return self._proto
            proto, self.settings = await open_connection(self.address, self.identity.to_json(),
                                                         self.connect_timeout, self.features)
            self._proto = proto
            return proto

    async def _command(self, data: bytes) -> None:
        proto = await self._connection()
        await proto.command(data, self.response_timeout)

    async def publish(self, topic: str, body: bytes) -> None:
        """PUB one message; returns once nsqd answered ``OK``."""
        _check_topic(topic)
        await self._command(encode_pub(topic, body))

    async def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """MPUB: all of ``bodies`` are stored, or none is (nsqd's rule)."""
        _check_topic(topic)
        if not bodies:
            raise ValueError("multi_publish needs at least one message")
        await self._command(encode_mpub(topic, list(bodies)))

    async def multi_publish_framed(self, topic: str, count: int, framed: bytes | memoryview) -> None:
        """MPUB ``count`` messages given already framed: ``framed`` is ``[4-byte big-endian
        size][body]`` per message, back to back (an MPUB body without its count), as a columnar
        writer builds it without a Python object per message. nsqd checks the framing: all
        are stored, or none is."""
        _check_topic(topic)
        if count < 1:
            raise ValueError("multi_publish_framed needs at least one message")
        head = b"MPUB " + topic.encode() + b"\n" + _SIZE.pack(len(framed) + 4) + _SIZE.pack(count)
        await self._command(head + framed)

    async def deferred_publish(self, topic: str, delay_ms: int, body: bytes) -> None:
        """DPUB: the message becomes visible to consumers after ``delay_ms``."""
        _check_topic(topic)
        await self._command(encode_dpub(topic, int(delay_ms), body))

    async def ping(self) -> None:
        """Make sure the connection is up (connecting if needed)."""
        await self._connection()

    # --- HTTP ---------------------------------------------------------------------------------
    def _http_client(self) -> Any:
        if self._closed:
            raise ClientClosedError("producer is closed")
        if not self.http_address:
            raise ValueError("this Producer has no nsqd HTTP address")
        if self._http is None:
            self._http = nsq_http.make_client(self.connect_timeout, self.response_timeout or 60.0)
        return self._http

    async def publish_http(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        """POST /pub (with ``defer`` when given). Raises ``HTTPError`` with NSQ's code."""
        params: dict[str, Any] = {"topic": topic}
        if defer_ms is not None:
            params["defer"] = int(defer_ms)
        await nsq_http.request(self._http_client(), "POST",
                               f"{nsq_http.base_url(self.http_address)}/pub", params=params, content=body)

    async def multi_publish_http(self, topic: str, bodies: Sequence[bytes]) -> None:
        """POST /mpub?binary=true (bodies may hold newlines)."""
        size = _SIZE
        payload = b"".join([size.pack(len(bodies))] + [size.pack(len(b)) + b for b in bodies])
        await nsq_http.request(self._http_client(), "POST",
                               f"{nsq_http.base_url(self.http_address)}/mpub",
                               params={"topic": topic, "binary": "true"}, content=payload)

    async def close(self) -> None:
        """Close the connection (after what is queued is written). Idempotent."""
        self._closed = True
        if self._proto is not None:
            self._proto.close()
            await self._proto.closed.wait()
            self._proto = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None


class SyncProducer:
    """A blocking ``Producer`` for scripts: the same methods without ``await``.

    Its event loop runs in a daemon thread; ``close()`` (or ``with``) stops it.
    """

    def __init__(self, address: str = "", **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pynsqd-producer", daemon=True)
        self._thread.start()
        self._producer = self._run(self._make(address, kwargs))

    @staticmethod
    async def _make(address: str, kwargs: dict[str, Any]) -> Producer:
        return Producer(address, **kwargs)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise ClientClosedError("producer is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def connect(self) -> None:
        self._run(self._producer.connect())

    def publish(self, topic: str, body: bytes) -> None:
        self._run(self._producer.publish(topic, body))

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        self._run(self._producer.multi_publish(topic, bodies))

    def deferred_publish(self, topic: str, delay_ms: int, body: bytes) -> None:
        self._run(self._producer.deferred_publish(topic, delay_ms, body))

    def publish_http(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        self._run(self._producer.publish_http(topic, body, defer_ms))

    def multi_publish_http(self, topic: str, bodies: Sequence[bytes]) -> None:
        self._run(self._producer.multi_publish_http(topic, bodies))

    def close(self) -> None:
        """Close the producer and stop its thread. Idempotent."""
        if not self._thread.is_alive():
            return
        try:
            self._run(self._producer.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

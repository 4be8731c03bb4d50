"""``pynsqd.client``: an asyncio NSQ client library (producer and consumer), built on the
sans-IO codec in ``pynsqd.wire``, following NSQ's client-library guide.

Public API (stable)::

    from pynsqd.client import Producer, SyncProducer, Consumer, Message, Identity

    async with Producer("127.0.0.1:4150", http_address="127.0.0.1:4151") as p:
        await p.publish("topic", b"body")                # PUB, returns on OK
        await p.multi_publish("topic", [b"a", b"b"])     # MPUB
        await p.deferred_publish("topic", 5000, b"x")    # DPUB, delay in ms
        await p.publish_http("topic", b"body", defer_ms=None)   # POST /pub
        await p.multi_publish_http("topic", [b"a", b"b"])       # POST /mpub?binary=true

    with SyncProducer("127.0.0.1:4150") as p:            # blocking facade, same methods
        p.publish("topic", b"body")

    def handler(message: Message) -> bool | None:         # or an ``async def``
        ...  # return normally → FIN; return False or raise → REQ (with backoff)

    consumer = Consumer("topic", "channel", handler,
                        nsqd_tcp_addresses=["127.0.0.1:4150"],      # and/or
                        lookupd_http_addresses=["127.0.0.1:4161"],
                        max_in_flight=200, max_attempts=5, on_discard=None,
                        requeue_delay=90.0, max_requeue_delay=900.0,
                        backoff_multiplier=1.0, max_backoff_duration=120.0,
                        lookupd_poll_interval=60.0, lookupd_poll_jitter=0.3,
                        low_rdy_idle_timeout=10.0, rdy_redistribute_interval=5.0,
                        reconnect_interval=1.0, max_reconnect_interval=60.0,
                        connect_timeout=5.0, identity=Identity(...))
    await consumer.start()
    consumer.is_starved(); consumer.stats; consumer.in_flight; consumer.conns
    await consumer.stop(grace=30.0)                      # graceful: CLS, wait, close

``Message``: ``id``, ``body``, ``attempts``, ``timestamp``, ``nsqd_address``, ``finish()``,
``requeue(delay=None, backoff=True)`` (delay in seconds), ``touch()``,
``disable_auto_response()``, ``responded``. Durations given to ``Consumer``/``Producer``
are seconds; ``Identity`` holds IDENTIFY fields in milliseconds, as on the wire.

Exceptions (every one the library raises derives from ``NSQError``)::

    NSQError
     ├── TransportError            network failure; __cause__ is the OSError / httpx error
     │    ├── ConnectError         could not connect (TCP or HTTP)
     │    ├── ConnectionClosedError   closed while a command waited, or before it was sent
     │    └── NSQTimeoutError      connect / response / HTTP request timed out
     ├── ResponseError             nsqd's error frame: .code ("E_BAD_TOPIC"…), .description, .fatal
     ├── HTTPError                 non-2xx from nsqd/nsqlookupd: .status, .code ("MSG_TOO_BIG"…)
     ├── ProtocolViolationError    the peer did not speak NSQ (bad frame, bad IDENTIFY reply)
     └── ClientClosedError         the producer/consumer was closed

Not supported yet: TLS, snappy/deflate and AUTH negotiation (IDENTIFY asks for none of them).

Modules: ``connection`` (the asyncio.Protocol adapter, the TCP error boundary), ``producer``,
``consumer``, ``message``, ``discovery`` (lookupd polling), ``rdy`` and ``backoff`` (pure
state), ``http`` (the HTTP error boundary), ``config`` (IDENTIFY), ``errors``.
"""

from __future__ import annotations

from pynsqd.client.config import Identity
from pynsqd.client.consumer import Consumer
from pynsqd.client.errors import (
    ClientClosedError,
    ConnectError,
    ConnectionClosedError,
    HTTPError,
    NSQError,
    NSQTimeoutError,
    ProtocolViolationError,
    ResponseError,
    TransportError,
)
from pynsqd.client.message import Message
from pynsqd.client.producer import Producer, SyncProducer

__all__ = [
    "ClientClosedError", "ConnectError", "ConnectionClosedError", "Consumer", "HTTPError", "Identity",
    "Message", "NSQError", "NSQTimeoutError", "Producer", "ProtocolViolationError", "ResponseError",
    "SyncProducer", "TransportError",
]

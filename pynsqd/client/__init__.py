"""``pynsqd.client``: an asyncio NSQ client library (producer and consumer), built on the
sans-IO codec in ``pynsqd.wire``, following NSQ's client-library guide.

Public API (stable)::

    from pynsqd.client import Producer, SyncProducer, Consumer, Message, Identity, TLSOptions

    async with Producer("127.0.0.1:4150", http_address="127.0.0.1:4151") as p:
        await p.publish("topic", b"body")                # PUB, returns on OK
        await p.multi_publish("topic", [b"a", b"b"])     # MPUB
        await p.multi_publish_framed("topic", 2, b"\0\0\0\1a\0\0\0\1b")  # MPUB, [4B size][body] each
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
                        connect_timeout=5.0, identity=Identity(...),
                        connections_per_nsqd=1,     # 0: enough that max_rdy_count never caps max_in_flight
                        **features)                 # TLS / compression / AUTH, below
    await consumer.start()
    consumer.is_starved(); consumer.stats; consumer.in_flight
    consumer.conns          # by address; a second connection to one nsqd is "address#1", and so on
    await consumer.stop(grace=30.0)                      # graceful: CLS, wait, close

Batch delivery, for high rates (no object or call per message; ``pynsqd.client.batch``)::

    def on_batch(batch: MessageBatch) -> bool | None:     # or an ``async def``
        ...  # same auto-response rules as a handler, for the batch's unanswered messages

    consumer = BatchConsumer("topic", "channel", on_batch, nsqd_tcp_addresses=[...],
                             max_in_flight=10000, ...)   # Consumer's options but max_attempts/on_discard
    # a batch is one read's run of messages from one nsqd, undecoded:
    len(batch); batch.nsqd_address; batch.ids(); batch.bodies(); batch.attempts()
    for timestamp_ns, attempts, msg_id, body in batch: ...
    batch.frames; batch.offsets           # frames[offsets[i]:offsets[i+1]] = message i's NSQ frame
    batch[i:j]                            # a slice, sharing the frames; answered on its own
    batch.disable_auto_response()         # then answer later, from anywhere on the loop:
    batch.finish(); batch.requeue(delay=None, backoff=True); batch.touch()   # one write each
    batch.responded                       # every message answered

TLS, compression and AUTH (keyword options of ``Producer``, ``SyncProducer`` and ``Consumer``,
go-nsq's names; negotiated in IDENTIFY, in NSQ's order TLS → compression → AUTH)::

    features = dict(
        tls_v1=True,                                      # ask for TLS (nsqd without a cert: stays plain)
        tls_options=TLSOptions(root_ca_file="ca.pem",     # default: the system's CAs
                               cert="client.pem", key="client.key",   # client certificate
                               insecure_skip_verify=False, min_version="tls1.2",
                               server_name=""),           # default: the host of the address
        # or tls_options=ssl.SSLContext(...) of your own
        snappy=False, deflate=True, deflate_level=6,      # at most one compression
        auth_secret="s3cret",                             # sent as AUTH when nsqd requires it
    )
    async with Producer("127.0.0.1:4150", **features) as p:
        await p.publish("topic", b"body")
        p.auth       # nsqd's AUTH reply: {"identity", "identity_url", "permission_count"}
        p.settings   # nsqd's IDENTIFY reply: {"tls_v1": True, "deflate": True, ...}
    # a Consumer's: consumer.conns[address].settings and consumer.conns[address].proto.auth

Invalid combinations (snappy with deflate, a level outside 1..9, unreadable certificate files,
a cert without its key) raise ``ValueError`` when the Producer/Consumer is made. A failed TLS
handshake (untrusted server, refused client certificate) is ``ConnectError``; a refused AUTH
is ``ResponseError`` with nsqd's code (``E_AUTH_FAILED``, ``E_UNAUTHORIZED``), and a server
that requires AUTH of a client without ``auth_secret`` gives ``E_AUTH_FIRST``.

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

Modules: ``connection`` (the asyncio.Protocol adapter), ``batch`` (frame runs, ``MessageBatch``),
``batchconsumer``, ``handshake`` (connect, IDENTIFY, TLS,
compression, AUTH: the TCP error boundary), ``producer``,
``consumer``, ``message``, ``discovery`` (lookupd polling), ``rdy`` and ``backoff`` (pure
state), ``http`` (the HTTP error boundary), ``config`` (IDENTIFY, ``TLSOptions``), ``errors``.
"""

from __future__ import annotations

from pynsqd.client.batch import MessageBatch
from pynsqd.client.batchconsumer import BatchConsumer
from pynsqd.client.config import Identity, TLSOptions
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
    "BatchConsumer", "ClientClosedError", "ConnectError", "ConnectionClosedError", "Consumer", "HTTPError", "Identity",
    "Message", "MessageBatch", "NSQError", "NSQTimeoutError", "Producer", "ProtocolViolationError", "ResponseError",
    "SyncProducer", "TLSOptions", "TransportError",
]

"""A byte pump between a client's connection and a socketpair leading to another shard.

Theory of operation
-------------------
A connection lives on the shard it was first handed to. When it later needs a topic owned by
another shard (a SUB after publishing elsewhere, or a connection that negotiated TLS or
compression here), this shard makes a ``socketpair``, hands the far end to the owner as an
ordinary plain connection (with the negotiated settings and the unread bytes, through the
supervisor, like any hand-off), and from then on only copies bytes: client → pair, pair →
client. The owner cannot tell the difference from a direct connection.

TLS and compression stay on this side: the client side of the pump is the connection's
transport (the TLS transport after a handshake, whose ``set_protocol`` swaps the pump in, so
it reads plaintext), wrapped by ``CompressedTransport`` when snappy or deflate is on (so
writes towards the client are compressed), and bytes read from the client pass through the
connection's codec (``decoder``) before they go into the pair. The owner only ever sees the
plain V2 stream. Flow control is end to end: when one side's write buffer
passes its high-water mark, reading from the other side pauses until it drains. Either side
closing closes the other once what is buffered has been written.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, Protocol

from pynsqd.node.messages import ConnectionState
from pynsqd.wire.compression import Codec, CompressionError

log = logging.getLogger("pynsqd.shard")


class Relayable(Protocol):
    """What relaying takes from a connection (``protocol.ClientV2``)."""

    transport: asyncio.Transport | None  # the client's (its TLS transport after a handshake)

    @property
    def remote_address(self) -> str: ...

    @property
    def decoder(self) -> Codec | None:
        """The inbound decompressor once snappy or deflate is on."""

    def relay_state(self) -> ConnectionState:
        """The connection's state for the shard it is relayed to."""

    def detach(self) -> None:
        """Stop serving the connection here without closing it."""


class _Side(asyncio.Protocol):
    def __init__(self, relay: Relay, name: str) -> None:
        self.relay = relay
        self.name = name

    def data_received(self, data: bytes) -> None:
        self.relay.forward(self, data)

    def eof_received(self) -> bool | None:
        self.relay.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()

    def pause_writing(self) -> None:
        self.relay.set_reading(self, False)

    def resume_writing(self) -> None:
        self.relay.set_reading(self, True)


class Relay:
    """Copies bytes both ways between ``client`` (a live transport) and ``pair`` (a socket)."""

    def __init__(self, client: asyncio.Transport, pair: socket.socket, decoder: Codec | None = None) -> None:
        self.client = client
        self.decoder = decoder
        self.pair: asyncio.Transport | None = None
        self._client_side = _Side(self, "client")
        self._pair_side = _Side(self, "pair")
        self._pending: list[bytes] = []  # client bytes that arrived before the pair connected
        self._closed = False
        client.set_protocol(self._client_side)
        client.resume_reading()
        self._task = asyncio.get_running_loop().create_task(self._connect(pair))

    async def _connect(self, pair: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.connect_accepted_socket(lambda: self._pair_side, pair)
        except OSError as exc:
            log.error("relay: cannot attach socketpair - %s", exc)
            pair.close()
            self.close()
            return
        self.pair = transport
        if self._closed:
            self.pair.close()
            return
        for data in self._pending:
            self.pair.write(data)
        self._pending.clear()

    def forward(self, side: _Side, data: bytes) -> None:
        if side is self._client_side:
            if self.decoder is not None:
                try:
                    data = b"".join(self.decoder.decode(data))
                except CompressionError as exc:
                    log.error("relay: failed to read command - %s", exc)
                    self.close()
                    return
            if self.pair is None:
                self._pending.append(data)
            else:
                self.pair.write(data)
        else:
            self.client.write(data)

    def set_reading(self, writer: _Side, on: bool) -> None:
        """``writer``'s buffer is full (or drained): pause (or resume) the other side."""
        other: Any = self.pair if writer is self._client_side else self.client
        if other is None or self._closed:
            return
        other.resume_reading() if on else other.pause_reading()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.client.close()
        if self.pair is not None:
            self.pair.close()

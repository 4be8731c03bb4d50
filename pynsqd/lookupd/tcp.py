"""nsqlookupd's TCP side: producers (nsqd nodes) identify, register and ping here.

Theory of operation
-------------------
Three layers, each testable alone:

- ``pynsqd.wire.lookup.ServerParser`` turns bytes into events and owns the protocol rules
  (magic, IDENTIFY once and first, names, limits); every error it returns is fatal.
- ``LookupSession`` applies events to the ``RegistrationDB`` for one connection and
  returns each reply's payload. It is pure: time comes in as an argument.
- ``LookupProtocol`` is the thin ``asyncio.Protocol``: it feeds received bytes to the
  parser, the events to the session, writes the replies in one write per read, and on an
  error writes it and closes. When the transport's write buffer is full it stops reading
  until it drains, so a client that pipelines PINGs without reading cannot grow memory.

When a connection ends, for whatever reason, its producer is removed from every
registration; the registrations themselves stay (NSQ's TestBasicLookupd).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import cast

from pynsqd.lookupd.registry import (
    CLIENT,
    PeerInfo,
    Producer,
    Registration,
    RegistrationDB,
    channel_key,
    topic_key,
)
from pynsqd.netaddr import format_address
from pynsqd.options import format_duration
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.lookup import (
    OK,
    Event,
    Identify,
    Ping,
    Register,
    ServerParser,
    Unregister,
    encode_error,
    encode_response,
)
from pynsqd.wire.names import is_ephemeral

Clock = Callable[[], int]


class LookupSession:
    """The registrations of one producer connection, applied to the shared DB.

    Call ``handle`` with each event from the parser (in order) and send back the payload
    it returns; call ``close`` once when the connection is gone.
    """

    def __init__(self, db: RegistrationDB, remote_address: str, identify_response: bytes,
                 log: logging.Logger) -> None:
        self.db = db
        self.remote_address = remote_address
        self.identify_response = identify_response
        self.log = log
        self.peer: PeerInfo | None = None

    def handle(self, event: Event, now: int) -> bytes:
        """Apply one event; returns the reply payload (``OK`` or the IDENTIFY JSON)."""
        if isinstance(event, Ping):
            if self.peer is not None:
                since = format_duration(now - self.peer.last_update)
                self.log.info("CLIENT(%s): pinged (last ping %s)", self.peer.id, since)
                self.peer.last_update = now
            return OK
        if isinstance(event, Identify):
            return self._identify(event, now)
        assert self.peer is not None  # the parser refuses (UN)REGISTER before IDENTIFY
        if isinstance(event, Register):
            if event.channel is not None:
                self._add(channel_key(event.topic, event.channel))
            self._add(topic_key(event.topic))
            return OK
        assert isinstance(event, Unregister)
        self._unregister(event.topic, event.channel)
        return OK

    def _identify(self, event: Identify, now: int) -> bytes:
        info = event.info
        self.peer = PeerInfo(
            id=self.remote_address, remote_address=self.remote_address, hostname=info.hostname,
            broadcast_address=info.broadcast_address, tcp_port=info.tcp_port,
            http_port=info.http_port, version=info.version, last_update=now,
        )
        self.log.info("CLIENT(%s): IDENTIFY Address:%s TCP:%d HTTP:%d Version:%s",
                      self.remote_address, info.broadcast_address, info.tcp_port,
                      info.http_port, info.version)
        self._add(CLIENT)
        return self.identify_response

    def _add(self, key: Registration) -> None:
        assert self.peer is not None
        if self.db.add_producer(key, Producer(self.peer)):
            self.log.info("DB: client(%s) REGISTER category:%s key:%s subkey:%s",
                          self.remote_address, *key)

    def _remove(self, key: Registration, level: int = logging.INFO) -> int:
        assert self.peer is not None
        removed, left = self.db.remove_producer(key, self.peer.id)
        if removed:
            prefix = "DB: " if level == logging.INFO else "unexpected "
            self.log.log(level, "%sclient(%s) UNREGISTER category:%s key:%s subkey:%s",
                         prefix, self.remote_address, *key)
        return left

    def _unregister(self, topic: str, channel: str | None) -> None:
        if channel is not None:
            key = channel_key(topic, channel)
            if self._remove(key) == 0 and is_ephemeral(channel):
                self.db.remove_registration(key)
            return
        # A topic unregistration: nsqd unregisters channels first, so any left is unusual.
        for key in self.db.find_registrations("channel", topic, "*"):
            self._remove(key, logging.WARNING)
        key = topic_key(topic)
        if self._remove(key) == 0 and is_ephemeral(topic):
            self.db.remove_registration(key)

    def close(self) -> None:
        """The connection ended: take this producer out of every registration."""
        if self.peer is None:
            return
        for key in self.db.lookup_registrations(self.peer.id):
            self._remove(key)
        self.peer = None


class LookupProtocol(asyncio.Protocol):
    """One producer connection on the event loop (see the module docstring)."""

    def __init__(self, db: RegistrationDB, identify_response: bytes, log: logging.Logger,
                 connections: set[LookupProtocol], clock: Clock = time.time_ns) -> None:
        self.db = db
        self.identify_response = identify_response
        self.log = log
        self.connections = connections
        self.clock = clock
        self.parser = ServerParser()
        self.transport: asyncio.Transport | None = None
        self.session: LookupSession | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        remote = format_address(transport.get_extra_info("peername") or ("", 0))
        self.session = LookupSession(self.db, remote, self.identify_response, self.log)
        self.connections.add(self)
        self.log.info("TCP: new client(%s)", remote)

    def data_received(self, data: bytes) -> None:
        self._dispatch(self.parser.feed(data))

    def eof_received(self) -> bool:
        self._dispatch(self.parser.feed_eof())
        return False  # close the transport

    def _dispatch(self, events: list[Event | ProtocolError]) -> None:
        transport, session = self.transport, self.session
        if not events or transport is None or session is None or transport.is_closing():
            return
        out: list[bytes] = []
        now = self.clock()
        for event in events:
            if isinstance(event, ProtocolError):
                self.log.error("[%s] - %s", session.remote_address, event.text)
                out.append(encode_error(event))
                transport.write(b"".join(out))
                transport.close()
                return
            out.append(encode_response(session.handle(event, now)))
        transport.write(b"".join(out))

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self.session is not None:
            self.log.info("PROTOCOL(V1): [%s] exiting ioloop", self.session.remote_address)
            self.session.close()
            self.session = None
        self.transport = None

    def close(self) -> None:
        """Close the connection (at shutdown); its registrations go in connection_lost."""
        if self.transport is not None:
            self.transport.close()

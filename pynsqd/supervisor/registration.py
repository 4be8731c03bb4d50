"""The node's registration with every nsqlookupd (nsqd's ``lookup.go`` / ``lookup_peer.go``).

Theory of operation
-------------------
One ``LookupPeer`` task per ``--lookupd-tcp-address`` holds a connection: magic ``  V1``,
IDENTIFY with the node's broadcast address and ports, then REGISTER for every topic
(``REGISTER t`` for a topic without channels, ``REGISTER t c`` per channel otherwise), then
a PING every ``PING_INTERVAL`` (15 s, nsqd's). Topic and channel creations and deletions
become REGISTER/UNREGISTER commands queued to every connected peer; each command gets one
reply (``OK`` or a fatal ``E_*``), read before the next is sent.

A failed connect, a closed connection (noticed within ``EOF_CHECK`` even when idle) or an
error reply drops the connection; the peer reconnects with back-off (``RECONNECT_MIN``
doubling to ``RECONNECT_MAX`` with jitter, ``pynsqd.backoff``; never slower than a ping)
and sends the whole state again, so a restarted nsqlookupd has everything back within one
ping interval. Commands queued while disconnected are discarded: the full
re-registration covers them. There is one identity per node whatever the shard count: the
supervisor owns this, not the shards.

When the node creates a topic, ``channels_for`` asks each lookupd's HTTP ``/channels``
(at the address lookupd announced in its IDENTIFY reply) which channels it knows, so the
node can pre-create them (ephemeral ones excepted), as nsqd does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from urllib.parse import quote

import orjson

from pynsqd.backoff import Backoff
from pynsqd.netaddr import split_host_port
from pynsqd.wire.errors import ProtocolError
from pynsqd.wire.lookup import (
    MAGIC,
    PING,
    IdentifyInfo,
    ResponseReader,
    decode_identify_response,
    encode_identify,
    encode_register,
    encode_unregister,
    response_error,
)

log = logging.getLogger("pynsqd.lookup")

PING_INTERVAL = 15.0
RECONNECT_MIN = 0.25
RECONNECT_MAX = 15.0
IO_TIMEOUT = 1.0  # nsqd's dial, read and write deadlines for lookupd
EOF_CHECK = 1.0   # how often an idle connection checks that lookupd is still there

Snapshot = Callable[[], list[tuple[str, list[str]]]]


class LookupPeer:
    """One nsqlookupd connection, kept alive by ``run``."""

    def __init__(self, address: str, identity: Callable[[], IdentifyInfo], snapshot: Snapshot,
                 max_response: int) -> None:
        self.address = address
        self.identity = identity
        self.snapshot = snapshot
        self.max_response = max_response
        self.connected = False
        self.http_address: str | None = None  # "host:port" from lookupd's IDENTIFY reply
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()

    def send(self, command: bytes) -> None:
        """Queue a REGISTER/UNREGISTER; dropped while disconnected (resent on reconnect)."""
        if self.connected:
            self._queue.put_nowait(command)

    async def run(self) -> None:
        retry = Backoff(RECONNECT_MIN, RECONNECT_MAX)
        while True:
            try:
                await self._session()
            except (OSError, TimeoutError, ProtocolError, ConnectionError) as exc:
                if self.connected:
                    log.warning("LOOKUPD(%s): connection lost - %s", self.address, exc)
                else:
                    log.debug("LOOKUPD(%s): cannot connect - %s", self.address, exc)
            if self.connected:
                retry.reset()
            self.connected = False
            await asyncio.sleep(retry.failed())

    async def _session(self) -> None:
        host, port = split_host_port(self.address, "lookupd-tcp-address")
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), IO_TIMEOUT)
        responses = ResponseReader(self.max_response)
        try:
            async def call(command: bytes) -> bytes:
                writer.write(command)
                await asyncio.wait_for(writer.drain(), IO_TIMEOUT)
                while True:
                    ready = responses.feed(await asyncio.wait_for(reader.read(65536), IO_TIMEOUT) or b"")
                    if ready:
                        reply = ready[0]
                        err = response_error(reply)
                        if err is not None:
                            raise err
                        return reply
                    if reader.at_eof():
                        raise ConnectionError("closed by nsqlookupd")

            info = decode_identify_response(await call(MAGIC + encode_identify(self.identity())))
            self.http_address = f"{info.get('broadcast_address')}:{info.get('http_port')}"
            log.info("LOOKUPD(%s): peer info %s", self.address, info)
            self._queue = asyncio.Queue()
            self.connected = True
            for topic, channels in self.snapshot():
                for command in ([encode_register(topic, c) for c in channels] or [encode_register(topic)]):
                    await call(command)
            loop = asyncio.get_running_loop()
            last = loop.time()
            while True:
                try:  # wake every second to notice a lookupd that went away
                    command = await asyncio.wait_for(self._queue.get(), EOF_CHECK)
                except TimeoutError:
                    if reader.at_eof():
                        raise ConnectionError("closed by nsqlookupd") from None
                    if loop.time() - last < PING_INTERVAL:
                        continue
                    command = PING
                await call(command)
                last = loop.time()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class Registration:
    """Every lookupd peer of the node; follows topic and channel changes."""

    def __init__(self, identity: Callable[[], IdentifyInfo], snapshot: Snapshot, max_response: int) -> None:
        self.identity = identity
        self.snapshot = snapshot
        self.max_response = max_response
        self.peers: dict[str, LookupPeer] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def set_addresses(self, addresses: list[str]) -> None:
        """Connect to new addresses, drop the ones no longer listed."""
        for address in list(self.peers):
            if address not in addresses:
                self._tasks.pop(address).cancel()
                del self.peers[address]
                log.info("LOOKUP: removed peer %s", address)
        for address in addresses:
            if address not in self.peers:
                peer = LookupPeer(address, self.identity, self.snapshot, self.max_response)
                self.peers[address] = peer
                self._tasks[address] = asyncio.get_running_loop().create_task(peer.run())
                log.info("LOOKUP: adding peer %s", address)

    def changed(self, event: str, topic: str, channel: str | None) -> None:
        """A topic or channel was created or deleted on this node."""
        command = (encode_register if event == "created" else encode_unregister)(topic, channel)
        for peer in self.peers.values():
            peer.send(command)

    async def channels_for(self, topic: str) -> set[str]:
        """Channels any lookupd knows for ``topic`` (for pre-creating them)."""
        found: set[str] = set()
        for peer in list(self.peers.values()):
            if peer.http_address:
                with contextlib.suppress(OSError, TimeoutError, ValueError):
                    found.update(await _get_channels(peer.http_address, topic))
        return found

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.peers.clear()


async def _get_channels(http_address: str, topic: str) -> list[str]:
    """``GET /channels?topic=`` on a lookupd (a one-shot HTTP/1.0 request)."""
    host, port = split_host_port(http_address, "lookupd http address")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), IO_TIMEOUT)
    try:
        writer.write(f"GET /channels?topic={quote(topic)} HTTP/1.0\r\nHost: {http_address}\r\n"
                     "Accept: application/vnd.nsq; version=1.0\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(1 << 20), IO_TIMEOUT * 2)
        while not reader.at_eof():
            more = await asyncio.wait_for(reader.read(1 << 20), IO_TIMEOUT * 2)
            if not more:
                break
            raw += more
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")):
        raise ValueError(f"lookupd answered {head[:40]!r}")
    channels = orjson.loads(body).get("channels")
    return [c for c in channels if isinstance(c, str)] if isinstance(channels, list) else []

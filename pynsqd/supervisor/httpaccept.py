"""HTTP and HTTPS connections: accepted by the supervisor, handed to the shards in turn.

Theory of operation
-------------------
Every shard serves the whole HTTP API, so any shard may take any HTTP connection; what
matters is that they share the connections evenly. A listening socket shared by the shards
does not: the kernel wakes every shard for a new connection, and whichever calls ``accept``
first takes everything queued, so a burst of keep-alive connections (a client's pool, a
50-connection benchmark) often lands on one shard and one core serves what two should.

``HTTPAcceptor`` accepts here instead and sends each connection to the next ready shard, round
robin, as an ``SCM_RIGHTS`` descriptor on its control channel (``serve_http``; the shard's
``EmbeddedServer.adopt`` serves it). Shards then differ by at most one connection. Each
wake-up accepts what is queued and sends each shard its share in one message, so a connection
costs the supervisor about one ``accept``; its requests never pass through the supervisor.
While no shard takes connections, nothing is accepted: new connections wait in the kernel's
backlog.

A shard takes connections when it is ready, reachable and beating
(``Slot.takes_connections``). A shard that dies takes its own connections with it (their
clients reconnect) and gets no new ones until it is ready again; connections whose hand-off
fails because it died after its turn was taken go to another shard instead of being closed. A
shard whose loop has not beaten for ``STALL_AFTER`` (stopped, or stuck in one long call) is
passed over until it beats again, so a stuck shard does not swallow new connections (what a
shared socket gives for free: a shard that is not running does not call ``accept``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Collection

from pynsqd.supervisor.slots import Slot

log = logging.getLogger("pynsqd.supervisor")

STALL_POLL = 0.2  # seconds between looks while every shard is booting or stalled
ACCEPT_RETRY = 0.1  # seconds to wait after accept fails for lack of descriptors or memory
ACCEPT_BATCH = 64  # connections accepted per wake-up at most (one control message per shard)
_TRANSIENT = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR}


class HTTPAcceptor:
    """Hands HTTP(S) connections to ``slots`` in turn; ``handed`` counts them."""

    def __init__(self, slots: list[Slot]) -> None:
        self.slots = slots
        self.handed = 0
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listening: dict[int, tuple[socket.socket, bool]] = {}  # fd → (listener, tls)
        self._paused: dict[int, asyncio.TimerHandle] = {}

    def _turn(self, skip: Collection[int] = ()) -> int | None:
        """Index of the next shard in turn that takes connections and is not in ``skip`` (the
        turn is not used up)."""
        for step in range(len(self.slots)):
            index = (self._next + step) % len(self.slots)
            if index not in skip and self.slots[index].takes_connections:
                return index
        return None

    def start(self, loop: asyncio.AbstractEventLoop, listener: socket.socket, tls: bool) -> None:
        """Accept from ``listener`` (``tls``: it is the HTTPS listener) until ``stop``."""
        self._loop = loop
        listener.setblocking(False)
        self._listening[listener.fileno()] = (listener, tls)
        loop.add_reader(listener.fileno(), self._readable, listener.fileno())

    def stop(self) -> None:
        for fd in self._listening:
            if fd in self._paused:
                self._paused.pop(fd).cancel()
            elif self._loop is not None:
                self._loop.remove_reader(fd)
        self._listening.clear()

    def _pause(self, fd: int, delay: float) -> None:
        """Stop reading ``fd`` for ``delay`` seconds; connections wait in the backlog."""
        assert self._loop is not None
        self._loop.remove_reader(fd)
        self._paused[fd] = self._loop.call_later(delay, self._resume, fd)

    def _resume(self, fd: int) -> None:
        self._paused.pop(fd, None)
        if fd in self._listening and self._loop is not None:
            self._loop.add_reader(fd, self._readable, fd)
            self._readable(fd)

    def _readable(self, fd: int) -> None:
        """Accept what is queued (up to ``ACCEPT_BATCH``), then send each shard its share in
        one control message: a connection costs one ``accept``, the batch one ``sendmsg``."""
        listener, tls = self._listening[fd]
        shares: dict[int, list[socket.socket]] = {}
        for _ in range(ACCEPT_BATCH):
            index = self._turn()
            if index is None:  # every shard booting or stalled: look again later
                self._pause(fd, STALL_POLL)
                break
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno not in _TRANSIENT:
                    log.error("%s: accept failed - %s", "HTTPS" if tls else "HTTP", exc)
                    self._pause(fd, ACCEPT_RETRY)
                    break
                continue
            shares.setdefault(index, []).append(conn)
            self._next = index + 1
        failed: set[int] = set()
        while shares:
            index, conns = shares.popitem()
            if self._hand(index, conns, tls):
                continue
            failed.add(index)  # it died since its turn was taken: give its share to another
            other = self._turn(skip=failed)
            if other is None:
                log.warning("%s: %d connection(s) closed - no shard could take them", "HTTPS" if tls else "HTTP",
                            len(conns))
                for conn in conns:
                    conn.close()
            else:
                shares.setdefault(other, []).extend(conns)

    def _hand(self, index: int, conns: list[socket.socket], tls: bool) -> bool:
        """Send ``conns`` to shard ``index`` (closing our copies); False, keeping them, if its
        control channel is gone."""
        channel = self.slots[index].channel
        try:
            if channel is None:
                raise ConnectionError(f"shard {index} has no control channel")
            channel.send({"op": "serve_http", "tls": tls}, b"", [c.fileno() for c in conns])
            if channel.closed:  # the send found the shard gone (EPIPE) and dropped the message
                raise ConnectionError(f"shard {index} closed its control channel")
        except OSError as exc:  # ConnectionError: the channel closed
            log.warning("%s: %d connection(s) not handed to shard %d - %s", "HTTPS" if tls else "HTTP",
                        len(conns), index, exc)
            return False
        self.handed += len(conns)
        for conn in conns:
            conn.close()  # the channel sent duplicates
        return True

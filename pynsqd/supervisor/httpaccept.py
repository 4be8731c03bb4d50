"""HTTP and HTTPS connections: accepted by the supervisor, handed to the shards in turn.

Theory of operation
-------------------
Every shard serves the whole HTTP API, so any shard may take any HTTP connection; what
matters is that they share the connections evenly. They used to accept from one shared
listening socket. Then the kernel wakes every shard for a new connection, and whichever
calls ``accept`` first takes everything queued. A burst of keep-alive connections, such as
a client's pool or a 50-connection benchmark, then landed unevenly. ``wrk -c50`` against a
2-shard node split 50/0, 38/12, 24/26, 31/19, 50/0 and 38/12 in six runs, and one core
served what two should.

``HTTPAcceptor.serve`` accepts here instead and sends each connection to the next ready
shard, round robin, as an ``SCM_RIGHTS`` descriptor on its control channel (``serve_http``;
the shard's ``EmbeddedServer.adopt`` serves it). Shards then differ by at most one
connection. A connection costs the supervisor one ``accept`` and one ``sendmsg``; its
requests never pass through the supervisor. While no shard takes connections, nothing is
accepted: new connections wait in the kernel's backlog, as they did before.

A shard takes connections when it is ready, reachable and beating (``Slot.takes_connections``).
A shard that dies takes its own connections with it (their clients reconnect) and gets no
new ones until it is ready again. A shard whose loop has not beaten for ``STALL_AFTER``
(stopped, or stuck in one long call) is passed over until it beats again, so a stuck shard
does not swallow new connections. A shared socket had that property for free: a shard
that is not running does not call ``accept``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket

from pynsqd.supervisor.slots import Slot

log = logging.getLogger("pynsqd.supervisor")

STALL_POLL = 0.2  # seconds between looks while every shard is booting or stalled
ACCEPT_RETRY = 0.1  # seconds to wait after accept fails for lack of descriptors or memory
_TRANSIENT = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR}


class HTTPAcceptor:
    """Hands HTTP(S) connections to ``slots`` in turn; ``handed`` counts them."""

    def __init__(self, slots: list[Slot]) -> None:
        self.slots = slots
        self.handed = 0
        self._next = 0

    def _take_turn(self) -> Slot | None:
        for _ in range(len(self.slots)):
            slot = self.slots[self._next % len(self.slots)]
            self._next += 1
            if slot.takes_connections:
                return slot
        return None

    async def next_slot(self) -> Slot:
        """The next shard in turn that takes connections; waits while none does (booting:
        its ``ready``; stalled: polled every ``STALL_POLL``)."""
        while (slot := self._take_turn()) is None:
            waits = [asyncio.ensure_future(s.ready.wait()) for s in self.slots if not s.is_ready]
            if not waits:  # all ready, all stalled
                await asyncio.sleep(STALL_POLL)
                continue
            try:
                await asyncio.wait(waits, timeout=STALL_POLL, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        return slot

    async def serve(self, listener: socket.socket, tls: bool) -> None:
        """Accept from ``listener`` until cancelled (``tls``: it is the HTTPS listener)."""
        loop = asyncio.get_running_loop()
        listener.setblocking(False)
        while True:
            slot = await self.next_slot()  # before accepting: none ready, none accepted
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno not in _TRANSIENT:
                    log.error("%s: accept failed - %s", "HTTPS" if tls else "HTTP", exc)
                    await asyncio.sleep(ACCEPT_RETRY)
                continue
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if not slot.takes_connections:  # died or stalled while we waited
                    slot = await self.next_slot()
                slot.channel.send({"op": "serve_http", "tls": tls}, b"", [conn.fileno()])  # type: ignore[union-attr]
                self.handed += 1
            except OSError as exc:  # ConnectionError: the channel closed
                log.warning("%s: connection not handed to a shard - %s", "HTTPS" if tls else "HTTP", exc)
            finally:
                conn.close()  # the channel sent a duplicate

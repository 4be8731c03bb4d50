"""HTTP and HTTPS connections: accepted by the supervisor, handed to the shards in turn.

Theory of operation
-------------------
Every shard serves the whole HTTP API, so any shard may take any HTTP connection; what
matters is that they share the connections evenly. A listening socket shared by the shards
does not: the kernel wakes every shard for a new connection, and whichever calls ``accept``
first takes everything queued, so a burst of keep-alive connections (a client's pool, a
50-connection benchmark) often lands on one shard and one core serves what two should.

``HTTPAcceptor`` accepts here instead (an ``accept.Acceptor`` per listener, which also rides
out a lack of descriptors) and sends each connection to the next ready shard, round robin, as
an ``SCM_RIGHTS`` descriptor on its control channel (``ServeHTTP``; the shard's
``HTTPServer.adopt`` serves it). Shards then differ by at most one connection. Each
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
import functools
import logging
import socket
from collections.abc import Collection

from pynsqd.node.messages import ServeHTTP
from pynsqd.supervisor.accept import Accepted, Acceptor
from pynsqd.supervisor.slots import Slot

log = logging.getLogger("pynsqd.supervisor")


class HTTPAcceptor:
    """Hands HTTP(S) connections to ``slots`` in turn; ``handed`` counts them."""

    def __init__(self, slots: list[Slot]) -> None:
        self.slots = slots
        self.handed = 0
        self._next = 0
        self._acceptors: list[Acceptor] = []

    def _turn(self, skip: Collection[int] = ()) -> int | None:
        """Index of the next shard in turn that takes connections and is not in ``skip`` (the
        turn is not used up)."""
        for step in range(len(self.slots)):
            index = (self._next + step) % len(self.slots)
            if index not in skip and self.slots[index].takes_connections:
                return index
        return None

    def _any_ready(self) -> bool:
        return self._turn() is not None

    def start(self, loop: asyncio.AbstractEventLoop, listener: socket.socket, tls: bool) -> None:
        """Accept from ``listener`` (``tls``: it is the HTTPS listener) until ``stop``."""
        acceptor = Acceptor("HTTPS" if tls else "HTTP", listener, functools.partial(self._share, tls),
                            self._any_ready)
        self._acceptors.append(acceptor)
        acceptor.start(loop)

    def stop(self) -> None:
        for acceptor in self._acceptors:
            acceptor.stop()
        self._acceptors.clear()

    def _share(self, tls: bool, accepted: Accepted) -> None:
        """Send each shard its share of ``accepted`` in one control message: a connection
        costs one ``accept``, the batch one ``sendmsg``."""
        shares: dict[int, list[socket.socket]] = {}
        for conn, _ in accepted:
            index = self._turn()
            if index is None:  # cannot happen within one callback: ready was checked
                conn.close()
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
            channel.send(ServeHTTP(tls), [c.fileno() for c in conns])
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

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

A shard takes connections when it is ready, reachable, beating and not being replaced
(``Slot.takes_connections``). ``ServeHTTP`` is a call: the shard answers before it reads a
byte of them, and the supervisor keeps its copies of the connections until then. A shard
that dies takes the connections it had served with it (their clients reconnect), but none it
had not yet acknowledged: those go to another shard, unread, as do connections whose
hand-off fails because it died after its turn was taken. A shard whose loop has not beaten
for ``STALL_AFTER`` (stopped, or stuck in one long call) is passed over until it beats
again, so a stuck shard does not swallow new connections (what a shared socket gives for
free: a shard that is not running does not call ``accept``).

Connections a shard being replaced gives back (idle between requests, ``give``) go to the
others the same way; while no shard takes connections (one shard, being replaced) they wait
here and go to the first that does (``flush``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import Collection

from pynsqd.node.control import ControlChannel
from pynsqd.node.messages import ServeHTTP
from pynsqd.supervisor.accept import Accepted, Acceptor
from pynsqd.supervisor.slots import Slot

log = logging.getLogger("pynsqd.supervisor")

ACK_WAIT = 600.0  # seconds a hand-off waits for the shard's answer (a stuck shard is killed sooner)


class HTTPAcceptor:
    """Hands HTTP(S) connections to ``slots`` in turn; ``handed`` counts them."""

    def __init__(self, slots: list[Slot]) -> None:
        self.slots = slots
        self.handed = 0
        self._next = 0
        self._acceptors: list[Acceptor] = []
        self._waiting: list[tuple[socket.socket, bool]] = []  # given back while no shard took any
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def unacknowledged(self) -> int:
        """Hand-offs whose shard has not yet said it has them."""
        return len(self._tasks)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The hand-offs waiting for their shard's answer."""
        return list(self._tasks)

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
        for conn, _ in self._waiting:
            conn.close()
        self._waiting.clear()

    def pause(self) -> None:
        """Accept nothing for now (connections wait in the backlog); ``resume`` again."""
        for acceptor in self._acceptors:
            acceptor.stop()

    def resume(self, loop: asyncio.AbstractEventLoop) -> None:
        for acceptor in self._acceptors:
            acceptor.start(loop)

    def give(self, conns: list[socket.socket], tls: bool) -> None:
        """Serve ``conns`` (given back by a shard being replaced) on another shard, or on the
        first that takes connections again."""
        self._waiting += [(conn, tls) for conn in conns]
        self.flush()

    def flush(self) -> None:
        """Hand out the connections waiting for a shard, if one takes connections now."""
        if not self._waiting or not self._any_ready():
            return
        waiting, self._waiting = self._waiting, []
        for tls in (False, True):
            conns = [conn for conn, t in waiting if t is tls]
            if conns:
                self._share(tls, [(conn, ()) for conn in conns])

    def _share(self, tls: bool, accepted: Accepted, skip: Collection[int] = ()) -> None:
        """Send each shard its share of ``accepted`` in one control message: a connection
        costs one ``accept``, the batch one ``sendmsg``."""
        shares: dict[int, list[socket.socket]] = {}
        for conn, _ in accepted:
            index = self._turn(skip)
            if index is None:  # none takes connections now: they wait for one
                self._waiting.append((conn, tls))
                continue
            shares.setdefault(index, []).append(conn)
            self._next = index + 1
        failed: set[int] = set(skip)
        while shares:
            index, conns = shares.popitem()
            if self._hand(index, conns, tls):
                continue
            failed.add(index)  # it died since its turn was taken: give its share to another
            other = self._turn(skip=failed)
            if other is None:
                self._waiting += [(conn, tls) for conn in conns]
            else:
                shares.setdefault(other, []).extend(conns)

    def _hand(self, index: int, conns: list[socket.socket], tls: bool) -> bool:
        """Send ``conns`` to shard ``index``; our copies are closed once it has them. False,
        keeping them, if its control channel is gone."""
        channel = self.slots[index].channel
        if channel is None or channel.closed:
            return False
        self.handed += len(conns)
        task = asyncio.get_running_loop().create_task(self._deliver(index, channel, conns, tls))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _deliver(self, index: int, channel: ControlChannel, conns: list[socket.socket], tls: bool) -> None:
        try:
            await channel.call(ServeHTTP(tls), [c.fileno() for c in conns], wait=ACK_WAIT)
        except ConnectionError:  # it died before it had them: not a byte was read
            log.warning("%s: %d connection(s) not taken by shard %d; handing them to another",
                        "HTTPS" if tls else "HTTP", len(conns), index)
            self.handed -= len(conns)
            self._share(tls, [(conn, ()) for conn in conns], skip={index})
            return
        except TimeoutError:  # alive but silent for that long: it may have them
            pass
        for conn in conns:
            conn.close()

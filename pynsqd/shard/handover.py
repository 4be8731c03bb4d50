"""A shard's process replaced by a new one: the old process's two phases and the new one's.

Theory of operation
-------------------
The supervisor (``supervisor/reload.py``) starts the replacement as a *standby* worker, which
boots everything that does not touch the shard's queues and says ``Standby``. Then:

1. ``Drain`` to the old process, which keeps serving TCP meanwhile. A process that still
   recovers its logs after a crash finishes that first (``recovered``; or answers
   ``Failed`` after ``RECOVERY_WAIT``, and is not replaced). Its plain HTTP
   connections are given back to the supervisor one by one as each becomes idle between two
   requests with nothing of the next one read (``HTTPConnection.release``), so no request is
   ever caught half-way: the next one waits in the socket for the shard the supervisor hands
   it to. HTTPS connections cannot move (their TLS state lives here): each closes after the
   answer that leaves it owing nothing, which says ``Connection: close``. Every disk queue
   is synced now, so little is left unsynced at the release. Bounded by ``wait``; answered
   ``Done``. (The supervisor hands this shard no new HTTP connection from the start.)
2. ``Release``: the supervisor holds new TCP connections for this shard from here on. The
   old process stops pumping, waits up to ``WRITE_WAIT`` for its connections' transports to
   write what they hold (still reading commands, so publishers wait for nothing yet), stops
   reading (``freeze``), then — in one synchronous step —
   captures its state (``transfer.capture``: what cannot move is closed, its in-flight
   messages requeued), lets go of every queue (``Broker.hand_over``) and ring, and sends
   the state as ``Handover`` parts, which the supervisor relays to the replacement; then it
   answers ``Done`` and exits. HTTP connections still open (busy past the drain, or HTTPS
   never used again) are closed; counted in the log.
3. The replacement (``Takeover``) attaches to the queues, puts what was in flight back in
   flight, serves the connections, drains its inbound rings and says ``Ready``.

Publishes to the shard's topics wait between 2 and 3 (TCP connections are not read; HTTP
publishes and other shards' publishes go into the inbound rings, which the replacement
drains), and never fail. Each inbound ring keeps one producer and one consumer process at a
time: the old process stops consuming and producing before it sends anything, and the new
one starts only after the last part.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from pynsqd.httpserver import HTTPServer
from pynsqd.node.control import ControlChannel
from pynsqd.node.messages import ConnectionState, Handover, ServeHTTP
from pynsqd.shard.broker import Broker
from pynsqd.shard.protocol import ClientV2
from pynsqd.shard.transfer import PART_FDS, Captured, Part, Restorer, capture, parts

log = logging.getLogger("pynsqd.shard")

POLL = 0.005  # seconds between looks at idle HTTP connections and transports' buffers
WRITE_WAIT = 0.2  # seconds a frozen shard waits for its connections to write out
RECOVERY_WAIT = 60.0  # seconds a shard to be replaced gives its recovery after a crash to end


async def recovered(broker: Broker) -> bool:
    """Until no log is being recovered (a process restarted after a crash walks them while it
    serves, ``recovery.py``): only then is every queue's bookkeeping exact, to be handed over.
    False after ``RECOVERY_WAIT``."""
    for _ in range(int(RECOVERY_WAIT / POLL)):  # polled: the walk runs in the loop's turns
        if not broker.recovery.active:
            return True
        await asyncio.sleep(POLL)
    return not broker.recovery.active


async def drain(broker: Broker, control: ControlChannel, http: HTTPServer | None,
                https: HTTPServer | None, wait: float) -> None:
    """Phase 1 (see the module doc)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    broker.sync_all()
    if https is not None:
        https.finish_all()
    given = 0
    while True:
        if http is not None:
            idle = http.release_idle()
            given += len(idle)
            for start in range(0, len(idle), PART_FDS):
                batch = idle[start:start + PART_FDS]
                control.send(ServeHTTP(False), [s.fileno() for s in batch])
            for sock in idle:
                sock.close()
        still = sum(s.open_connections for s in (http, https) if s is not None)
        syncing = broker.syncer is not None and broker.syncer.busy
        if (not still and not syncing) or loop.time() >= deadline:
            break
        await asyncio.sleep(POLL)
    log.info("drained: %d idle HTTP connection(s) handed back, %d still open", given, still)


async def release(broker: Broker, servers: list[HTTPServer], relays: list[Any]) -> Captured:
    """Phase 2 up to the parts (see the module doc): the caller sends them, then exits.

    Delivery stops first, while commands are still read (publishers wait for nothing yet),
    so what the transports hold is written out before reading stops too; only a consumer
    that reads too slowly to take its last bytes within ``WRITE_WAIT`` cannot move."""
    started = time.monotonic()
    broker.frozen = True
    await _written(broker)
    clients = [c for c in broker.clients if isinstance(c, ClientV2)]
    for client in clients:
        client.freeze()
    frozen = time.monotonic()
    closed = sum(server.close_all() for server in servers)
    if closed:
        log.info("closed %d HTTP connection(s) still open", closed)
    await _written(broker)  # an answer to the last commands read
    # from here on, nothing awaits: the state captured is the state handed over
    captured = capture(broker)
    broker.hand_over()
    for relay in relays:
        relay.close()
    if captured.closed or relays:
        log.info("closed %d connection(s) that cannot move (TLS or compression): %d message(s) in flight "
                 "queued again at once", captured.closed + len(relays), captured.requeued)
    log.info("handing %d connection(s) over (delivery stopped %.1f ms before reading, captured in %.1f ms)",
             captured.moved, (frozen - started) * 1000, (time.monotonic() - frozen) * 1000)
    return captured


async def _written(broker: Broker) -> None:
    """Until no plain connection's transport holds bytes to write (``WRITE_WAIT`` at most)."""
    for _ in range(int(WRITE_WAIT / POLL)):  # polled: many transports
        if not any(_writing(c) for c in broker.clients if isinstance(c, ClientV2)):
            return
        await asyncio.sleep(POLL)


def _writing(client: ClientV2) -> bool:
    """Plain, and its transport still holds bytes to write."""
    transport = client.transport
    return (transport is not None and not transport.is_closing() and transport.get_extra_info("ssl_object") is None
            and bool(transport.get_write_buffer_size()))


def send(control: ControlChannel, captured: Captured) -> None:
    """The parts to the supervisor, which relays them to the replacement."""
    try:
        for number, last, doc, fds in parts(captured):
            control.send(Handover(number, last, doc), fds)
    finally:
        captured.close_fds()


class Takeover:
    """The replacement's side: collects the parts, then restores (``transfer.Restorer``)."""

    def __init__(self, broker: Broker, make_client: Callable[[ConnectionState, bytes], ClientV2]) -> None:
        self.restorer = Restorer(broker, make_client)
        self.complete = asyncio.Event()
        self.failed: str | None = None
        self.queues_ms = 0.0

    def receive(self, msg: Handover, fds: list[int]) -> None:
        try:
            part = Part.decode(msg.doc)
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            self.failed = str(exc)
            self.complete.set()
            return
        self.restorer.add(part, fds)
        if msg.last:
            self.complete.set()

    def restore_queues(self) -> None:
        started = time.monotonic()
        self.restorer.restore_queues()
        self.queues_ms = (time.monotonic() - started) * 1000

    async def connect(self) -> None:
        started = time.monotonic()
        failed = await self.restorer.connect()
        log.info("took over %d connection(s) (%d message(s) in flight)%s: queues in %.1f ms, connections in "
                 "%.1f ms", len(self.restorer.clients), self.restorer.held,
                 f", {failed} lost on the way" if failed else "", self.queues_ms,
                 (time.monotonic() - started) * 1000)

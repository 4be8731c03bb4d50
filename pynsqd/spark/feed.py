"""The source's consumer: a ``pynsqd.client.BatchConsumer`` on a loop thread, answering only on demand.

Theory of operation
-------------------
The driver-side runner calls ``take``/``finish`` synchronously; the consumer lives on a
``LoopThread``, and every piece of the Feed's state is touched only there (the runner's calls
are coroutines run on the loop with ``LoopThread.call``). The consumer delivers
``MessageBatch``es — a read's run of undecoded message frames from one nsqd — with auto-response
disabled; they are queued as they are, so no Python object exists per message.

The consumer holds ``maxInFlight`` messages (two Spark batches and what arrives meanwhile:
300,000 at the defaults) although nsqd lets one connection hold only its ``--max-rdy-count``
(2,500 by default): it keeps as many connections to each nsqd as that takes
(``connections_per_nsqd=0``), each an ordinary client with its own RDY on the same channel.

``take(n)`` pops batches until ``n`` messages are taken, slicing the last one (``batch[:k]``
goes, ``batch[k:]`` stays queued; slices share the frames). ``finish(batches)`` FINs each
batch — one joined write per batch, on the connection that delivered it — once its Spark
batch is committed; it returns at once and the FINs are written on the loop thread while
Spark plans the next batch. A batch whose connection died meanwhile sends nothing: nsqd
already gave those messages back and delivers them again, so nothing is lost.

Every held batch — queued or taken — is TOUCHed (one joined write) once it has been held for
half the message timeout, so a slow Spark batch (or a long wait for the next trigger) does
not make nsqd redeliver messages Spark is still working on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from pynsqd.client import BatchConsumer, Identity, MessageBatch
from pynsqd.spark import trace
from pynsqd.spark.loopthread import shared
from pynsqd.spark.options import SourceOptions

log = logging.getLogger(__name__)

COUNT_POLL = 0.01  # how often ``wait_for_count`` looks at the buffered count


class Feed:
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._lt = shared()
        self._buffer: deque[MessageBatch] = deque()  # loop thread only, as everything below
        self.buffered = 0  # messages in ``_buffer`` (read by the runner thread: an int, no lock needed)
        self._arrived = threading.Event()
        self._held: dict[MessageBatch, float] = {}  # every unanswered batch → when last TOUCHed
        self._consumer: BatchConsumer | None = None
        self._touch_task: asyncio.Task[None] | None = None
        self._start_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._lt.call(self._start())

    async def _start(self) -> None:
        self._consumer = BatchConsumer(
            self.opts.topic, self.opts.channel, self._on_batch,
            nsqd_tcp_addresses=self.opts.nsqd, lookupd_http_addresses=self.opts.lookupd,
            max_in_flight=self.opts.max_in_flight, connections_per_nsqd=0, lookupd_poll_interval=15.0,
            identity=Identity(msg_timeout=self.opts.msg_timeout_ms, user_agent="pynsqd.spark"),
        )
        # start() waits up to connect_timeout for the first connections; messages flow as soon as
        # they are up, so do not hold the runner for it.
        self._start_task = asyncio.ensure_future(self._consumer.start())
        self._touch_task = asyncio.ensure_future(self._touch_loop())

    def _on_batch(self, batch: MessageBatch) -> None:
        batch.disable_auto_response()
        self._held[batch] = time.monotonic()
        self._buffer.append(batch)
        self.buffered += len(batch)
        if trace.enabled():
            trace.event("recv", n=len(batch), inflight=self._consumer.in_flight if self._consumer else -1,
                        buffered=self.buffered)
        if not self._arrived.is_set():  # Event.set takes a lock: once per idle period, not per batch
            self._arrived.set()

    async def _touch_loop(self) -> None:
        half = self.opts.msg_timeout_ms / 2000.0
        while True:
            await asyncio.sleep(half / 4)
            now = time.monotonic()
            for batch, since in list(self._held.items()):
                if now - since >= half and not batch.responded:
                    self._answer(batch.touch)
                    self._held[batch] = now

    @staticmethod
    def _answer(command: Callable[[], None]) -> None:
        """FIN or TOUCH; a connection that died meanwhile already gave its messages back to nsqd
        (they will be delivered again), so a failure here loses nothing and must not fail the query."""
        try:
            command()
        except Exception as exc:
            log.warning("pynsqd.spark: could not answer messages: %s", exc)

    def wait_for_messages(self, timeout: float) -> bool:
        """Block until at least one message is buffered, or ``timeout`` seconds passed."""
        return self._arrived.wait(timeout)

    def wait_for_count(self, n: int, timeout: float) -> int:
        """Block until ``n`` messages are buffered or ``timeout`` seconds passed; returns how many are."""
        deadline = time.monotonic() + timeout
        while self.buffered < n and time.monotonic() < deadline:
            time.sleep(COUNT_POLL)
        return self.buffered

    def take(self, n: int) -> list[MessageBatch]:
        """Up to ``n`` buffered messages, as batches (the last one maybe a slice)."""
        return self._lt.call(self._take(n))

    async def _take(self, n: int) -> list[MessageBatch]:
        out: list[MessageBatch] = []
        buffer, held = self._buffer, self._held
        while buffer and n > 0:
            batch = buffer[0]
            if len(batch) <= n:
                out.append(buffer.popleft())
                n -= len(batch)
                continue
            head, tail = batch[:n], batch[n:]
            since = held.pop(batch)
            held[head] = held[tail] = since
            buffer[0] = tail
            out.append(head)
            n = 0
        self.buffered -= sum(len(b) for b in out)
        if not buffer:
            self._arrived.clear()
        return out

    def finish(self, batches: list[MessageBatch]) -> None:
        """FIN every message of ``batches`` (their Spark batch is committed). Returns at once:
        the FINs are written on the loop thread while Spark plans the next batch (a later
        ``take``, TOUCH or ``close`` runs after them)."""
        self._lt.soon(lambda: self._finish(batches))

    def _finish(self, batches: list[MessageBatch]) -> None:
        held = self._held
        trace.event("fin.in", batches=len(batches))
        for batch in batches:
            held.pop(batch, None)
            if not batch.responded:
                self._answer(batch.finish)

    def close(self) -> None:
        self._lt.call(self._close())

    async def _close(self) -> None:
        if self._touch_task is not None:
            self._touch_task.cancel()
        if self._consumer is not None:
            await self._consumer.stop(grace=0.0)

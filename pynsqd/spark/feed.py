"""The source's consumer: ``pynsqd.client.Consumer`` on a loop thread, answering only on demand.

Theory of operation
-------------------
The driver-side runner calls ``take``/``finish`` synchronously; the consumer lives on a
``LoopThread``. Every delivered message has its auto-response disabled and is appended to a
deque (the handler runs on the loop thread). ``take(n)`` pops up to ``n`` of them for a batch
(the runner's thread; ``deque.popleft`` is atomic). ``finish(held)`` runs the FINs on the loop
thread and returns once they were handed to the connections, after which the held messages
are forgotten. The consumer is made with ``max_attempts=0``: discarding a message is a FIN
without a commit, which the source must never do.

Every unanswered message — buffered or in a batch — is TOUCHed once it has been held for
half the message timeout, so a slow batch (or a long wait for the next trigger) does not
make nsqd redeliver messages Spark is still working on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from pynsqd.client import Consumer, Identity, Message
from pynsqd.spark.loopthread import shared
from pynsqd.spark.options import SourceOptions
from pynsqd.wire.message import encode_message

log = logging.getLogger(__name__)


class Held:
    """A message in a batch: where it came from, its bytes as NSQ sent them, and the message."""

    __slots__ = ("message", "nsqd", "raw")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.nsqd = message.nsqd_address
        self.raw = encode_message(message.timestamp, message.attempts, message.id, message.body)


class Feed:
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._lt = shared()
        self._buffer: deque[Message] = deque()
        self._arrived = threading.Event()
        self._touched: dict[bytes, tuple[Message, float]] = {}  # loop thread only
        self._consumer: Consumer | None = None
        self._touch_task: asyncio.Task[None] | None = None
        self._start_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._lt.call(self._start())

    async def _start(self) -> None:
        self._consumer = Consumer(
            self.opts.topic, self.opts.channel, self._on_message,
            nsqd_tcp_addresses=self.opts.nsqd, lookupd_http_addresses=self.opts.lookupd,
            max_in_flight=self.opts.max_in_flight, max_attempts=0,
            lookupd_poll_interval=15.0,
            identity=Identity(msg_timeout=self.opts.msg_timeout_ms, user_agent="pynsqd.spark"),
        )
        # start() waits up to connect_timeout for the first connections; messages flow as soon as
        # they are up, so do not hold the runner for it.
        self._start_task = asyncio.ensure_future(self._consumer.start())
        self._touch_task = asyncio.ensure_future(self._touch_loop())

    def _on_message(self, message: Message) -> None:
        message.disable_auto_response()
        self._touched[message.id] = (message, time.monotonic())
        self._buffer.append(message)
        if not self._arrived.is_set():  # Event.set takes a lock: once per idle period, not per message
            self._arrived.set()

    async def _touch_loop(self) -> None:
        half = self.opts.msg_timeout_ms / 2000.0
        while True:
            await asyncio.sleep(half / 4)
            now = time.monotonic()
            for msg_id, (message, since) in list(self._touched.items()):
                if now - since >= half and not message.responded:
                    self._answer(message.touch)
                    self._touched[msg_id] = (message, now)

    @staticmethod
    def _answer(command: Callable[[], None]) -> None:
        """FIN or TOUCH; a connection that died meanwhile already gave its messages back to nsqd
        (they will be delivered again), so a failure here loses nothing and must not fail the query."""
        try:
            command()
        except Exception as exc:
            log.warning("pynsqd.spark: could not answer a message: %s", exc)

    def wait_for_messages(self, timeout: float) -> bool:
        """Block until at least one message is buffered, or ``timeout`` seconds passed."""
        return self._arrived.wait(timeout)

    def take(self, n: int) -> list[Held]:
        out: list[Held] = []
        pop = self._buffer.popleft
        try:
            while len(out) < n:
                out.append(Held(pop()))
        except IndexError:
            self._arrived.clear()
        return out

    def finish(self, held: list[Held]) -> None:
        """FIN every held message (its batch is committed); returns once they were sent."""
        self._lt.call(self._finish(held))

    async def _finish(self, held: list[Held]) -> None:
        touched = self._touched
        for h in held:
            touched.pop(h.message.id, None)
            if not h.message.responded:
                self._answer(h.message.finish)

    def close(self) -> None:
        self._lt.call(self._close())

    async def _close(self) -> None:
        if self._touch_task is not None:
            self._touch_task.cancel()
        if self._consumer is not None:
            await self._consumer.stop(grace=0.0)

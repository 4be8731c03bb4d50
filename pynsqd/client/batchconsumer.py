"""``BatchConsumer``: a ``Consumer`` whose handler receives whole ``MessageBatch``es.

Theory of operation. Everything but delivery is the ``Consumer``'s: discovery, reconnection,
RDY, backoff, graceful stop. ``_attach`` switches each subscribed connection to batch mode
(``NSQProtocol.deliver_batches``) before its first RDY, so the connection hands over runs of
undecoded message frames (``pynsqd.client.batch``) and this class calls the handler once per
run: the RDY book, the in-flight count and the stats are updated once per run, by its length.
RDY is re-checked on arrival too, not only on answers (a ``Consumer`` re-sends RDY after a
handled message): a batch handler typically holds its messages, and a new connection's RDY 1
must grow to its share with its first run, not at the next redistribution tick.

Answers (``MessageBatch.finish``/``requeue``/``touch``) are one write of joined commands on
the delivering connection; then ``Consumer._answered`` does the in-flight/RDY bookkeeping for
the whole count and feeds backoff one result per answer (a batch succeeds or fails as one).
A batch answered after its connection was lost sends nothing: nsqd already gave its messages
back (they are delivered again), as for a ``Message``.

Auto-response mirrors the ``Consumer``: when the handler returns normally, its unanswered
messages are FINed; when it returns ``False`` or raises, they are REQueued (with backoff) —
unless it called ``batch.disable_auto_response()``, after which the application answers,
from anywhere on the loop, possibly much later (holding messages needs RDY for them:
``max_in_flight`` bounds what is delivered and not yet answered). There is no
``max_attempts`` discard: ``batch.attempts()`` is there for the application to decide.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pynsqd.client.batch import MessageBatch, join_commands
from pynsqd.client.consumer import Answering, Consumer, _Conn, call_handler

log = logging.getLogger("pynsqd.client")

BatchHandler = Callable[[MessageBatch], "bool | Awaitable[bool | None] | None"]


class BatchConsumer(Consumer):
    """Subscribes ``handler`` to ``topic``/``channel``; ``handler(batch)`` per delivered run of
    messages. Takes ``Consumer``'s keyword options except ``max_attempts`` and ``on_discard``."""

    def __init__(self, topic: str, channel: str, handler: BatchHandler, **options: Any) -> None:
        for name in ("max_attempts", "on_discard"):
            if name in options:
                raise TypeError(f"BatchConsumer has no {name} option: the handler sees batch.attempts()")
        super().__init__(topic, channel, handler, max_attempts=0, **options)  # type: ignore[arg-type]
        self.batch_handler = handler

    def _attach(self, conn: _Conn) -> None:
        answers = BatchAnswers(self, conn)
        conn.proto.deliver_batches(lambda frames, offsets: self._on_batch(answers, frames, offsets))

    def _on_batch(self, answers: BatchAnswers, frames: bytes, offsets: list[int]) -> None:
        conn = answers.conn
        count = len(offsets) - 1
        self.stats["received"] += count
        self._in_flight += count
        self._idle.clear()
        self.rdy.on_message(conn.address, self._loop.time(), count)
        if not self.backoff.active and not self._stopping:
            want = self.rdy.wants_update(conn.address)
            if want is not None:  # a fresh connection's RDY 1 becomes its share at its first run
                self._send_rdy(conn.address, want)
        batch = MessageBatch(answers, frames, offsets)
        if self._is_coroutine:
            self._track(self._run_batch(batch, None))
            return
        result = call_handler(self.batch_handler, batch)
        if inspect.isawaitable(result):
            self._track(self._run_batch(batch, result))
        else:
            self._auto_respond_batch(batch, result)

    async def _run_batch(self, batch: MessageBatch, awaitable: Awaitable[bool | None] | None) -> None:
        try:
            result = await (awaitable if awaitable is not None else self.batch_handler(batch))  # type: ignore[misc]
        except Exception:
            log.exception("handler failed for %r", batch)
            result = False
        self._auto_respond_batch(batch, result)

    def _auto_respond_batch(self, batch: MessageBatch, result: object) -> None:
        if not batch.auto_response:
            return
        for part in batch.unanswered():
            if result is False:
                part.requeue()
            else:
                part.finish()



class BatchAnswers(Answering):
    """The ``BatchResponder`` of the runs one connection delivers: each answer is one write."""

    __slots__ = ()

    def finish(self, batch: MessageBatch) -> None:
        self.consumer.stats["finished"] += len(batch)
        self.answer(join_commands(b"FIN", batch.ids()), len(batch), True)

    def requeue(self, batch: MessageBatch, delay: float | None, backoff: bool) -> None:
        consumer = self.consumer
        ids = batch.ids()
        if delay is None:
            cap, step = consumer.max_requeue_delay, consumer.requeue_delay
            delays = [int(min(step * attempts, cap) * 1000) for attempts in batch.attempts()]
        else:
            delays = [max(0, int(delay * 1000))] * len(ids)
        consumer.stats["requeued"] += len(batch)
        self.answer(b"".join([b"REQ %s %d\n" % pair for pair in zip(ids, delays)]), len(batch),
                    False if backoff else None)

    def touch(self, batch: MessageBatch) -> None:
        self.conn.send(join_commands(b"TOUCH", batch.ids()))


__all__ = ["BatchConsumer", "BatchHandler"]


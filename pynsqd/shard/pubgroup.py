"""HTTP ``/pub`` requests of one loop turn, published per topic as one batch.

Theory of operation
-------------------
A ``Broker.publish`` of one message costs several times what one message of a batch does
(a clock read, an id, a topic lookup, a log append or a ring record, each per call). Many
keep-alive ``/pub`` connections (one request in flight each, as a client waiting for ``OK``)
deliver their requests in the same loop turn, so ``join`` does not publish: it adds the body
to the turn's open batch for its topic and returns a ``Later``. The first join of a turn
arranges one ``call_soon``; it runs after every connection made readable by that turn's
poll was read, publishes each batch with one ``Broker.publish`` (stored whole or not at all)
and only then finishes the ``Later`` — each waiting connection writes its ``OK``, or nsqd's
error for all of them (``503 EXITING``: the broker is stopping or its storage failed). An
``OK`` is still written only once its message is stored.

Deferring costs a request that comes alone (one publisher waiting for each ``OK``) more
than it saves: a second pass over it, and a loop turn when nothing else scheduled one. So
after a turn whose batches held one body in all, the group publishes at once — ``join``
returns ``None`` once the body is stored — except every ``PROBE_EVERY``-th request, which
opens a batch again; a batch is joined by whatever comes in its turn, and as soon as one
holds more than one body the group batches every request again.

A batch whose owner's inbound ring is full (``Backpressure``) is published again every
``RING_RETRY`` with the same body list (so a batch stored in part resumes after what went
in, never twice), its connections waiting; later joins go to a new batch. A batch stops
taking bodies at ``limit`` bytes (``--max-body-size``, the most one ``/mpub`` stores at
once); the next join for its topic opens another.
"""

from __future__ import annotations

import asyncio
import logging

from pynsqd.httpkit import HTTPError
from pynsqd.shard.broker import RING_RETRY, Backpressure, Broker, BrokerError
from pynsqd.shard.httppub import Later

log = logging.getLogger("pynsqd.shard")

PROBE_EVERY = 16  # while requests come alone, one in this many opens a batch to notice company


class _Batch(Later):
    __slots__ = ("bodies", "size", "topic")

    def __init__(self, topic: str) -> None:
        super().__init__()
        self.topic = topic
        self.bodies: list[bytes] = []
        self.size = 0


class PublishGroup:
    """The open batches of this loop turn, by topic."""

    def __init__(self, broker: Broker, limit: int) -> None:
        self.broker = broker
        self.limit = limit
        self.published = 0  # /pub messages stored through the group
        self.batches = 0  # in that many batches
        self._open: dict[str, _Batch] = {}
        self._sealed: list[_Batch] = []  # batches of this turn that reached ``limit``
        self._flush_handle: asyncio.Handle | None = None
        self.alone = False  # the last turn's batches held one body in all: publish at once
        self._unprobed = 0  # requests published at once since the last batch

    def join(self, topic: str, body: bytes) -> Later | None:
        """Add ``body`` to this turn's batch for ``topic``; the ``Later`` finishes once the
        batch is stored (``None``) or refused (the ``HTTPError``). While requests come
        alone, store it now instead (``None``; ``HTTPError``, or ``Backpressure`` to retry)."""
        if self.alone and self._flush_handle is None:
            self._unprobed += 1
            if self._unprobed < PROBE_EVERY:
                self._publish_now(topic, body)
                return None
            self._unprobed = 0
        batch = self._open.get(topic)
        if batch is None or (batch.bodies and batch.size + len(body) > self.limit):
            if batch is not None:
                self._sealed.append(batch)
            batch = self._open[topic] = _Batch(topic)
            if self._flush_handle is None:
                self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)
        batch.bodies.append(body)
        batch.size += len(body)
        return batch

    def _publish_now(self, topic: str, body: bytes) -> None:
        try:
            self.broker.publish(topic, [body])
        except BrokerError as exc:
            log.error("HTTP publish to %s failed - %s", topic, exc)
            raise HTTPError(503, "EXITING") from None
        self.published += 1
        self.batches += 1

    def _flush(self) -> None:
        self._flush_handle = None
        batches = [*self._sealed, *self._open.values()]
        self._sealed.clear()
        self._open.clear()
        self.alone = len(batches) == 1 and len(batches[0].bodies) == 1
        for batch in batches:
            self._publish(batch)

    def _publish(self, batch: _Batch) -> None:
        try:
            self.broker.publish(batch.topic, batch.bodies)
        except Backpressure:
            asyncio.get_running_loop().call_later(RING_RETRY, self._publish, batch)
            return
        except BrokerError as exc:
            log.error("HTTP publish to %s failed - %s", batch.topic, exc)
            batch.finish(HTTPError(503, "EXITING"))
            return
        except Exception:  # a bug: answered as nsqd answers a failure inside, never left waiting
            log.exception("HTTP publish to %s failed", batch.topic)
            batch.finish(HTTPError(500, "INTERNAL_ERROR"))
            return
        self.published += len(batch.bodies)
        self.batches += 1
        batch.finish(None)

"""A channel: its ready queue, its consumers, and what they hold in flight or deferred.

Theory of operation
-------------------
Delivery is driven by the channel, not by a loop per consumer: whenever something changes
that may allow delivery (messages arrive, a consumer sends RDY or FIN, a deferred message
comes due, the channel is unpaused), the channel asks its owner to ``schedule`` a pump. The
owner runs each scheduled pump once per event-loop turn, however many publishes arrived, so
a burst of PUBs costs one pump. A pump walks the consumers round-robin, starting one further
each time, and hands each ready consumer up to its free capacity (RDY minus in flight) in
chunks of ``CHUNK``, so several consumers of one channel share the messages as nsqd's
competing message pumps do.

RDY is a level, as in nsqd: a consumer may hold ``RDY`` messages in flight at once; FIN,
REQ and timeouts free room, they do not need a new RDY.

Consumers are duck-typed (``pynsqd.shard.protocol.ClientV2``); the channel uses their
``capacity()``, ``deliver(records, now)``, ``in_flight`` table and counters, and
``close_for_channel_delete()``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from pynsqd.shard.inflight import DeferredQueue, InFlight
from pynsqd.shard.latency import LatencyWindow
from pynsqd.shard.queue import Backend, MessageQueue
from pynsqd.wire.message import ATTEMPTS, ATTEMPTS_OFFSET, ID_OFFSET, with_attempts
from pynsqd.wire.names import is_ephemeral

log = logging.getLogger("pynsqd.shard")

CHUNK = 256  # messages handed to one consumer per turn of a pump

_unpack_attempts = ATTEMPTS.unpack_from


class ChannelError(Exception):
    """A FIN/REQ/TOUCH/SUB that the channel refuses; the text is nsqd's."""


class Channel:
    """One channel of one topic."""

    def __init__(self, topic_name: str, name: str, backend: Backend, mem_queue_size: int,
                 schedule: Callable[[Channel], None], max_consumers: int = 0) -> None:
        self.topic_name = topic_name
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.queue = MessageQueue(mem_queue_size, backend)
        self.deferred = DeferredQueue()
        self.in_flight: dict[bytes, InFlight] = {}
        self.consumers: list[Any] = []
        self.paused = False
        self.deleted = False
        self.max_consumers = max_consumers
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.e2e: LatencyWindow | None = None  # set when e2e percentiles are configured
        self._schedule = schedule
        self._turn = 0

    def __repr__(self) -> str:
        return f"<Channel {self.topic_name}:{self.name}>"

    # --- messages in ----------------------------------------------------------------------
    def put_many(self, records: list[bytes]) -> None:
        """Queue published messages (raises the backend's error when it cannot store them)."""
        self.queue.put_many(records)
        self.message_count += len(records)
        if self.consumers:
            self._schedule(self)

    def put_deferred(self, record: bytes, due: int) -> None:
        self.deferred.push(due, record)
        self.message_count += 1

    # --- consumers ------------------------------------------------------------------------
    def add_consumer(self, client: Any) -> None:
        if self.max_consumers and len(self.consumers) >= self.max_consumers:
            raise ChannelError(f"consumers for {self.topic_name}:{self.name} exceeds limit of "
                               f"{self.max_consumers}")
        self.consumers.append(client)
        self._schedule(self)

    def remove_consumer(self, client: Any, now: int) -> None:
        """Forget ``client``; what it held in flight is queued again at once."""
        try:
            self.consumers.remove(client)
        except ValueError:
            return
        returned = client.in_flight.drain()
        if returned:
            records = []
            for msg_id, entry in returned:
                self.in_flight.pop(msg_id, None)
                records.append(with_attempts(entry.record, entry.attempts))
            self.timeout_count += len(returned)
            self._requeue_records(records)

    def notify_ready(self) -> None:
        """A consumer may take more (RDY, FIN, REQ, drained output)."""
        if self.queue.memory or self.queue.backend_depth:
            self._schedule(self)

    # --- delivery -------------------------------------------------------------------------
    def pump(self, now: int) -> None:
        """Deliver ready messages to consumers with room. Called by the owner's scheduler."""
        consumers = self.consumers
        queue = self.queue
        if self.paused or not consumers or not len(queue):
            return
        count = len(consumers)
        start = self._turn % count
        self._turn += 1
        delivered = True
        while delivered and len(queue):
            delivered = False
            for i in range(count):
                client = consumers[(start + i) % count]
                room = client.capacity()
                if room <= 0:
                    continue
                records = queue.take(min(room, CHUNK))
                if not records:
                    return
                self._deliver(client, records, now)
                delivered = True

    def _deliver(self, client: Any, records: list[bytes], now: int) -> None:
        sample = client.sample_rate
        if sample:
            keep = [r for r in records if random.randrange(100) <= sample]
            dropped = len(records) - len(keep)
            records = keep
            if dropped:
                log.debug("%r: sampled out %d messages for %s", self, dropped, client)
        deadline = now + client.msg_timeout
        in_flight = self.in_flight
        table = client.in_flight
        out: list[tuple[bytes, int]] = []
        for record in records:
            msg_id = record[ID_OFFSET:ID_OFFSET + 16]
            attempts = _unpack_attempts(record, ATTEMPTS_OFFSET)[0] + 1
            entry = InFlight(record, client, attempts, now, deadline)
            in_flight[msg_id] = entry
            table.add(msg_id, entry)
            out.append((record, attempts))
        client.deliver(out)

    # --- FIN / REQ / TOUCH ----------------------------------------------------------------
    def _pop_in_flight(self, client: Any, msg_id: bytes) -> InFlight:
        entry = self.in_flight.get(msg_id)
        if entry is None:
            raise ChannelError("ID not in flight")
        if entry.client is not client:
            raise ChannelError("client does not own message")
        del self.in_flight[msg_id]
        client.in_flight.remove(msg_id)
        return entry

    def finish(self, client: Any, msg_id: bytes) -> None:
        entry = self._pop_in_flight(client, msg_id)
        if self.e2e is not None:
            self.e2e.add_record(entry.record)
        client.finish_count += 1
        self.notify_ready()

    def requeue(self, client: Any, msg_id: bytes, delay: int, now: int) -> None:
        """REQ: back to the queue now (``delay`` 0) or after ``delay`` ns."""
        entry = self._pop_in_flight(client, msg_id)
        client.requeue_count += 1
        self.requeue_count += 1
        record = with_attempts(entry.record, entry.attempts)
        if delay > 0:
            self.deferred.push(now + delay, record)
        else:
            self._requeue_records([record])
        self.notify_ready()

    def touch(self, client: Any, msg_id: bytes, now: int, max_msg_timeout: int) -> None:
        entry = self.in_flight.get(msg_id)
        if entry is None:
            raise ChannelError("ID not in flight")
        if entry.client is not client:
            raise ChannelError("client does not own message")
        deadline = min(now + client.msg_timeout, entry.delivered + max_msg_timeout)
        client.in_flight.touch(msg_id, deadline)

    def _requeue_records(self, records: list[bytes]) -> None:
        try:
            self.queue.put_many(records)
        except Exception:  # the backend failed: keep them in memory rather than lose them
            log.exception("%r: backend write failed while requeueing; keeping in memory", self)
            self.queue.memory.extend(records)
        if self.consumers:
            self._schedule(self)

    # --- timers ---------------------------------------------------------------------------
    def process_timers(self, now: int) -> bool:
        """Time out expired in-flight messages and release due deferred ones.

        Returns True when anything changed (nsqd's "dirty" channel)."""
        returned: list[bytes] = []
        for client in self.consumers:
            for msg_id, entry in client.in_flight.expired(now):
                self.in_flight.pop(msg_id, None)
                returned.append(with_attempts(entry.record, entry.attempts))
        self.timeout_count += len(returned)
        returned.extend(self.deferred.pop_due(now))
        if returned:
            self._requeue_records(returned)
            for client in self.consumers:
                client.on_channel_timers()
            return True
        return False

    @property
    def has_timers(self) -> bool:
        return bool(self.in_flight) or bool(len(self.deferred))

    # --- admin ----------------------------------------------------------------------------
    def empty(self) -> None:
        """Drop every message: queued, in flight and deferred (``/channel/empty``)."""
        self.queue.empty()
        self.in_flight.clear()
        self.deferred.drain()
        for client in self.consumers:
            client.in_flight.drain()
            client.on_channel_timers()

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self._schedule(self)

    def close(self, delete: bool = False) -> None:
        """Shut down: on ``delete`` drop everything; otherwise move in-flight and deferred
        messages back to the queue (attempts kept) and flush memory to the backend."""
        self.deleted = delete
        if delete:
            for client in list(self.consumers):
                client.close_for_channel_delete()
            self.queue.empty()
            self.queue.backend.delete()
            return
        held = [with_attempts(e.record, e.attempts) for e in self.in_flight.values()]
        held.extend(record for _, record in self.deferred.drain())
        self.in_flight.clear()
        for client in self.consumers:
            client.in_flight.drain()
        if held:
            self.queue.memory.extend(held)
        self.queue.flush()
        self.queue.backend.close()

    # --- stats ----------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self.queue)

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

Every message of the channel has a record in its shared-memory log (``MessageQueue`` /
``pynsqd.shm.log``) from the moment it is queued until it is FINed: delivery marks it in
flight and writes the attempts in place, REQ and timeouts mark it ready again in place,
REQ with a delay marks it deferred with its wall-clock due time, FIN marks it done. The
in-memory tables below (``in_flight``, ``deferred``) hold each record's position; a
restarted process rebuilds them from the log (``recover``).

Consumers are duck-typed (``pynsqd.shard.protocol.ClientV2``); the channel uses their
``capacity()``, ``deliver(records, now)``, ``in_flight`` table and counters, and
``close_for_channel_delete()``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from pynsqd.shard.inflight import DeferredQueue, InFlight
from pynsqd.shard.latency import LatencyWindow
from pynsqd.shard.queue import MessageQueue
from pynsqd.shm.log import DEFERRED, IN_FLIGHT
from pynsqd.wire.message import ATTEMPTS, ATTEMPTS_OFFSET, ID_OFFSET, with_attempts
from pynsqd.wire.names import is_ephemeral

log = logging.getLogger("pynsqd.shard")

CHUNK = 256  # messages handed to one consumer per turn of a pump

_unpack_attempts = ATTEMPTS.unpack_from


class ChannelError(Exception):
    """A FIN/REQ/TOUCH/SUB that the channel refuses; the text is nsqd's."""


class Channel:
    """One channel of one topic."""

    def __init__(self, topic_name: str, name: str, queue: MessageQueue,
                 schedule: Callable[[Channel], None], max_consumers: int = 0) -> None:
        self.topic_name = topic_name
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.queue = queue
        queue.on_move = self._moved
        self.deferred = DeferredQueue()
        self.deferred_at: dict[bytes, int] = {}  # message id → log position (-1: memory only)
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

    def recover(self) -> int:
        """Adopt the log a previous process left (ready and in-flight messages are ready,
        deferred ones wait for their due time). Returns the number of live messages."""
        now_mono, now_wall = time.monotonic_ns(), time.time_ns()
        for pos, due_wall, record in self.queue.recover():
            self.deferred.push(now_mono + max(0, due_wall - now_wall), record)
            self.deferred_at[record[ID_OFFSET:ID_OFFSET + 16]] = pos
        return self.queue.ready + len(self.deferred_at) + self.queue.backend_depth

    def _moved(self, old: int, new: int, state: int, record: bytes) -> None:
        """The log moved a live record (to free its front)."""
        msg_id = record[ID_OFFSET:ID_OFFSET + 16]
        if state == IN_FLIGHT:
            entry = self.in_flight.get(msg_id)
            if entry is not None and entry.pos == old:
                entry.pos = new
                return
        elif state == DEFERRED and self.deferred_at.get(msg_id) == old:
            self.deferred_at[msg_id] = new
            return
        self.queue.finish(new)  # nothing refers to it (a duplicate): drop the copy

    # --- messages in ----------------------------------------------------------------------
    def put_many(self, records: list[bytes]) -> None:
        """Queue published messages (raises the backend's error when it cannot store them)."""
        self.queue.put_many(records)
        self.message_count += len(records)
        if self.consumers:
            self._schedule(self)

    def put_deferred(self, record: bytes, due: int) -> None:
        """Hold ``record`` until ``due`` (monotonic ns); its record in the log keeps the
        wall-clock due time."""
        self._defer(record, due, None)
        self.message_count += 1

    def _defer(self, record: bytes, due: int, pos: int | None) -> None:
        wall = due - time.monotonic_ns() + time.time_ns()
        if pos is None:
            pos = self.queue.append(record, DEFERRED, wall)
            if pos is None:  # no room in shared memory: journaled on disk, held in memory
                log.warning("%r: shared memory full; a deferred message is held in memory", self)
                pos = -1
        else:
            self.queue.log.set_deferred(pos, wall)
        self.deferred.push(due, record)
        self.deferred_at[record[ID_OFFSET:ID_OFFSET + 16]] = pos

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
            for msg_id, entry in returned:
                self.in_flight.pop(msg_id, None)
                self.queue.requeue(entry.pos)
            self.timeout_count += len(returned)
            if self.consumers:
                self._schedule(self)

    def notify_ready(self) -> None:
        """A consumer may take more (RDY, FIN, REQ, drained output)."""
        if self.queue.ready or self.queue.backend_depth:
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
                positions, records = queue.take(min(room, CHUNK))
                if not records:
                    return
                self._deliver(client, positions, records, now)
                delivered = True

    def _deliver(self, client: Any, positions: list[int], records: list[bytes], now: int) -> None:
        sample = client.sample_rate
        if sample:
            keep = [random.randrange(100) <= sample for _ in records]
            for pos, kept in zip(positions, keep):
                if not kept:
                    self.queue.finish(pos)  # sampled out: consumed, as nsqd does
            records = [r for r, kept in zip(records, keep) if kept]
            positions = [p for p, kept in zip(positions, keep) if kept]
            if len(keep) != len(records):
                log.debug("%r: sampled out %d messages for %s", self, len(keep) - len(records), client)
        deadline = now + client.msg_timeout
        in_flight = self.in_flight
        table = client.in_flight
        mark = self.queue.log.deliver
        out: list[tuple[bytes, int]] = []
        for pos, record in zip(positions, records):
            msg_id = record[ID_OFFSET:ID_OFFSET + 16]
            attempts = _unpack_attempts(record, ATTEMPTS_OFFSET)[0] + 1
            mark(pos, attempts)
            entry = InFlight(record, client, attempts, now, deadline, pos)
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
        self.queue.finish(entry.pos)
        if self.e2e is not None:
            self.e2e.add_record(entry.record)
        client.finish_count += 1
        self.notify_ready()

    def requeue(self, client: Any, msg_id: bytes, delay: int, now: int) -> None:
        """REQ: back to the queue now (``delay`` 0) or after ``delay`` ns."""
        entry = self._pop_in_flight(client, msg_id)
        client.requeue_count += 1
        self.requeue_count += 1
        if delay > 0:
            self._defer(with_attempts(entry.record, entry.attempts), now + delay, entry.pos)
        else:
            self.queue.requeue(entry.pos)
        self.notify_ready()

    def touch(self, client: Any, msg_id: bytes, now: int, max_msg_timeout: int) -> None:
        entry = self.in_flight.get(msg_id)
        if entry is None:
            raise ChannelError("ID not in flight")
        if entry.client is not client:
            raise ChannelError("client does not own message")
        deadline = min(now + client.msg_timeout, entry.delivered + max_msg_timeout)
        client.in_flight.touch(msg_id, deadline)

    def _undefer(self, records: list[bytes]) -> None:
        """Due deferred messages become ready (in place when they have a log record)."""
        memory_only = []
        for record in records:
            pos = self.deferred_at.pop(record[ID_OFFSET:ID_OFFSET + 16], -1)
            if pos >= 0:
                self.queue.requeue(pos)
            else:
                memory_only.append(record)
        if memory_only:
            try:
                self.queue.put_many(memory_only)
            except Exception:  # the backend failed: defer them a little rather than lose them
                log.exception("%r: backend write failed while requeueing; retrying in 1s", self)
                retry = time.monotonic_ns() + 1_000_000_000
                for record in memory_only:  # still in the queue's journal
                    self.deferred.push(retry, record)
                    self.deferred_at[record[ID_OFFSET:ID_OFFSET + 16]] = -1
                return
            self.queue.unjournal(len(memory_only))

    # --- timers ---------------------------------------------------------------------------
    def process_timers(self, now: int) -> bool:
        """Time out expired in-flight messages and release due deferred ones.

        Returns True when anything changed (nsqd's "dirty" channel)."""
        expired = 0
        requeue = self.queue.requeue
        for client in self.consumers:
            for msg_id, entry in client.in_flight.expired(now):
                self.in_flight.pop(msg_id, None)
                requeue(entry.pos)
                expired += 1
        self.timeout_count += expired
        due = self.deferred.pop_due(now)
        if due:
            self._undefer(due)
        if expired or due:
            if self.consumers:
                self._schedule(self)
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
        self.deferred_at.clear()
        for client in self.consumers:
            client.in_flight.drain()
            client.on_channel_timers()

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self._schedule(self)

    def close(self, delete: bool = False) -> None:
        """Shut down: on ``delete`` drop everything; otherwise the queue keeps every message
        (in flight ones with their attempts, deferred ones with their due times): on disk
        for a durable channel, in shared memory otherwise (``MessageQueue.close``)."""
        self.deleted = delete
        if delete:
            for client in list(self.consumers):
                client.close_for_channel_delete()
            self.queue.close(delete=True)
            return
        # In-flight and deferred records are in the log as they are; only deferred messages
        # that found no room in shared memory are handed to the queue separately.
        offset = time.time_ns() - time.monotonic_ns()
        memory_only = [(due + offset, record) for due, record in self.deferred.drain()
                       if self.deferred_at.get(record[ID_OFFSET:ID_OFFSET + 16], -1) < 0]
        self.deferred_at.clear()
        self.in_flight.clear()
        for client in self.consumers:
            client.in_flight.drain()
        self.queue.close(deferred=memory_only)

    # --- stats ----------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self.queue)

"""A channel: its ready queue, its consumers, and what they hold in flight or deferred.

Theory of operation
-------------------
Delivery is driven by the channel, not by a loop per consumer: whenever something changes
that may allow delivery (messages arrive, a consumer sends RDY or FIN, a deferred message
comes due, the channel is unpaused), the channel asks its owner to ``schedule`` a pump. The
owner runs each scheduled pump once per event-loop turn, however many publishes arrived, so
a burst of PUBs costs one pump. A pump walks the consumers round-robin, starting one further
each time, and hands each ready consumer up to its free capacity (RDY minus in flight) in
chunks of ``CHUNK`` (fewer when messages are large: about ``CHUNK_BYTES`` a chunk, judged
by the last one, so 1 MiB messages go one at a time and the connection's flow control stops
them), so several consumers of one channel share the messages as nsqd's
competing message pumps do. One pump hands out at most ``PUMP_BUDGET`` messages (16 chunks'
bytes) and then
schedules itself for the next turn: a consumer that reads as fast as it is sent to with a
large RDY (a Spark source holds 300k in flight) would otherwise keep the loop in one pump for
over a second, and FINs, other clients, ``/stats`` and the heartbeat wait behind it.

RDY is a level, as in nsqd: a consumer may hold ``RDY`` messages in flight at once; FIN,
REQ and timeouts free room, they do not need a new RDY.

Every message of the channel has a record in its shared-memory log (``MessageQueue`` /
``pynsqd.shm.log``) from the moment it is queued until it is FINed: delivery marks it in
flight and writes the attempts in place, REQ and timeouts mark it ready again in place,
REQ with a delay marks it deferred with its wall-clock due time, FIN marks it done. The
in-memory tables below (``in_flight``, ``deferred``) hold each record's position; a
restarted process rebuilds them from the log in steps while it serves (``recover_step``).

The hot path works per batch, never per message object: a delivery of up to ``CHUNK``
messages walks the log once (``MessageQueue.deliver``: mark in flight, count attempts, and
append the NSQ frames straight to the consumer's output buffer), then adds one dict entry
per id (filled in C) and one ``Delivery`` to the timeout wheel (``pynsqd.shard.inflight``);
a run of FINs read in one go is one ``finish_many`` call (two dict pops and one state byte
per id, one pump scheduled).

Its consumers are ``Subscriber``s (``subscriber.py``: what the channel needs from one;
``pynsqd.shard.protocol.ClientV2`` is the one that serves a connection).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence

from pynsqd.shard.inflight import NO_IDS, DeferredQueue, Delivery, TimeoutWheel
from pynsqd.shard.latency import LatencyWindow
from pynsqd.shard.queue import MessageQueue
from pynsqd.shard.subscriber import Subscriber
from pynsqd.shard.unit import Unit
from pynsqd.shm.log import DEFERRED, IN_FLIGHT
from pynsqd.wire.message import ATTEMPTS, ATTEMPTS_OFFSET, ID_OFFSET
from pynsqd.wire.names import is_ephemeral

log = logging.getLogger("pynsqd.shard")

CHUNK = 256  # messages handed to one consumer per turn of a pump
PUMP_BUDGET = 16 * CHUNK  # messages one pump hands out before it yields the loop
CHUNK_BYTES = 1 << 20  # ... and bytes: a chunk is cut to about this many, a pump to 16 of them

_unpack_attempts = ATTEMPTS.unpack_from


class ChannelError(Exception):
    """A FIN/REQ/TOUCH/SUB that the channel refuses; the text is nsqd's."""


class Channel:
    """One channel of one topic."""

    def __init__(self, topic_name: str, name: str, queue: MessageQueue,
                 schedule: Callable[[Channel], None], max_consumers: int = 0,
                 on_timers: Callable[[Channel], None] | None = None) -> None:
        self.topic_name = topic_name
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.queue = queue
        queue.on_move = self._moved
        self.deferred = DeferredQueue()
        self.deferred_at: dict[bytes, int] = {}  # message id → log position (-1: memory only)
        self.in_flight: dict[bytes, Delivery] = {}  # message id → its delivery
        self.in_flight_pos: dict[bytes, int] = {}  # message id → log position
        self.timeouts = TimeoutWheel()
        self.consumers: list[Subscriber] = []
        self.paused = False
        self.deleted = False
        self.max_consumers = max_consumers
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.e2e: LatencyWindow | None = None  # set when e2e percentiles are configured
        self._schedule = schedule
        self._turn = 0
        self._chunk = CHUNK  # messages of the next chunk: fewer when the last one's were large
        # told when the channel gets timers (something in flight or deferred): the owner's
        # scan then calls ``process_timers`` until ``has_timers`` is false
        self.on_timers = on_timers
        self.timed = False  # the owner's scan watches it (set and cleared by the owner)

    def __repr__(self) -> str:
        return f"<Channel {self.topic_name}:{self.name}>"

    def start_recovery(self) -> None:
        """Adopt the log a previous process left (``MessageQueue.start_recovery``); then
        ``recover_step`` until ``queue.scanning`` is false (``shard/recovery.py``)."""
        self._recovered_deferred(self.queue.start_recovery())

    def recover_step(self, max_count: int) -> int:
        """Recover up to ``max_count`` more records of the log: in-flight and ready ones are
        delivered again, deferred ones wait for their due time. Returns the records walked."""
        queue = self.queue
        scan = queue.scan
        walked = scan.walked if scan is not None else 0
        self._recovered_deferred(queue.recover_step(max_count))
        if queue.ready and self.consumers:
            self._schedule(self)
        return (scan.walked - walked) if scan is not None else 0

    def _recovered_deferred(self, found: list[tuple[int, int, bytes]]) -> None:
        now_mono, now_wall = time.monotonic_ns(), time.time_ns()
        for pos, due_wall, record in found:
            self.deferred.push(now_mono + max(0, due_wall - now_wall), record)
            self.deferred_at[record[ID_OFFSET:ID_OFFSET + 16]] = pos
        if found:
            self._timers_added()

    def _moved(self, old: int, new: int, state: int, record: bytes) -> None:
        """The log moved a live record (to free its front)."""
        msg_id = record[ID_OFFSET:ID_OFFSET + 16]
        if state == IN_FLIGHT:
            if self.in_flight_pos.get(msg_id) == old:
                self.in_flight_pos[msg_id] = new
                return
        elif state == DEFERRED and self.deferred_at.get(msg_id) == old:
            self.deferred_at[msg_id] = new
            return
        self.queue.finish(new)  # nothing refers to it (a duplicate): drop the copy

    # --- messages in ----------------------------------------------------------------------
    def put_many(self, records: Sequence[bytes], unit: Unit | None = None) -> None:
        """Queue published messages (raises the backend's error when it cannot store them);
        ``unit``: they are a cross-shard batch's (``MessageQueue.put_many``)."""
        self.queue.put_many(records, unit)
        self.message_count += len(records)
        if self.consumers:
            self._schedule(self)

    def put_deferred(self, record: bytes, due: int, unit: Unit | None = None) -> None:
        """Hold ``record`` until ``due`` (monotonic ns); its record in the log keeps the
        wall-clock due time. ``unit``: it is a cross-shard batch's, skipped when this
        channel holds it already (``shard/unit.py``)."""
        if unit is not None and self.queue.tally.skip(unit, 1):
            return
        self._defer(record, due, None, unit)
        self.message_count += 1

    def _defer(self, record: bytes, due: int, pos: int | None, unit: Unit | None = None) -> None:
        wall = due - time.monotonic_ns() + time.time_ns()
        if pos is None:
            pos = self.queue.append(record, DEFERRED, wall, unit)
            if pos is None:  # no room in shared memory: journaled on disk, held in memory
                log.warning("%r: shared memory full; a deferred message is held in memory", self)
                pos = -1
        else:
            self.queue.defer(pos, wall)
        self.deferred.push(due, record)
        self.deferred_at[record[ID_OFFSET:ID_OFFSET + 16]] = pos
        if not self.timed:
            self._timers_added()

    def _timers_added(self) -> None:
        if not self.timed and self.on_timers is not None:
            self.on_timers(self)

    # --- consumers ------------------------------------------------------------------------
    def add_consumer(self, client: Subscriber) -> None:
        if self.max_consumers and len(self.consumers) >= self.max_consumers:
            raise ChannelError(f"consumers for {self.topic_name}:{self.name} exceeds limit of "
                               f"{self.max_consumers}")
        self.consumers.append(client)
        self._schedule(self)

    def remove_consumer(self, client: Subscriber, now: int) -> None:
        """Forget ``client``; what it held in flight is queued again at once."""
        try:
            self.consumers.remove(client)
        except ValueError:
            return
        client.in_flight_count = 0
        in_flight = self.in_flight
        returned = [msg_id for msg_id, delivery in in_flight.items() if delivery.client is client]
        if returned:
            for msg_id in returned:
                in_flight.pop(msg_id).settle()
                self.queue.requeue(self.in_flight_pos.pop(msg_id))
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
        budget = PUMP_BUDGET
        byte_budget = 16 * CHUNK_BYTES
        while len(queue):
            if budget <= 0 or byte_budget <= 0:  # more to hand out: the rest next turn, after other work
                self._schedule(self)
                return
            moved = 0
            for i in range(count):
                client = consumers[(start + i) % count]
                room = client.capacity()
                if room <= 0:
                    continue
                out = client.output()
                before = len(out)
                n = self._deliver(client, min(room, self._chunk), now)
                if not n:
                    return
                size = len(out) - before
                if size > 0:  # (a sampled delivery writes elsewhere)
                    self._chunk = max(1, min(CHUNK, CHUNK_BYTES * n // size))
                    byte_budget -= size
                moved += n
            if not moved:
                return
            budget -= moved

    def _deliver(self, client: Subscriber, count: int, now: int) -> int:
        """Hand ``client`` up to ``count`` ready messages; how many were taken (0: none was
        ready)."""
        if client.sample_rate:
            return self._deliver_sampled(client, count, now)
        ids: list[bytes] = []
        positions = self.queue.deliver(count, client.output(), ids)
        if not positions:
            return 0
        self._hold(client, ids, positions, now)
        client.delivered(len(positions))
        return len(positions)

    def _hold(self, client: Subscriber, ids: list[bytes], positions: list[int], now: int) -> None:
        """``ids`` (at ``positions``) are in flight at ``client`` from ``now``."""
        delivery = Delivery(ids, client, now, now + client.msg_timeout)
        self.timeouts.add(delivery)
        if not self.timed:
            self._timers_added()
        in_flight = self.in_flight
        held = len(in_flight)
        in_flight.update(dict.fromkeys(ids, delivery))
        self.in_flight_pos.update(zip(ids, positions))
        client.in_flight_count += len(in_flight) - held  # a duplicate id counts once, as FIN will

    def _deliver_sampled(self, client: Subscriber, count: int, now: int) -> int:
        """``--sample-rate``: each message is delivered with that chance, else consumed;
        returns how many were taken (delivered or sampled out)."""
        positions, records = self.queue.take(count)
        if not records:
            return 0
        sample = client.sample_rate
        mark = self.queue.mark_in_flight
        ids: list[bytes] = []
        kept: list[int] = []
        out: list[tuple[bytes, int]] = []
        for pos, record in zip(positions, records):
            if random.randrange(100) > sample:
                self.queue.finish(pos)  # sampled out: consumed, as nsqd does
                continue
            attempts = _unpack_attempts(record, ATTEMPTS_OFFSET)[0] + 1
            mark(pos, attempts)
            ids.append(record[ID_OFFSET:ID_OFFSET + 16])
            kept.append(pos)
            out.append((record, attempts))
        if len(kept) != len(records):
            log.debug("%r: sampled out %d messages for %s", self, len(records) - len(kept), client)
        if kept:
            self._hold(client, ids, kept, now)
            client.deliver(out)
        return len(records)

    # --- FIN / REQ / TOUCH ----------------------------------------------------------------
    def _get_in_flight(self, client: Subscriber, msg_id: bytes) -> Delivery:
        delivery = self.in_flight.get(msg_id)
        if delivery is None:
            raise ChannelError("ID not in flight")
        if delivery.client is not client:
            raise ChannelError("client does not own message")
        return delivery

    def _pop_in_flight(self, client: Subscriber, msg_id: bytes) -> int:
        """Take ``msg_id`` out of flight; its log position."""
        self._get_in_flight(client, msg_id).settle()
        del self.in_flight[msg_id]
        client.in_flight_count -= 1
        return self.in_flight_pos.pop(msg_id)

    def finish(self, client: Subscriber, msg_id: bytes) -> None:
        """FIN one message; raises ``ChannelError`` with nsqd's reason."""
        failed = self.finish_many(client, [msg_id])
        if failed:
            raise ChannelError(failed[0][1])

    def finish_many(self, client: Subscriber, ids: list[bytes]) -> list[tuple[bytes, str]]:
        """FIN each of ``ids`` in order; returns [(id, nsqd's reason)] of those that failed."""
        in_flight = self.in_flight
        pop_pos = self.in_flight_pos.pop
        e2e = self.e2e
        failed: list[tuple[bytes, str]] = []
        done: list[int] = []
        for msg_id in ids:
            delivery = in_flight.get(msg_id)
            if delivery is None or delivery.client is not client:
                failed.append((msg_id, "ID not in flight" if delivery is None else "client does not own message"))
                continue
            del in_flight[msg_id]
            delivery.live -= 1  # delivery.settle(), inline
            if not delivery.live:
                delivery.ids = NO_IDS
            done.append(pop_pos(msg_id))
        if done:
            if e2e is not None:
                for pos in done:
                    e2e.add_timestamp(self.queue.timestamp_at(pos))
            self.queue.finish_many(done)
            client.in_flight_count -= len(done)
            client.finish_count += len(done)
            self.notify_ready()
        return failed

    def requeue(self, client: Subscriber, msg_id: bytes, delay: int, now: int) -> None:
        """REQ: back to the queue now (``delay`` 0) or after ``delay`` ns."""
        pos = self._pop_in_flight(client, msg_id)
        client.requeue_count += 1
        self.requeue_count += 1
        if delay > 0:
            # the log's copy carries this delivery's attempts (written in place)
            self._defer(self.queue.message_at(pos), now + delay, pos)
        else:
            self.queue.requeue(pos)
        self.notify_ready()

    def touch(self, client: Subscriber, msg_id: bytes, now: int, max_msg_timeout: int) -> None:
        old = self._get_in_flight(client, msg_id)
        old.settle()
        moved = Delivery([msg_id], client, old.delivered,
                         min(now + client.msg_timeout, old.delivered + max_msg_timeout))
        self.timeouts.add(moved)
        self.in_flight[msg_id] = moved
        if not self.timed:
            self._timers_added()

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
                self._timers_added()
                return
            self.queue.unjournal(memory_only)

    # --- timers ---------------------------------------------------------------------------
    def process_timers(self, now: int) -> bool:
        """Time out expired in-flight messages and release due deferred ones.

        Returns True when anything changed (nsqd's "dirty" channel)."""
        expired = 0
        requeue = self.queue.requeue
        in_flight = self.in_flight
        for msg_id in self.timeouts.pop_due(now):
            delivery = in_flight.get(msg_id)
            if delivery is not None and delivery.deadline <= now:
                del in_flight[msg_id]
                delivery.client.in_flight_count -= 1
                requeue(self.in_flight_pos.pop(msg_id))
                expired += 1
        self.timeout_count += expired
        due = self.deferred.pop_due(now)
        if due:
            self._undefer(due)
        if expired or due:
            if self.consumers:
                self._schedule(self)
            return True
        return False

    @property
    def has_timers(self) -> bool:
        return bool(self.in_flight) or bool(len(self.deferred)) or bool(self.timeouts)

    # --- admin ----------------------------------------------------------------------------
    def empty(self) -> None:
        """Drop every message: queued, in flight and deferred (``/channel/empty``). A FIN,
        REQ or TOUCH of a message that was in flight fails as nsqd's does ("ID not in
        flight")."""
        self.queue.empty()
        self._forget()

    def _forget(self) -> list[tuple[int, bytes]]:
        """Drop what is in flight and deferred from the tables (the log keeps or loses the
        records themselves): nothing refers to a log position any more, so no later FIN,
        REQ, TOUCH, timeout or consumer leaving touches the log. Returns the deferred
        messages held only in memory, as (due monotonic ns, record)."""
        deferred_at = self.deferred_at
        memory_only = [(due, record) for due, record in self.deferred.drain()
                       if deferred_at.get(record[ID_OFFSET:ID_OFFSET + 16], -1) < 0]
        deferred_at.clear()
        self.in_flight.clear()
        self.in_flight_pos.clear()
        self.timeouts.clear()
        for client in self.consumers:
            client.in_flight_count = 0
        return memory_only

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
        # In-flight and deferred records are in the log as they are; only deferred messages
        # that found no room in shared memory are handed to the queue separately.
        memory_only = self._forget()
        if delete:  # as nsqd: its consumers are disconnected, what they held is gone
            consumers, self.consumers = self.consumers, []
            for client in consumers:
                client.close_for_channel_delete()
            self.queue.close(delete=True)
            return
        offset = time.time_ns() - time.monotonic_ns()
        self.queue.close(deferred=[(due + offset, record) for due, record in memory_only])

    # --- a shard's replacement (``transfer.py``) --------------------------------------------
    def deliveries(self) -> list[tuple[Subscriber, int, int, list[bytes], list[int]]]:
        """What is in flight, one entry per delivery: (consumer, delivered, deadline, ids,
        log positions)."""
        groups: dict[int, tuple[Delivery, list[bytes], list[int]]] = {}
        positions = self.in_flight_pos
        for msg_id, delivery in self.in_flight.items():
            group = groups.get(id(delivery))
            if group is None:
                group = groups[id(delivery)] = (delivery, [], [])
            group[1].append(msg_id)
            group[2].append(positions[msg_id])
        return [(d.client, d.delivered, d.deadline, ids, pos) for d, ids, pos in groups.values()]

    def deferred_entries(self) -> list[tuple[bytes, int, int, bytes]]:
        """What waits for a due time: (id, log position or -1, due monotonic ns, message)."""
        at = self.deferred_at
        return [(record[ID_OFFSET:ID_OFFSET + 16], at.get(record[ID_OFFSET:ID_OFFSET + 16], -1), due, record)
                for due, record in self.deferred.items()]

    def adopt_deferred(self, entries: list[tuple[bytes, int, int, bytes | None]]) -> None:
        """``deferred_entries`` of the process this channel was handed over from (a message
        with a log position is read from the log)."""
        for msg_id, pos, due, record in entries:
            self.deferred.push(due, record if record is not None else self.queue.message_at(pos))
            self.deferred_at[msg_id] = pos
        if entries:
            self._timers_added()

    def hold_again(self, client: Subscriber, ids: list[bytes], positions: list[int], delivered: int,
                   deadline: int) -> int:
        """Hold messages in flight at ``client`` with the deadline the process this channel
        was handed over from gave them (``deliveries``; its queue was adopted as it was left,
        ``MessageQueue.adopt``); returns how many were found in flight there."""
        kept = [(msg_id, pos) for msg_id, pos in zip(ids, positions) if self.queue.holds(pos, msg_id)]
        if not kept:
            return 0
        delivery = Delivery([msg_id for msg_id, _ in kept], client, delivered, deadline)
        self.timeouts.add(delivery)
        self.in_flight.update(dict.fromkeys(delivery.ids, delivery))
        self.in_flight_pos.update(kept)
        client.in_flight_count += len(kept)
        if not self.timed:
            self._timers_added()
        return len(kept)

    # --- stats ----------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self.queue)

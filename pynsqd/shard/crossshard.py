"""Cross-shard publish: one shared-memory ring per (producer shard → owner shard) pair.

Theory of operation
-------------------
A PUB/MPUB/DPUB (TCP or HTTP) for a topic another shard owns is encoded by the receiving
shard exactly as a local publish would be (timestamp, ids from *its* id space — ids stay
unique per node because they carry the shard index), and the whole batch is written as ONE
record into the owner's inbound ``ByteRing`` for this producer (``shm/ring.py``; the rings
live in POSIX shared memory, ``shm/segment.py``, created by the supervisor: ``node/rings.py``). The client gets
``OK`` once ``put`` returned True: the batch is in shared memory, which outlives both
processes. A full ring raises ``Backpressure``: nothing stored, the connection stops reading
and retries (``protocol.py``), an HTTP request waits — never loss. A batch larger than one
ring record (``max_record_size``: only with a ring shrunk by RLIMIT_FSIZE, or an MPUB of
very many small messages) is split into pieces, written with one ``put_many`` (all that fit
are published at once); when not all fit, ``Backpressure.stored`` says how many messages
went in and the broker's retry (same ``bodies`` list) resumes after them — never twice.

Each ring has one producer process and one consumer process (SPSC, the ring's contract). The
owner is woken through its eventfd, written once per loop turn by each producer with pending
records. The owner drains with ``peek_many`` → apply → ``consume``, so a crash between apply
and consume replays the batch (at-least-once), and a restarted owner first drains whatever its
rings hold. A batch the owner cannot store (its disk queue fails) stays in the ring and is
retried every ``STORE_RETRY``, never dropped. Draining is bounded per turn (``DRAIN_BATCH``
records and ``DRAIN_BYTES`` per ring) and rescheduled, so a flood from one ring never blocks
the owner's loop; it also drains before answering a stats request, so ``OK`` → ``/stats``
always shows the message.

A DPUB's record carries its absolute due time (``CLOCK_MONOTONIC`` ns, one clock for every
process of the host, and the rings do not outlive the host's uptime), taken when the
producer wrote the record, i.e. just before the ``OK``: the delay counts from the publish,
not from when the owner drains the ring (the owner may be restarting).

The record (``node/crossrecord.py``) carries the topic, the due time, the body bytes, the
count and the messages already framed as READY records of the owner's ``MessageLog``: the
producer frames the batch once, the owner checks the run once and hands it to the topic as
its message list (a ``Frames`` is a sequence of messages); each log the topic puts it in (its channels', or its own
while it has no channel, is paused or has messages waiting) appends it with one copy when it
can take it whole without ``make_room`` (``MessageQueue.put_many``); anything else — a wrap,
a full log, a spill to disk, a deferred batch, a channel that refuses — reads the run as the
list of messages and takes the path a local publish takes. A corrupt record is logged and
dropped, never stored. Rings left by older releases (kinds ``"D"``, ``"P"``) are still
drained. ``framed`` counts the messages stored without being decoded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from collections.abc import Sequence

from pynsqd.node.crossrecord import decode_batch, encode_batch
from pynsqd.node.rings import ring_name, ring_size
from pynsqd.shard.broker import Backpressure, Broker, BrokerError
from pynsqd.shm.frames import Frames
from pynsqd.shm.ring import ByteRing
from pynsqd.shm.segment import Segment
from pynsqd.wire.message import HEADER

log = logging.getLogger("pynsqd.shard")

# A drain turn applies at most this many records, and stops adding records once they hold
# DRAIN_BYTES, per ring: the owner's loop stays responsive while a ring holds a backlog. 256
# MPUBs of 200 x 200 B were 51,200 messages in one turn, tens of ms in which the owner's own
# connections waited (HTTP /mpub p99 ~150 ms on 2 shards against 7 ms on 1; 10 ms with this).
DRAIN_BATCH = 256
DRAIN_BYTES = 1 << 18
STORE_RETRY = 1.0  # seconds before the owner retries a batch it could not store


def _pieces(owner: int, topic: str, records: list[bytes], due_ns: int, max_size: int) -> list[tuple[int, bytes]]:
    """``records`` as ring records of at most ``max_size`` bytes, [(messages, record)], halving
    until each piece fits. ``BrokerError`` when one message alone does not."""
    data = encode_batch(topic, records, sum(map(len, records)) - HEADER.size * len(records), due_ns)
    if len(data) <= max_size:
        return [(len(records), data)]
    if len(records) <= 1:
        raise BrokerError(f"message too large for the inbound ring of shard {owner}")
    half = len(records) // 2
    return (_pieces(owner, topic, records[:half], due_ns, max_size)
            + _pieces(owner, topic, records[half:], due_ns, max_size))


class Outbound:
    """This shard's rings into every other shard, and their wake-ups."""

    def __init__(self, data_dir: str, me: int, shards: int, wake_fds: list[int]) -> None:
        self.me = me
        self.wake_fds = wake_fds
        self.segments: dict[int, Segment] = {}
        self.rings: dict[int, ByteRing] = {}
        for dst in range(shards):
            if dst != me:
                seg = Segment.open(ring_name(data_dir, me, dst), ring_size(), create=False)
                self.segments[dst] = seg
                self.rings[dst] = ByteRing(seg.buf, init=False)
        self.sent = 0  # messages put into other shards' rings
        self._to_wake: set[int] = set()
        self._wake_handle: asyncio.Handle | None = None

    def put(self, owner: int, topic: str, records: list[bytes], body_bytes: int, delay_ns: int) -> None:
        """Store a batch in ``owner``'s ring (a deferred one due ``delay_ns`` from now).
        Raises ``Backpressure`` when it does not fit now (with ``stored``: how many of the
        first records went in, for a batch larger than one ring record), ``BrokerError``
        when one message could never fit (a ring shrunk by RLIMIT_FSIZE)."""
        due_ns = time.monotonic_ns() + delay_ns if delay_ns else 0
        ring = self.rings[owner]
        data = encode_batch(topic, records, body_bytes, due_ns)
        if len(data) > ring.max_record_size:
            self._put_pieces(owner, ring, topic, records, due_ns)
            return
        if not ring.put(data):
            self._wake(owner)
            raise Backpressure(f"inbound ring of shard {owner} is full")
        self.sent += len(records)
        self._wake(owner)

    def _put_pieces(self, owner: int, ring: ByteRing, topic: str, records: list[bytes], due_ns: int) -> None:
        """A batch larger than a ring record: as many pieces (whole records, in order) as
        fit, published at once; ``Backpressure.stored`` counts the messages stored."""
        pieces = _pieces(owner, topic, records, due_ns, ring.max_record_size)
        written = ring.put_many([data for _, data in pieces])
        stored = sum(count for count, _ in pieces[:written])
        self.sent += stored
        self._wake(owner)
        if written < len(pieces):
            raise Backpressure(f"inbound ring of shard {owner} is full", stored)

    def _wake(self, owner: int) -> None:
        self._to_wake.add(owner)
        if self._wake_handle is None:
            self._wake_handle = asyncio.get_running_loop().call_soon(self._flush_wakes)

    def _flush_wakes(self) -> None:
        self._wake_handle = None
        for owner in self._to_wake:
            try:
                os.eventfd_write(self.wake_fds[owner], 1)
            except OSError as exc:  # pragma: no cover - the fd is the supervisor's, always open
                log.error("cannot wake shard %d - %s", owner, exc)
        self._to_wake.clear()

    def close(self) -> None:
        for ring in self.rings.values():
            ring.close()
        self.rings.clear()
        for seg in self.segments.values():
            seg.close()


def _joins(item: tuple[str, Sequence[bytes], int, int] | None, topic: str) -> bool:
    """``item`` (a decoded record) may be stored in one list with a plain batch for ``topic``."""
    return item is not None and item[0] == topic and not item[3] and type(item[1]) is list


class Inbound:
    """The rings other shards publish into for this shard; applies them to the broker."""

    def __init__(self, data_dir: str, me: int, shards: int, wake_fd: int, broker: Broker) -> None:
        self.broker = broker
        self.wake_fd = wake_fd
        self.segments: list[Segment] = []
        self.rings: list[ByteRing] = []
        for src in range(shards):
            if src != me:
                seg = Segment.open(ring_name(data_dir, src, me), ring_size(), create=False)
                self.segments.append(seg)
                self.rings.append(ByteRing(seg.buf, init=False))
        self.received = 0  # messages taken from the rings
        self.framed = 0  # of those, stored with no message decoded: every log took the run as is
        self._failing: set[str] = set()  # topics whose batches cannot be stored now (logged once)
        self._again: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self.wake_fd, self._woken)
        self.drain()

    def _woken(self) -> None:
        try:
            os.eventfd_read(self.wake_fd)
        except BlockingIOError:
            pass
        self.drain()

    def drain(self, limit: int | None = DRAIN_BATCH) -> int:
        """Apply up to ``limit`` records per ring (all when None); reschedules if more wait."""
        if self._again is not None:
            self._again.cancel()
        self._again = None
        applied = 0
        more = stalled = False
        for ring in self.rings:
            while True:
                batch = ring.peek_many(limit or DRAIN_BATCH, DRAIN_BYTES)  # limit None: turns until empty
                if not batch:
                    break
                done = self._apply_all(batch)
                ring.consume(done)
                applied += done
                if done < len(batch):  # stays in the ring: retried, never dropped
                    stalled = True
                    break
                if limit is not None:
                    more = more or len(ring) > 0
                    break
        if self._loop is not None and (stalled or more):
            self._again = (self._loop.call_later(STORE_RETRY, self.drain) if stalled
                           else self._loop.call_soon(self.drain))
        return applied

    def _apply_all(self, batch: list[bytes]) -> int:
        """Store peeked records in order; how many were applied (the rest stay in the ring).

        Consecutive plain records for one topic (not deferred, not framed) are stored as one
        list: one ``Topic.put_many`` for the run rather than one per record. A cross-shard
        ``/pub`` or ``PUB`` is a record of one message, and the call cost more than the
        message did. The run is stored whole or not at all, as one record is."""
        items: list[tuple[str, Sequence[bytes], int, int] | None] = []
        for data in batch:
            try:
                items.append(decode_batch(data))
            except (ValueError, struct.error) as exc:
                log.error("inbound ring: dropping a corrupt record - %s", exc)
                items.append(None)
        done = 0
        while done < len(items):
            item = items[done]
            end = done + 1
            if item is None:
                done = end
                continue
            topic, records, body_bytes, due = item
            if not due and type(records) is list:
                while end < len(items) and _joins(items[end], topic):
                    if records is item[1]:
                        records = list(records)
                    records += items[end][1]  # type: ignore[index,operator]
                    body_bytes += items[end][2]  # type: ignore[index]
                    end += 1
            if not self._store(topic, records, body_bytes, due):
                break
            done = end
        return done

    def _store(self, topic_name: str, records: Sequence[bytes], body_bytes: int, due: int) -> bool:
        """Store one batch; False when the owner cannot store it now (the batch stays in the
        ring, acknowledged: it is retried after ``STORE_RETRY``, and kept across an exit)."""
        broker = self.broker
        topic = broker.get_topic(topic_name)
        if not records:
            return True
        try:
            if due:  # counted from the publish: what is left of the delay (0 if it passed)
                now = time.monotonic_ns()
                for record in records:
                    topic.put_deferred(record, max(0, due - now), now, body_bytes)
            else:
                topic.put_many(records, body_bytes)
        except Exception as exc:
            broker.health = f"NOK - {exc}"
            if topic_name not in self._failing:  # once per failing spell; retried every STORE_RETRY
                self._failing.add(topic_name)
                log.error("TOPIC(%s): failed to store %d cross-shard message(s), retrying every %gs - %s",
                          topic_name, len(records), STORE_RETRY, exc)
            return False
        if self._failing and topic_name in self._failing:
            self._failing.discard(topic_name)
            log.warning("TOPIC(%s): cross-shard messages stored again", topic_name)
        self.received += len(records)
        if isinstance(records, Frames) and not records.decoded:
            self.framed += len(records)
        return True

    def stop(self) -> None:
        """No more wake-ups or retries; a final ``drain(None)`` may still run."""
        if self._loop is not None:
            self._loop.remove_reader(self.wake_fd)
        self._loop = None
        if self._again is not None:
            self._again.cancel()
            self._again = None

    def close(self) -> None:
        for ring in self.rings:
            ring.close()
        self.rings.clear()
        for seg in self.segments:
            seg.close()

"""Cross-shard publish, the owner's side: the rings other shards publish into for this one,
stored in the order their publishes were acknowledged, each batch exactly once.

Theory of operation
-------------------
There is one inbound ring per other shard (``shard/crossshard.py`` writes them). The owner
is woken through its eventfd and drains at most ``DRAIN_BATCH`` records and ``DRAIN_BYTES``
per ring and turn (and again next turn while records are left), so a flood never keeps its
own connections waiting; it drains everything before answering stats (``OK`` → ``/stats``
shows the message) and at exit, and at start what a previous process left.

Order. A publish another shard received was acknowledged once its record was in this
shard's ring, and one the owner receives itself is stored at once. So before the owner
stores a publish of its own, ``catch_up`` (called by ``Broker.publish`` and
``publish_deferred``) stores what its rings hold: a publish acknowledged before this one was
received is there. With more than two shards the owner has several rings, and one drain
must not store a later record of one before an earlier record of another: each drain reads
the clock (its cutoff), takes from every ring the records sent before it (``sent``, the
time their producer took just before writing them) and stores them merged by that time. A
record acknowledged before another publish was received was written before that publish's
time was taken, so when a drain takes that one it is visible, and older. A ring cut short
by the per-turn bounds holds later records than the last one taken from it, so records of
the other rings sent after that one wait for the next turn. ``catch_up`` takes every record
sent before its cutoff, however many turns' worth; with its rings empty it costs two index
loads a ring.

Exactly once. A drain stores records in units — one record, or consecutive plain records
of one ring for one topic, stored with one ``Topic.put_many`` (a cross-shard ``/pub`` is a
record of one message, and a call per record cost more than its message) — and consumes
each unit from its ring once stored. Before storing a unit it notes the unit's last
``sent`` in the ring (``ByteRing.note``). A unit in a ring whose first record was sent at
or before the note was being stored, by this process or by one killed since, and maybe
stored in part: it is stored again first, as exactly that unit, and each queue skips the
messages of it that it holds (``shard/unit.py``).

Failures. A unit the owner cannot store (a disk queue or a journal refuses it) stays in the
ring, acknowledged and never dropped, and is retried every ``STORE_RETRY``; until it is
stored, its ring waits behind it and so does every ring whose next unit is for its topic,
so nothing of that topic is stored before it. ``catch_up`` passes over waiting rings: a
publish the owner receives for that topic meanwhile and can store is stored before the
unit (acknowledged first, delivered first).

A record whose ``sent`` lies more than ``FUTURE`` past the cutoff has a corrupt time (its
producer took the time before writing it) and is taken at once, in its ring's order, so it
cannot keep the ring waiting; a record that does not decode is logged and dropped.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from itertools import takewhile
from operator import itemgetter

from pynsqd.node.crossrecord import Batch, decode_batch, sent_of
from pynsqd.node.rings import ring_name, ring_size
from pynsqd.shard.broker import Broker
from pynsqd.shard.unit import Unit
from pynsqd.shm.frames import Frames
from pynsqd.shm.ring import ByteRing
from pynsqd.shm.segment import Segment

log = logging.getLogger("pynsqd.shard")

# A drain turn applies at most this many records, and stops adding records once they hold
# DRAIN_BYTES, per ring: the owner's loop stays responsive while a ring holds a backlog. 256
# MPUBs of 200 x 200 B were 51,200 messages in one turn, tens of ms in which the owner's own
# connections waited (HTTP /mpub p99 ~150 ms on 2 shards against 7 ms on 1; 10 ms with this).
DRAIN_BATCH = 256
DRAIN_BYTES = 1 << 18
STORE_RETRY = 1.0  # seconds before the owner retries a batch it could not store
FUTURE = 10**9  # ns: a record sent this long after a drain's cutoff is corrupt

Item = tuple[int, int, bytes]  # (sent, ring index, record)
_sent = itemgetter(0)


# a unit: (ring index, first sent, last sent, records, topic or None (a corrupt record,
# dropped), the message lists of its records, body bytes, due)
UnitItems = tuple[int, int, int, int, str | None, list[Sequence[bytes]], int, int]


def _units(items: Iterable[Item]) -> Iterator[UnitItems]:
    """``items`` (in the order to store them) grouped into units: consecutive plain records
    (ready messages as a list, not a framed run, not deferred) of one ring and topic join."""
    ring, first, last, count, body, due = -1, 0, 0, 0, 0, 0
    topic: str | None = None
    runs: list[Sequence[bytes]] = []
    joins = False  # the unit so far can take more records
    for sent, index, data in items:
        try:
            batch: Batch | None = decode_batch(data)
        except (ValueError, struct.error) as exc:
            log.error("inbound ring: dropping a corrupt record - %s", exc)
            batch = None
        if (joins and batch is not None and index == ring and batch.topic == topic and not batch.due
                and type(batch.messages) is list):
            runs.append(batch.messages)
            body += batch.body_bytes
            last = sent
            count += 1
            continue
        if ring >= 0:
            yield ring, first, last, count, topic, runs, body, due
        ring, first, last, count = index, sent, sent, 1
        if batch is None:
            topic, runs, body, due, joins = None, [], 0, 0, False
        else:
            topic, runs, body, due = batch.topic, [batch.messages], batch.body_bytes, batch.due
            joins = not due and type(batch.messages) is list
    if ring >= 0:
        yield ring, first, last, count, topic, runs, body, due


class Inbound:
    """The rings other shards publish into for this shard; applies them to the broker."""

    def __init__(self, data_dir: str, me: int, shards: int, wake_fd: int, broker: Broker) -> None:
        self.broker = broker
        self.wake_fd = wake_fd
        self.segments: list[Segment] = []
        self.rings: list[ByteRing] = []
        self.sources: list[int] = []  # the producer shard of each ring
        for src in range(shards):
            if src != me:
                seg = Segment.open(ring_name(data_dir, src, me), ring_size(), create=False)
                self.segments.append(seg)
                self.rings.append(ByteRing(seg.buf, init=False))
                self.sources.append(src)
        self.received = 0  # messages taken from the rings
        self.framed = 0  # of those, stored with no message decoded: every log took the run as is
        self._failing: set[str] = set()  # topics with a unit that could not be stored (logged once)
        self._blocked: set[int] = set()  # rings waiting for such a unit: retried every STORE_RETRY
        self._live = list(self.rings)  # the others: those ``catch_up`` looks at
        self._soon: asyncio.Handle | None = None
        self._retry: asyncio.TimerHandle | None = None
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

    def catch_up(self) -> None:
        """Store every record sent before now (see the module doc); the owner stores a publish
        of its own after them."""
        if not ByteRing.any_records(self._live):
            return
        cutoff = time.monotonic_ns()
        while True:
            applied, cut = self._round(cutoff, DRAIN_BATCH, retry=False)
            if not cut or not applied:
                return

    def drain(self, limit: int | None = DRAIN_BATCH) -> int:
        """Store records sent before now, at most ``limit`` per ring (this turn's share), or
        all of them turn after turn when None (then a waiting unit is tried again too).
        Schedules the next turn while records are left; returns how many were stored."""
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        applied = 0
        while True:
            done, _ = self._round(time.monotonic_ns(), limit or DRAIN_BATCH, retry=limit is None)
            applied += done
            if limit is not None or not done:
                break
        self._schedule()
        return applied

    def _retry_blocked(self) -> None:
        self._retry = None
        self._round(time.monotonic_ns(), DRAIN_BATCH, retry=True)
        self._schedule()

    def _schedule(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if self._soon is None and any(ring.has_records() for ring in self._live):
            self._soon = loop.call_soon(self.drain)
        if self._retry is None and self._blocked:
            self._retry = loop.call_later(STORE_RETRY, self._retry_blocked)

    # --- one pass --------------------------------------------------------------------------
    def _round(self, cutoff: int, limit: int, retry: bool) -> tuple[int, bool]:
        """Take from every ring (the waiting ones only if ``retry``) up to ``limit`` records
        sent before ``cutoff``, store them merged by sent time and consume what was stored.
        Returns (records consumed, whether a bound cut a ring short)."""
        if retry and self._blocked:
            self._blocked.clear()
            self._live = list(self.rings)
        streams: list[list[Item]] = []
        horizon = cutoff - 1
        cut = False
        consumed = 0
        for i, ring in enumerate(self.rings):
            if (i in self._blocked and not retry) or not ring.has_records():
                continue
            items, short = self._take(i, ring, cutoff, limit)
            if short:
                cut = True
                horizon = min(horizon, items[-1][0])
            note = ring.note
            if items and 0 < items[0][0] <= note:  # the unit being stored when a drain stopped
                count = next((n for n, item in enumerate(items) if item[0] > note), len(items))
                for unit in _units(items[:count]):
                    if not self._apply(unit, True):
                        self._block(i)
                        break
                    consumed += unit[3]
                items = [] if i in self._blocked else items[count:]
            if items:
                streams.append(items)
        if len(streams) == 1:
            merged: Sequence[Item] = streams[0]
        else:
            merged = list(takewhile(lambda item: item[0] <= horizon, heapq.merge(*streams, key=_sent)))
        blocked = self._blocked
        for unit in _units(merged):
            if unit[0] in blocked:
                continue  # behind a unit that could not be stored
            if unit[4] in self._failing or not self._apply(unit, False):
                self._block(unit[0])
                continue
            consumed += unit[3]
        return consumed, cut

    def _take(self, index: int, ring: ByteRing, cutoff: int, limit: int) -> tuple[list[Item], bool]:
        """The first records of ``ring`` sent before ``cutoff`` (at most ``limit``), and
        whether a bound cut them short (later ones may have been sent before ``cutoff``)."""
        items: list[Item] = []
        records = ring.peek_many(limit, DRAIN_BYTES)
        for data in records:
            sent = sent_of(data)
            if sent >= cutoff:
                if sent - cutoff < FUTURE:
                    return items, False
                sent = items[-1][0] if items else 0  # corrupt: taken now, and dropped if it does not decode
            items.append((sent, index, data))
        return items, bool(items) and not ring.peeked_all

    def _block(self, index: int) -> None:
        self._blocked.add(index)
        self._live = [ring for i, ring in enumerate(self.rings) if i not in self._blocked]

    def _apply(self, unit: UnitItems, replay: bool) -> bool:
        """Store ``unit`` and consume it; False when it cannot be stored now (it stays).
        ``replay``: it was being stored when a drain stopped (the note is set already)."""
        index, first, last, count, topic, runs, body, due = unit
        ring = self.rings[index]
        if topic is not None:
            key = None
            if first:
                if not replay:
                    ring.note = last
                key = Unit._make((self.sources[index], first, 0))  # (half the cost of Unit())
            records = runs[0] if len(runs) == 1 else [message for run in runs for message in run]
            if not self._store(topic, records, body, due, key):
                return False
        ring.consume(count)
        return True

    def _store(self, topic_name: str, records: Sequence[bytes], body_bytes: int, due: int,
               unit: Unit | None) -> bool:
        """Store one batch; False when the owner cannot store it now (the batch stays in the
        ring, acknowledged: it is retried after ``STORE_RETRY``, and kept across an exit)."""
        broker = self.broker
        topic = broker.get_topic(topic_name)
        if not records:
            return True
        try:
            if due:  # counted from the publish: what is left of the delay (0 if it passed)
                now = time.monotonic_ns()
                for i, record in enumerate(records):
                    part = unit._replace(start=i) if unit is not None and i else unit
                    topic.put_deferred(record, max(0, due - now), now, body_bytes, part)
            else:
                topic.put_many(records, body_bytes, unit)
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
        if type(records) is not list and isinstance(records, Frames) and not records.decoded:
            self.framed += len(records)
        return True

    def stop(self) -> None:
        """No more wake-ups, retries or ``catch_up`` (a replacement may consume the rings now);
        a final ``drain(None)`` may still run."""
        if self._loop is not None:
            self._loop.remove_reader(self.wake_fd)
        self._loop = None
        self._live = []
        for handle in (self._soon, self._retry):
            if handle is not None:
                handle.cancel()
        self._soon = self._retry = None

    def close(self) -> None:
        for ring in self.rings:
            ring.close()
        self.rings.clear()
        for seg in self.segments:
            seg.close()

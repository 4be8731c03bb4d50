"""Cross-shard publish, the producer's side: one shared-memory ring per (producer shard →
owner shard) pair. The owner's side is ``shard/inbound.py``.

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
records. Every record carries the time its producer took just before writing it (``sent``,
``CLOCK_MONOTONIC``), later than the record before it in the same ring (pieces of one batch
get one nanosecond apart): the owner merges its rings by it and names the batch it is
applying by it.

A DPUB's record carries its absolute due time (``CLOCK_MONOTONIC`` ns, one clock for every
process of the host, and the rings do not outlive the host's uptime), taken when the
producer wrote the record, i.e. just before the ``OK``: the delay counts from the publish,
not from when the owner drains the ring (the owner may be restarting).

The record (``node/crossrecord.py``) carries the topic, the due time, the body bytes, the
count and the messages; a batch of ``FRAMED_MIN`` messages or more already framed as READY
records of the owner's ``MessageLog``, so the producer frames it once and each log of the
owner's that can take it whole appends it with one copy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from pynsqd.node.crossrecord import encode_batch
from pynsqd.node.rings import ring_name, ring_size
from pynsqd.shard.broker import Backpressure, BrokerError
from pynsqd.shm.ring import ByteRing
from pynsqd.shm.segment import Segment
from pynsqd.wire.message import HEADER

log = logging.getLogger("pynsqd.shard")


def _pieces(owner: int, topic: str, records: list[bytes], due_ns: int, max_size: int,
            sent: int) -> list[tuple[int, bytes]]:
    """``records`` as ring records of at most ``max_size`` bytes, [(messages, record)], halving
    until each piece fits, sent ``sent``, ``sent + 1``, ... ``BrokerError`` when one message
    alone does not fit."""
    data = encode_batch(topic, records, sum(map(len, records)) - HEADER.size * len(records), due_ns, sent_ns=sent)
    if len(data) <= max_size:
        return [(len(records), data)]
    if len(records) <= 1:
        raise BrokerError(f"message too large for the inbound ring of shard {owner}")
    half = len(records) // 2
    head = _pieces(owner, topic, records[:half], due_ns, max_size, sent)
    return head + _pieces(owner, topic, records[half:], due_ns, max_size, sent + len(head))


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
        self._last_sent = dict.fromkeys(self.rings, 0)  # per ring: the sent time of its last record
        self._to_wake: set[int] = set()
        self._wake_handle: asyncio.Handle | None = None

    def put(self, owner: int, topic: str, records: list[bytes], body_bytes: int, delay_ns: int) -> None:
        """Store a batch in ``owner``'s ring (a deferred one due ``delay_ns`` from now).
        Raises ``Backpressure`` when it does not fit now (with ``stored``: how many of the
        first records went in, for a batch larger than one ring record), ``BrokerError``
        when one message could never fit (a ring shrunk by RLIMIT_FSIZE)."""
        now = time.monotonic_ns()
        due_ns = now + delay_ns if delay_ns else 0
        ring = self.rings[owner]
        last = self._last_sent[owner]
        sent = self._last_sent[owner] = now if now > last else last + 1
        data = encode_batch(topic, records, body_bytes, due_ns, sent_ns=sent)
        if len(data) > ring.max_record_size:
            self._put_pieces(owner, ring, topic, records, due_ns, sent)
            return
        if not ring.put(data):
            self._wake(owner)
            raise Backpressure(f"inbound ring of shard {owner} is full")
        self.sent += len(records)
        self._wake(owner)

    def _put_pieces(self, owner: int, ring: ByteRing, topic: str, records: list[bytes], due_ns: int,
                    sent: int) -> None:
        """A batch larger than a ring record: as many pieces (whole records, in order) as
        fit, published at once; ``Backpressure.stored`` counts the messages stored."""
        pieces = _pieces(owner, topic, records, due_ns, ring.max_record_size, sent)
        self._last_sent[owner] = sent + len(pieces) - 1
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


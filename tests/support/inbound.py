"""One shard as the owner of cross-shard publishes, in the test process: its real queues
(shared-memory logs, disk queues) and its real inbound rings, with the producer end of each
ring to write records as the other shards do (``shard/crossshard.py``)."""

from __future__ import annotations

import os
import time

from pynsqd.node.config import NsqdOptions
from pynsqd.node.crossrecord import encode_batch
from pynsqd.node.metadata import TopicRecord
from pynsqd.node.rings import create_rings, release_rings, ring_name
from pynsqd.shard.broker import Broker
from pynsqd.shard.inbound import Inbound
from pynsqd.shard.node import make_broker
from pynsqd.shm.ring import ByteRing
from pynsqd.shm.segment import Segment, list_segments, unlink_segment


class OwnerRig:
    """Shard ``me`` of ``shards`` on ``opts.data_dir``: ``broker`` and ``inbound`` are the
    owner of the moment (``restart`` makes the next one), ``producers[src]`` the end of the
    ring from shard ``src`` that shard writes."""

    def __init__(self, opts: NsqdOptions, shards: int, me: int) -> None:
        self.opts = opts
        self.data = opts.data_dir
        self.shards = shards
        self.me = me
        self.rings = create_rings(self.data, shards)
        self.segments = {src: Segment.open(ring_name(self.data, src, me), 0, create=False)
                         for src in range(shards) if src != me}
        self.producers = {src: ByteRing(seg.buf, init=False) for src, seg in self.segments.items()}
        self.wake = os.eventfd(0)
        self.base = time.monotonic_ns() - 10**9  # before any drain's cutoff
        self._next = 0
        self.dead: list[tuple[Broker, Inbound]] = []  # owners "killed": dropped, never closed
        self.broker, self.inbound = self._owner()

    def _owner(self) -> tuple[Broker, Inbound]:
        opts = self.opts
        broker = make_broker(opts, shard=self.me, shards=self.shards)
        return broker, Inbound(self.data, self.me, self.shards, self.wake, broker)

    def put(self, src: int, topic: str, records: list[bytes], due: int = 0, at: int | None = None) -> None:
        """Shard ``src`` writes a record of ``records`` for ``topic``, sent ``at`` ns after
        ``base`` (default: later than every record before)."""
        self._next = self._next + 1000 if at is None else at
        data = encode_batch(topic, records, sum(map(len, records)), due, sent_ns=self.base + self._next)
        assert self.producers[src].put(data)

    def restart(self) -> None:
        """What the supervisor's restart of a killed shard finds: the same shared memory and
        files, and the topics it had (``nsqd.dat``); the old owner is dropped unclosed."""
        topics = [TopicRecord(t.name, t.paused, [(c, False) for c in t.channels]) for t in self.broker.topics.values()]
        self.dead.append((self.broker, self.inbound))
        self.broker, self.inbound = self._owner()
        self.broker.restore(topics)

    def close(self) -> None:
        for ring in self.producers.values():
            ring.close()
        for seg in self.segments.values():
            seg.close()
        self.inbound.close()
        self.broker.close()
        os.close(self.wake)
        release_rings(self.rings)
        for name in list_segments(self.data):
            unlink_segment(name)

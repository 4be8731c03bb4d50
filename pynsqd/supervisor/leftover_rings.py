"""Inbound rings a previous run left holding messages, rescued at supervisor start.

Theory of operation
-------------------
A cross-shard publish is acknowledged once it is in the owner's inbound ring
(``node/rings.py``), and a ring that still holds records when the node stops (an
owner killed before it drained) is kept for the next start. With the same ``--shards`` the
owner drains it as it boots. With another count the ring may be no (producer, owner) pair
of this run, or hold topics that ``Placement.rebalance_at_start`` gave to another shard:
nobody would drain it, or the wrong shard would. So ``rescue`` runs once, before any shard
exists (the supervisor is then the only process that touches the rings), and for every
ring that is not a pair of this run, or holds a topic its consumer does not own now, stores
each batch where the topic's owner finds it at boot: ready messages are appended to the
topic's disk queue (synced), deferred ones to the topic's journal (``shm/sidecar.py``) with
their due time turned into wall-clock ns, and a topic missing from ``nsqd.dat`` is added to
it. Only then is the ring emptied (consumed, or unlinked when it is no pair of this run).
A crash in between stores the batches again at the next start: duplicates, never loss.

``#ephemeral`` topics have no disk files: their batches are dropped (logged), as nsqd
loses ephemeral messages on any restart. A segment that is not a valid ring, or a ring
with a corrupt record length, is unlinked or reset (logged). A disk write that fails leaves
the ring as it is (logged): ``rescue`` returns its name and the caller's sweep must keep it,
so the next start tries again.
"""

from __future__ import annotations

import logging
import re
import struct
import time
from collections.abc import Callable, Sequence

from pynsqd.node import metadata
from pynsqd.node.config import NsqdOptions
from pynsqd.node.crossrecord import decode_batch
from pynsqd.node.datapath import make_backend
from pynsqd.node.metadata import TopicRecord
from pynsqd.node.rings import ring_name
from pynsqd.shm import sidecar as sidecar_file
from pynsqd.shm.diskqueue import DiskQueueError
from pynsqd.shm.ring import ByteRing, RingError
from pynsqd.shm.segment import Segment, SegmentError, list_segments
from pynsqd.wire.names import is_ephemeral

log = logging.getLogger("pynsqd.supervisor")

_PAIR = re.compile(r"(\d+)-(\d+)")
Batch = tuple[str, Sequence[bytes], int]  # topic, encoded messages, due monotonic ns (0: ready)


def rescue(opts: NsqdOptions, shards: int, owner: Callable[[str], int], topics: list[TopicRecord]) -> set[str]:
    """Move what leftover rings hold for another owner to disk (see the module doc).
    ``topics`` is nsqd.dat's list, extended (and saved) with the topics it had not. Returns
    the names of rings that must be kept because their batches could not be stored."""
    keep: set[str] = set()
    prefix = ring_name(opts.data_dir, 0, 1)[:-len("0-1")]  # a queue's has kind "topic"/"channel"
    for name in list_segments(opts.data_dir):
        match = _PAIR.fullmatch(name[len(prefix):]) if name.startswith(prefix) else None
        if match is None:
            continue
        src, dst = int(match[1]), int(match[2])
        current = src != dst and src < shards and dst < shards
        try:
            segment = Segment.open(name, 0, create=False)
        except SegmentError:
            continue
        try:
            _rescue_ring(opts, name, segment, current, dst, owner, topics, keep)
        finally:
            segment.close()
    return keep


def _rescue_ring(opts: NsqdOptions, name: str, segment: Segment, current: bool, dst: int,
                 owner: Callable[[str], int], topics: list[TopicRecord], keep: set[str]) -> None:
    try:
        ring = ByteRing(segment.buf, init=False)
    except RingError as exc:
        log.error("inbound ring %s is not a ring (%s); removing it", name, exc)
        segment.unlink()
        return
    try:
        try:
            records = ring.peek_many(len(ring)) if len(ring) else []
        except RingError as exc:  # a corrupt record length: nothing after it can be read
            log.error("inbound ring %s is corrupt (%s); its records are lost", name, exc)
            if current:
                ring.reset()
            records = []
        batches = []
        for data in records:
            try:
                topic, messages, _, due, _ = decode_batch(data)
            except (ValueError, struct.error) as exc:
                log.error("inbound ring %s: dropping a corrupt record - %s", name, exc)
                continue
            batches.append((topic, messages, due))
        if current and all(owner(topic) == dst for topic, _, _ in batches):
            return  # its consumer owns every topic in it: drained when that shard boots
        if batches:
            log.warning("inbound ring %s: %d batch(es) for shards of another run; storing them on disk",
                        name, len(batches))
            try:
                store_batches(opts, batches, topics)
            except (OSError, ValueError, DiskQueueError) as exc:
                log.error("inbound ring %s kept for the next start: cannot store its messages - %s", name, exc)
                keep.add(name)
                return
        if current:
            ring.consume(len(records))
    finally:
        ring.close()
    if not current:
        segment.unlink()


def store_batches(opts: NsqdOptions, batches: list[Batch], topics: list[TopicRecord]) -> None:
    """Append each batch to its topic's disk queue or journal, then make sure nsqd.dat lists
    the topic. Raises ``OSError`` or ``DiskQueueError`` when something is not stored."""
    ready: dict[str, list[bytes]] = {}
    known = {t.name for t in topics}
    added = False
    now_mono, now_wall = time.monotonic_ns(), time.time_ns()
    for topic, messages, due in batches:
        if is_ephemeral(topic):
            if messages:
                log.warning("TOPIC(%s): %d message(s) of a leftover ring dropped (ephemeral)", topic, len(messages))
            continue
        if topic not in known:
            known.add(topic)
            topics.append(TopicRecord(topic, False, []))
            added = True
        if not due:
            ready.setdefault(topic, []).extend(messages)
            continue
        journal = sidecar_file.journal_of(sidecar_file.sidecar_path(opts.data_dir, topic))
        for message in messages:
            sidecar_file.append_journal(journal, now_wall + max(0, due - now_mono), message)
    for topic, messages in ready.items():
        queue = make_backend(opts, topic)
        try:
            queue.put_many(messages)
        finally:
            queue.close()  # syncs the data and the metadata
    if added:
        metadata.save(opts.data_dir, metadata.encode(topics))

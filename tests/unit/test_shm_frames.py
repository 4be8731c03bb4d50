"""Framed runs (``shm/frames.py``) into real shared-memory logs: a cross-shard batch framed by
its producer is appended as it is, byte for byte what ``append_ready`` writes, or takes the
per-message path unchanged; a corrupt run never reaches a log."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.node.config import NsqdOptions
from pynsqd.node.crossrecord import FRAMED_MIN, decode_batch, encode_batch
from pynsqd.node.datapath import make_backend
from pynsqd.node.rings import create_rings, release_rings, ring_name
from pynsqd.shard.backend import DropBackend
from pynsqd.shard.broker import Broker
from pynsqd.shard.inbound import DRAIN_BYTES, Inbound
from pynsqd.shard.node import make_broker
from pynsqd.shard.queue import MessageQueue, segment_queue
from pynsqd.shm.frames import FRAME, WRAP, Frames, RingError, check_frames, frame_records
from pynsqd.shm.log import READY_HEADER, check_ready, frame_ready
from pynsqd.shm.ring import ByteRing, buffer_size
from pynsqd.shm.segment import Segment, list_segments, unlink_segment
from pynsqd.shm.store import NAME_PAGE
from pynsqd.wire.message import HEADER

UNIFORM = [200] * 200  # the benchmark's MPUB: 226-byte messages, 242-byte records, 6 bytes pad
ALIGNED = [198] * 50  # 240-byte records: no pad
MIXED = [0, 1, 2, 3, 5, 7, 8, 13, 200, 1000, 6, 4]  # every pad length


def messages(sizes: list[int], first: int = 0) -> list[bytes]:
    return [HEADER.pack(first + i, 0, b"%016d" % (first + i)) + bytes([65 + i % 26]) * n
            for i, n in enumerate(sizes)]


BATCH = messages(UNIFORM[:100] + MIXED, 10_000)
_SENT = iter(range(time.monotonic_ns() - 10**9, 1 << 63))  # increasing, and before any drain's cutoff


def encode(topic: str, batch: list[bytes], body_bytes: int, due: int, framed: bool | None = None) -> bytes:
    """A ring record as a producer shard writes it."""
    return encode_batch(topic, batch, body_bytes, due, sent_ns=next(_SENT), framed=framed)


def framed(batch: list[bytes]) -> Frames:
    """``batch`` as the owner gets it from a cross-shard ring record."""
    records = decode_batch(encode_batch("t", batch, 0, 0, sent_ns=1, framed=True)).messages
    assert isinstance(records, Frames)
    return records


def area(queue: MessageQueue) -> bytes:
    """The log's whole segment past its name page: ring header and record area."""
    assert queue.segment is not None
    return bytes(queue.segment.buf[NAME_PAGE:])


Make = Callable[..., MessageQueue]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    """``make(name, capacity, limit, durable)``: a queue over a real shared-memory log and (if
    durable) a real disk queue; all deleted afterwards."""
    data = str(tmp_path)
    queues: list[MessageQueue] = []

    def new(name: str, capacity: int = 1 << 20, limit: int = 10_000, durable: bool = True) -> MessageQueue:
        backend = make_backend(NsqdOptions(data_path=data), name) if durable else DropBackend()
        queue = segment_queue(data, limit, capacity, "channel", name, backend)
        queues.append(queue)
        return queue

    yield new
    for queue in queues:
        queue.close(delete=True)
    _remove_segments(data)


def _remove_segments(data: str) -> None:
    """Shared memory outlives the test: give back what the queues of ``data`` left."""
    for name in list_segments(data):
        unlink_segment(name)


@pytest.mark.parametrize("sizes", [UNIFORM, ALIGNED, MIXED], ids=["uniform", "aligned", "mixed"])
def test_a_framed_run_is_appended_as_the_bytes_append_ready_writes(make: Make, sizes: list[int]) -> None:
    plain, fast = make("plain"), make("fast")
    for round_ in range(3):  # successive runs start at every alignment the sizes lead to
        batch = messages(sizes, round_ * 1000)
        run = framed(batch)
        plain.put_many(batch)
        fast.put_many(run)
        assert not run.decoded  # appended with one copy, never cut into messages
        assert area(fast) == area(plain)
        assert (fast.ready, fast.live) == (plain.ready, plain.live) == (len(sizes) * (round_ + 1),) * 2
    assert fast.log.walk(0, 10_000)[1] == plain.log.walk(0, 10_000)[1]


def test_small_batches_are_written_as_length_prefixed_records_large_ones_framed() -> None:
    """Framing has a fixed cost that a /pub or a small MPUB does not pay back."""
    few, many = messages(UNIFORM[:FRAMED_MIN - 1], 0), messages(UNIFORM[:FRAMED_MIN], 0)
    assert encode("t", few, 0, 0)[9:10] == b"D" and encode("t", many, 0, 0)[9:10] == b"F"
    for batch in (few, many):
        assert list(decode_batch(encode("t", batch, 0, 0)).messages) == batch


def test_a_framed_run_reaches_every_channel_with_the_stats_of_a_local_publish(tmp_path: Path) -> None:
    """Three channels: each log is byte for byte the log of a topic fed the messages, and
    the topic and channel counts are the same."""
    opts = NsqdOptions(data_path=str(tmp_path), mem_queue_size=1000)
    broker = make_broker(opts)
    try:
        local, cross = broker.get_topic("local"), broker.get_topic("cross")
        for topic in (local, cross):
            for name in ("a", "b", "c"):
                broker.get_channel(topic, name)
        for round_, sizes in enumerate((UNIFORM, MIXED, ALIGNED)):
            batch = messages(sizes, round_ * 1000)
            body_bytes = sum(sizes)
            run = framed(batch)
            local.put_many(batch, body_bytes)
            cross.put_many(run, body_bytes)
            assert not run.decoded
        for name in ("a", "b", "c"):
            plain, fast = local.channels[name], cross.channels[name]
            assert area(fast.queue) == area(plain.queue)
            assert (fast.message_count, fast.depth, fast.queue.live) == (plain.message_count, plain.depth,
                                                                         plain.queue.live) == (262,) * 3
        assert (cross.message_count, cross.message_bytes, cross.depth) == (262, sum(UNIFORM + MIXED + ALIGNED), 0)
        assert (local.message_count, local.message_bytes) == (cross.message_count, cross.message_bytes)
    finally:
        for name in ("local", "cross"):
            broker.delete_topic(name)
        _remove_segments(str(tmp_path))


def test_a_paused_topic_keeps_the_run_in_its_own_log_and_hands_on_the_same_messages(tmp_path: Path) -> None:
    """Not flowing (paused): the run goes where the message list went — the topic's own
    queue, byte for byte — and unpaused, the pump hands the same messages to the channel."""
    opts = NsqdOptions(data_path=str(tmp_path))
    broker = make_broker(opts)
    try:
        local, cross = broker.get_topic("local"), broker.get_topic("cross")
        for topic in (local, cross):
            broker.get_channel(topic, "c")
            topic.pause()
        run = framed(BATCH)
        local.put_many(BATCH, 5)
        cross.put_many(run, 5)
        assert not run.decoded and area(cross.queue) == area(local.queue)
        assert (cross.depth, cross.message_count, cross.channels["c"].depth) == (len(BATCH), len(BATCH), 0)
        for topic in (local, cross):
            topic.unpause()
            topic.pump(time.monotonic_ns())
        assert area(cross.channels["c"].queue) == area(local.channels["c"].queue)
        assert (cross.depth, cross.channels["c"].depth) == (0, len(BATCH))
    finally:
        for name in ("local", "cross"):
            broker.delete_topic(name)
        _remove_segments(str(tmp_path))


def _near_the_end(queue: MessageQueue) -> None:
    """Leave the write index a little before the end of the area: a run has to wrap."""
    filler = messages([400] * 120, 50_000)
    queue.put_many(filler)
    positions, _ = queue.take(len(filler))
    for pos in positions:
        queue.finish(pos)
    queue.log.release()


def _full_of_done(queue: MessageQueue) -> None:
    """Fill the log with finished records not yet released: only ``make_room`` frees it."""
    filler = messages([400] * 140, 50_000)
    queue.put_many(filler)
    positions, _ = queue.take(len(filler))
    for pos in positions[:-1]:
        queue.finish(pos)  # fewer than RELEASE_EVERY: nothing released


def _tight(queue: MessageQueue) -> None:
    """Leave 96 bytes more than the run's frames free, behind finished records: the run
    fits, but the per-message path (31 bytes a message to spare) frees room first."""
    spare = queue.log.capacity - len(frame_ready(BATCH).data) - 96
    filler = messages([400] * (spare // 456 - 1), 50_000)
    rest = spare - 456 * len(filler)
    filler += messages([rest - 8 - 16 - 26], 60_000)
    queue.put_many(filler)
    assert queue.log.free_bytes == len(frame_ready(BATCH).data) + 96
    positions, _ = queue.take(len(filler))
    for pos in positions:
        queue.finish(pos)


FALLBACKS: dict[str, tuple[dict[str, object], Callable[[MessageQueue], None] | None]] = {
    "wrap": ({"capacity": 1 << 16}, _near_the_end),
    "make_room": ({"capacity": 1 << 16}, _full_of_done),
    "tight": ({"capacity": 1 << 16}, _tight),
    "spill": ({"limit": 100}, None),  # room for 100 of 112: the rest to the disk queue
    "no_room": ({"limit": 0}, None),
    "ephemeral": ({"limit": 60, "durable": False}, None),
    "larger_than_the_log": ({"capacity": 4096}, None),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_a_run_outside_the_fast_path_stores_exactly_what_the_messages_would(make: Make, case: str) -> None:
    kwargs, prepare = FALLBACKS[case]
    plain, fast = make("plain", **kwargs), make("fast", **kwargs)  # type: ignore[arg-type]
    if prepare is not None:
        prepare(plain)
        prepare(fast)
        assert area(fast) == area(plain)
    batch = BATCH
    run = framed(batch)
    plain.put_many(batch)
    fast.put_many(run)
    assert run.decoded  # the per-message path
    assert area(fast) == area(plain)
    assert (fast.ready, fast.live, len(fast)) == (plain.ready, plain.live, len(plain))
    stored = fast.take(10_000)[1]
    assert stored == plain.take(10_000)[1]
    behind = fast.backend.peek_many(10_000)
    assert behind == plain.backend.peek_many(10_000)
    if isinstance(fast.backend, DropBackend):
        assert fast.backend.dropped == plain.backend.dropped == len(batch) - len(stored)  # type: ignore[attr-defined]
    else:
        assert sorted(stored + behind) == sorted(batch)


def _record(batch: list[bytes]) -> bytes:
    return encode("t", batch, 7, 0, framed=True)


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:]


FRAMES_AT = 9 + 3 + 1 + 16  # "T" and sent time, kind, topic length, "t", due/body bytes/count
FRAME_BYTES = 8 + 16 + 226 + 6  # one uniform record


CORRUPT: dict[str, Callable[[bytes], bytes]] = {
    "truncated by a frame": lambda d: d[:-FRAME_BYTES],
    "truncated by a byte": lambda d: d[:-1],
    "a trailing frame": lambda d: d + d[FRAMES_AT:FRAMES_AT + FRAME_BYTES],
    "count one more": lambda d: d[:FRAMES_AT - 4] + struct.pack(">I", 201) + d[FRAMES_AT:],
    "count one less": lambda d: d[:FRAMES_AT - 4] + struct.pack(">I", 199) + d[FRAMES_AT:],
    "a length": lambda d: _flip(d, FRAMES_AT + 7 * FRAME_BYTES),
    "a pad byte": lambda d: _flip(d, FRAMES_AT + 9 * FRAME_BYTES - 1),
    "a length's complement": lambda d: _flip(d, FRAMES_AT + 120 * FRAME_BYTES + 5),
    "a state byte": lambda d: d[:FRAMES_AT + 50 * FRAME_BYTES + 8] + b"\x02" + d[FRAMES_AT + 50 * FRAME_BYTES + 9:],
    "a state header's pad": lambda d: _flip(d, FRAMES_AT + 199 * FRAME_BYTES + 12),
    "a wrap marker": lambda d: (d[:FRAMES_AT + 3 * FRAME_BYTES] + FRAME.pack(WRAP, 0)
                                + d[FRAMES_AT + 3 * FRAME_BYTES + 8:]),
    "the head": lambda d: b"X" + d[1:],
    "the kind": lambda d: d[:9] + b"X" + d[10:],
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_a_corrupt_framed_record_is_refused_whole(case: str) -> None:
    good = _record(messages(UNIFORM))
    bad = CORRUPT[case](good)
    assert bad != good and len(bad) > FRAMES_AT
    with pytest.raises(ValueError):
        decode_batch(bad)


def test_runs_the_uniform_proof_cannot_take_are_walked_and_still_checked() -> None:
    """A mixed run, and a uniform run with one different record, go through the walk: a
    valid one is adopted, a short message or a bad frame anywhere is not."""
    for sizes in (MIXED, [*UNIFORM[:10], 201, *UNIFORM[:10]]):
        batch = messages(sizes)
        data = frame_ready(batch).data
        run = check_ready(data, 0, len(batch))
        assert list(run) == batch and run.largest == max(8 + ((16 + len(m) + 7) & ~7) for m in batch)
        with pytest.raises(RingError):
            check_ready(data, 0, len(batch) + 1)
        with pytest.raises(RingError):
            check_ready(data[:-8], 0, len(batch))
    short = frame_ready([*messages([10, 10]), b"x" * 25]).data  # a 25-byte "message"
    with pytest.raises(RingError):
        check_ready(short, 0, 3)
    with pytest.raises(RingError):  # 25-byte records of a lead-less run are fine, 26 wanted
        check_frames(frame_records([b"y" * 25] * 4).data, 0, 4, b"", 26)
    assert len(check_frames(frame_records([b"y" * 25] * 4).data, 0, 4)) == 4


@pytest.mark.parametrize("sizes", [UNIFORM, ALIGNED, [201, 203, 201, 203], [7]],
                         ids=["uniform", "aligned", "same-padded-size", "one"])
def test_a_checked_run_decodes_to_exactly_its_records(sizes: list[int]) -> None:
    """A run of equal frames is decoded at a fixed stride; records whose frames pad to the
    same size (201 and 203 bytes) are not equal frames and are decoded one head at a time:
    either way the records come back exactly, lengths and all."""
    batch = messages(sizes)
    run = check_ready(frame_ready(batch).data, 0, len(batch))
    assert run.equal == (len(set(sizes)) == 1) and not run.decoded
    assert list(run) == batch and [len(m) for m in run] == [len(m) for m in batch]
    assert frame_ready(batch).equal == (len(set(sizes)) == 1)


@pytest.mark.parametrize("sizes", [UNIFORM, ALIGNED, MIXED, [7], []],
                         ids=["uniform", "aligned", "mixed", "one", "none"])
def test_frame_records_writes_the_ring_frame_format(sizes: list[int]) -> None:
    """Against the format spelled out by hand: length, complement, lead, record, zero pad."""
    batch = messages(sizes)
    for lead, head in ((b"", b""), (READY_HEADER, b"HEAD")):
        run = frame_records(batch, lead, head)
        by_hand = b"".join(FRAME.pack(len(lead) + len(m), (len(lead) + len(m)) ^ WRAP) + lead + m
                           + bytes(-(len(lead) + len(m)) & 7) for m in batch)
        assert run.data == head + by_hand and (run.start, run.end, len(run)) == (len(head), len(run.data), len(batch))
        if batch:
            assert list(check_frames(run.data, len(head), len(batch), lead)) == batch


def test_put_frames_keeps_the_ring_invariants() -> None:
    """One index store: the count and the bytes appear together; a run that would wrap, not
    fit, or hold a frame over ``max_record_size`` is refused whole (0), nothing written."""
    ring = ByteRing(bytearray(buffer_size(4096)), init=True)
    run = frame_records(messages([100] * 10), READY_HEADER)  # 10 x 152 bytes
    assert ring.put_frames(run) == 10 and len(ring) == 10 and ring.used_bytes == 1520
    assert ring.put_frames(run) == 10 and ring.put_frames(run) == 0  # 3040 used, 1056 left
    assert len(ring) == 20 and ring.used_bytes == 3040
    assert [r[16:] for r in ring.take_many(15)] == messages([100] * 10) + messages([100] * 5)
    assert ring.put_frames(run) == 0  # fits the free space, not before the end: never wraps
    assert len(ring) == 5 and ring.used_bytes == 760
    assert ring.put_many(list(run)) == 10  # put_many wraps it
    huge = frame_records([b"z" * 2100])
    assert ring.put_frames(huge) == 0  # larger than half the area: a frame that can never fit
    with pytest.raises(ValueError):
        ByteRing(bytearray(buffer_size(4096)), init=True).put_many([b"z" * 2100])


def test_a_record_without_its_sent_time_or_of_another_kind_is_not_a_publish_record() -> None:
    """Only "T"-headed records of kind "F" or "D" decode; a "D" record written by hand decodes
    to its messages, and the same bytes without the head, under another kind or cut short
    are refused."""
    batch = messages([5, 300, 0])
    body = b"".join(struct.pack(">I", len(m)) + m for m in batch)
    head = struct.pack(">H", 5) + b"topic" + struct.pack(">QII", 123, 305, 3)
    sent = b"T" + struct.pack(">Q", 77)
    assert decode_batch(sent + b"D" + head + body) == ("topic", batch, 305, 123, 77)
    for bad in (b"D" + head + body, sent + b"P" + head + body, b"P" + head + body, sent + b"D" + head + body[:-1], b""):
        with pytest.raises(ValueError):
            decode_batch(bad)


Owner = tuple[Broker, Inbound, ByteRing]


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[Owner]:
    """Shard 1 of 2 with its real queues, its inbound ring from shard 0, and that ring's
    producer end."""
    data = str(tmp_path)
    opts = NsqdOptions(data_path=data)
    rings = create_rings(data, 2)
    broker = make_broker(opts, shard=1, shards=2)
    wake = os.eventfd(0)
    inbound = Inbound(data, 1, 2, wake, broker)
    producer = Segment.open(ring_name(data, 0, 1), 0, create=False)
    ring = ByteRing(producer.buf, init=False)
    try:
        yield broker, inbound, ring
    finally:
        ring.close()
        producer.close()
        inbound.close()
        os.close(wake)
        for name in list(broker.topics):
            broker.delete_topic(name)
        release_rings(rings)
        _remove_segments(data)


def test_the_owner_drops_a_corrupt_record_untouched_and_stores_the_others(owner: Owner) -> None:
    """Real inbound ring 0 → 1 and the owner's real queues: a corrupt framed record is logged
    and consumed without a byte of any log changing; a framed and a "D" record behind it
    are stored as a local publish of the same messages stores them."""
    broker, inbound, ring = owner
    local, cross = broker.get_topic("local"), broker.get_topic("t")
    broker.get_channel(local, "c")
    broker.get_channel(cross, "c")
    before = area(cross.channels["c"].queue)
    good, old = messages(UNIFORM), messages(MIXED, 5000)
    bad = CORRUPT["a length"](encode("t", good, 1, 0, framed=True))
    assert ring.put(bad)
    assert inbound.drain() == 1 and len(ring) == 0
    assert area(cross.channels["c"].queue) == before and cross.message_count == 0
    assert ring.put_many([encode("t", good, 40_000, 0, framed=True), encode("t", old, 2, 0, framed=False)]) == 2
    assert inbound.drain() == 2
    local.put_many(good, 40_000)
    local.put_many(old, 2)
    assert area(cross.channels["c"].queue) == area(local.channels["c"].queue)
    assert (cross.message_count, cross.message_bytes) == (local.message_count, local.message_bytes)
    assert (inbound.received, inbound.framed) == (len(good) + len(old), len(good))


def test_one_drain_turn_takes_records_up_to_drain_bytes_and_the_next_turn_the_rest(owner: Owner) -> None:
    """A backlog of large records (cross-shard MPUBs) is applied a bounded slice per loop
    turn, so the owner's own connections are not held up for the whole backlog; the next
    turn continues in order and nothing is stored twice."""
    broker, inbound, ring = owner
    topic = broker.get_topic("big")
    broker.get_channel(topic, "c")
    m = messages([200] * 2000)
    records = [encode("big", m[i:i + 200], 200 * 200, 0) for i in range(0, 2000, 200)]  # ~45 KB each
    per_turn = next(n for n in range(1, 11) if sum(map(len, records[:n])) >= DRAIN_BYTES)
    assert per_turn < len(records)
    assert ring.put_many(records) == len(records)
    assert inbound.drain() == per_turn and len(ring) == len(records) - per_turn
    assert topic.message_count == 200 * per_turn
    while len(ring):
        assert 0 < inbound.drain() <= per_turn
    assert topic.channels["c"].queue.take(5000)[1] == m
    assert topic.message_count == 2000 and inbound.received == 2000


def test_the_owner_stores_a_run_of_one_message_records_for_a_topic_with_one_call(owner: Owner) -> None:
    """Records of one message (a cross-shard /pub each) drained together go to their topic
    as one list per run of the same topic. A deferred record, another topic or a corrupt
    record ends a run. Every message is stored once, in order; the deferred one stays
    deferred."""
    broker, inbound, ring = owner
    topics = {name: broker.get_topic(name) for name in ("t", "u")}
    for topic in topics.values():
        broker.get_channel(topic, "c")
    calls: list[tuple[str, int]] = []
    for name in ("t", "u"):
        real = topics[name].put_many

        def counted(records: Any, body_bytes: int, unit: Any = None, name: str = name, real: Any = real) -> None:
            calls.append((name, len(records)))
            real(records, body_bytes, unit)
        topics[name].put_many = counted  # type: ignore[method-assign]
    m = messages([30 + i for i in range(8)])
    due = time.monotonic_ns() + 60 * 10**9
    records = [encode("t", [m[0]], 30, 0), encode("t", [m[1]], 31, 0),
               encode("t", [m[2]], 32, 0), encode("u", [m[3]], 33, 0),
               encode("t", [m[4]], 34, 0), encode("t", [m[5]], 35, due),
               b"D\x00\x01t" + b"\x00" * 7,  # corrupt: logged and dropped
               encode("t", [m[6]], 36, 0), encode("t", [m[7]], 37, 0)]
    assert ring.put_many(records) == len(records)
    assert inbound.drain() == len(records) and len(ring) == 0
    assert calls == [("t", 3), ("u", 1), ("t", 1), ("t", 2)]
    t = topics["t"]
    assert t.channels["c"].queue.take(10)[1] == [m[i] for i in (0, 1, 2, 4, 6, 7)]
    assert list(t.channels["c"].deferred_at) == [m[5][10:26]]  # its id: deferred, not ready
    assert (t.message_count, t.message_bytes) == (7, 30 + 31 + 32 + 34 + 35 + 36 + 37)
    assert inbound.received == 8

"""ByteRing over plain bytearrays: framing, wrap-around, full/empty, every record size,
corruption, and a hypothesis model test against a deque. No processes here (see
tests/test_segment.py for the ring across processes over real shared memory)."""

from __future__ import annotations

import struct
from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pynsqd.shm.ring import HEADER_SIZE, ByteRing, RingError, buffer_size, frame_size


def ring(capacity: int = 256) -> ByteRing:
    return ByteRing(bytearray(buffer_size(capacity)), init=True)


def rec(i: int, size: int) -> bytes:
    return bytes((i + k) % 251 for k in range(size))


def test_empty_ring() -> None:
    r = ring()
    assert len(r) == 0 and r.used_bytes == 0 and r.free_bytes == r.capacity == 256
    assert r.take_many(10) == [] and r.peek_many(10) == []
    r.consume(0)
    with pytest.raises(ValueError):
        r.consume(1)
    assert r.max_record_size == 128 - 8


def test_fifo_order_and_counts() -> None:
    r = ring(1024)
    assert r.put(b"a") and r.put(b"") and r.put_many([b"bc", b"defghijkl"]) == 2
    assert len(r) == 4
    assert r.used_bytes == frame_size(1) + frame_size(0) + frame_size(2) + frame_size(9)
    assert r.take_many(2) == [b"a", b""]
    assert len(r) == 2
    assert r.take_many(100) == [b"bc", b"defghijkl"]
    assert len(r) == 0 and r.used_bytes == 0


def test_full_ring_refuses_then_accepts_after_take() -> None:
    r = ring(256)
    n = r.put_many([rec(i, 24) for i in range(100)])  # 32-byte frames
    assert n == 8 and r.free_bytes == 0
    assert not r.put(b"x")
    assert r.put_many([b"x", b"y"]) == 0
    assert r.take_many(1) == [rec(0, 24)]
    assert r.put_many([rec(100, 24), rec(101, 24)]) == 1  # partial batch: only what fits
    assert r.take_many(100) == [rec(i, 24) for i in range(1, 8)] + [rec(100, 24)]


def test_wrap_around_many_laps_keeps_records_intact() -> None:
    r = ring(512)
    sent: deque[bytes] = deque()
    got: list[bytes] = []
    i = 0
    for lap in range(400):
        batch = [rec(i + k, (i + k) * 7 % 120) for k in range(lap % 5 + 1)]
        n = r.put_many(batch)
        sent.extend(batch[:n])
        i += n
        got += r.take_many(lap % 3 + 1)
    got += r.take_many(1 << 20)
    assert got == list(sent) and len(r) == 0
    assert r.used_bytes == 0


def test_record_that_does_not_fit_before_the_end_wraps_whole() -> None:
    r = ring(256)
    assert r.put_many([rec(0, 100), rec(1, 100)]) == 2  # 224 bytes: the next 112 would pass the end
    assert r.take_many(2) == [rec(0, 100), rec(1, 100)]
    assert r.put(rec(2, 100))  # wrap marker at 224, record at 0
    assert r.used_bytes == (256 - 224) + frame_size(100)
    assert r.take_many(1) == [rec(2, 100)] and r.used_bytes == 0


@pytest.mark.parametrize("capacity", [64, 200, 4096])
def test_every_record_size_up_to_the_max(capacity: int) -> None:
    r = ring(capacity)
    for size in range(r.max_record_size + 1):
        assert r.put(rec(size, size)), size
        # an extra lap position each time so the record meets every offset
        assert r.take_many(1) == [rec(size, size)]
    for size in range(r.max_record_size + 1):
        # every size fits once the ring is empty, wherever the indices stand
        r.put(rec(0, size % 9))
        r.take_many(1)
        assert r.put(rec(size, size)) and r.take_many(1) == [rec(size, size)]
    with pytest.raises(ValueError):
        r.put(bytes(r.max_record_size + 1))


def test_max_msg_size_records_round_trip() -> None:
    """The default --max-msg-size (1 MiB) plus NSQ's 26-byte message header, in a 4 MiB ring."""
    r = ring(4 << 20)
    big = [rec(i, (1 << 20) + 26 - i) for i in range(3)]
    assert r.put_many(big) == 3
    assert r.take_many(5) == big


def test_peek_then_consume_is_at_least_once() -> None:
    r = ring(1024)
    r.put_many([rec(i, 10) for i in range(5)])
    assert r.peek_many(3) == [rec(i, 10) for i in range(3)]
    assert r.peek_many(3) == [rec(i, 10) for i in range(3)]  # nothing consumed yet
    r.consume(3)
    assert r.take_many(10) == [rec(3, 10), rec(4, 10)]
    r.put_many([rec(9, 10), rec(10, 10)])
    r.consume(1)  # without a peek: walks the frames
    assert r.take_many(10) == [rec(10, 10)]


def test_a_peek_is_consumed_a_few_records_at_a_time_also_across_a_wrap() -> None:
    r = ring(512)
    r.put_many([rec(i, 40) for i in range(6)])  # 48-byte frames
    r.consume(5)
    assert r.put_many([rec(i, 40) for i in range(6, 14)]) == 8  # wraps after record 9
    assert r.peek_many(100) == [rec(i, 40) for i in range(5, 14)] and r.peeked_all
    for taken in (1, 4, 2):  # the third stops right before the wrap marker
        r.consume(taken)
    assert len(r) == 2
    assert r.take_many(100) == [rec(12, 40), rec(13, 40)] and not r.has_records()
    r.put_many([rec(i, 40) for i in range(20, 25)])
    assert r.peek_many(3) == [rec(20, 40), rec(21, 40), rec(22, 40)] and not r.peeked_all


def test_the_consumers_note_is_kept_in_the_ring_until_a_reset() -> None:
    buf = bytearray(buffer_size(512))
    a = ByteRing(buf, init=True)
    assert a.note == 0
    a.note = 12345
    a.put(b"x")
    b = ByteRing(buf, init=False)
    assert b.note == 12345 and b.take_many(1) == [b"x"] and b.note == 12345
    b.reset()
    assert a.note == 0


def test_count_from_counts_records_from_a_boundary_and_refuses_anything_else() -> None:
    r = ring(1024)
    r.put_many([rec(i, 10) for i in range(4)])  # 24-byte frames
    assert [r.count_from(at) for at in (0, 24, 96)] == [4, 3, 0]
    for bad in (-8, 8 * 13, 4):
        with pytest.raises(RingError):
            r.count_from(bad)


def test_peek_stops_adding_records_once_they_hold_max_bytes_also_across_a_wrap() -> None:
    r = ring(512)
    r.put_many([rec(i, 40) for i in range(6)])  # 48-byte frames
    r.consume(5)  # the read index near the middle: the next puts wrap
    assert r.put_many([rec(i, 40) for i in range(6, 14)]) == 8
    assert r.peek_many(100, max_bytes=100) == [rec(5, 40), rec(6, 40), rec(7, 40)]  # 80 < 100: one more
    r.consume(3)
    assert r.peek_many(100, max_bytes=80) == [rec(8, 40), rec(9, 40)]  # 80: stop
    assert r.peek_many(100, max_bytes=1) == [rec(8, 40)]  # the first always comes
    assert r.peek_many(2, max_bytes=10**6) == [rec(8, 40), rec(9, 40)]  # the count still bounds
    r.consume(1)
    assert r.take_many(100) == [rec(i, 40) for i in range(9, 14)]


def test_attach_sees_the_same_ring() -> None:
    buf = bytearray(buffer_size(512))
    a = ByteRing(buf, init=True)
    a.put_many([b"one", b"two"])
    b = ByteRing(buf, init=False)
    assert len(b) == 2 and b.take_many(1) == [b"one"]
    assert len(a) == 1 and a.take_many(5) == [b"two"]


def test_not_a_ring() -> None:
    with pytest.raises(RingError):
        ByteRing(bytearray(1024), init=False)
    buf = bytearray(buffer_size(256))
    ByteRing(buf, init=True)
    for offset, value in [(8, 2), (16, 3), (16, 1 << 40), (16, 8)]:  # version, capacity
        bad = bytearray(buf)
        struct.pack_into("<Q" if offset == 16 else "<I", bad, offset, value)
        with pytest.raises(RingError):
            ByteRing(bad, init=False)
    with pytest.raises(ValueError):
        ByteRing(bytearray(HEADER_SIZE + 8), init=True)
    with pytest.raises(ValueError):
        ByteRing(memoryview(bytes(1024)), init=True)


@pytest.mark.parametrize("field", ["length", "check", "huge", "wrap"])
def test_corrupt_record_length_raises(field: str) -> None:
    buf = bytearray(buffer_size(256))
    r = ByteRing(buf, init=True)
    r.put_many([b"hello", b"world"])
    frame = HEADER_SIZE
    if field == "length":
        struct.pack_into("<I", buf, frame, 6)
    elif field == "check":
        struct.pack_into("<I", buf, frame + 4, 0)
    elif field == "huge":
        struct.pack_into("<II", buf, frame, 1000, 1000 ^ 0xFFFFFFFF)
    else:  # a wrap marker where the write index says no wrap happened
        struct.pack_into("<II", buf, frame, 0xFFFFFFFF, 0)
    for call in (lambda: r.take_many(2), lambda: r.peek_many(1)):
        with pytest.raises(RingError):
            call()


@pytest.mark.parametrize("read,write", [(16, 8), (0, 264), (3, 8)])
def test_corrupt_indices_raise(read: int, write: int) -> None:
    buf = bytearray(buffer_size(256))
    r = ByteRing(buf, init=True)
    struct.pack_into("<Q", buf, 64, write)
    struct.pack_into("<Q", buf, 128, read)
    for call in (lambda: r.take_many(1), lambda: r.put(b"x"), lambda: r.used_bytes):
        with pytest.raises(RingError):
            call()


def test_reset_and_close() -> None:
    r = ring()
    r.put_many([b"a", b"b"])
    r.reset()
    assert len(r) == 0 and r.take_many(3) == [] and r.put(b"c") and r.take_many(1) == [b"c"]
    r.close()


class RingModel(RuleBasedStateMachine):
    """The ring behaves as a deque bounded by bytes, however calls interleave."""

    def __init__(self) -> None:
        super().__init__()
        self.capacity = 512
        self.ring = ring(self.capacity)
        self.model: deque[bytes] = deque()
        self.counter = 0

    @rule(sizes=st.lists(st.integers(0, 248), max_size=12))
    def put_many(self, sizes: list[int]) -> None:
        batch = [rec(self.counter + i, size) for i, size in enumerate(sizes)]
        self.counter += len(batch)
        n = self.ring.put_many(batch)
        self.model.extend(batch[:n])
        if n < len(batch):
            # refused only when the next frame does not fit: before the end, or after a wrap
            write, read = self.ring._indices()
            tail = self.capacity - write % self.capacity
            free = self.capacity - (write - read)
            frame = frame_size(len(batch[n]))
            assert frame > free if frame <= tail else tail + frame > free

    @rule(count=st.integers(0, 10))
    def take_many(self, count: int) -> None:
        expect = [self.model.popleft() for _ in range(min(count, len(self.model)))]
        assert self.ring.take_many(count) == expect

    @rule(count=st.integers(0, 10), keep=st.booleans())
    def peek_consume(self, count: int, keep: bool) -> None:
        expect = list(self.model)[:count]
        assert self.ring.peek_many(count) == expect
        if not keep:
            self.ring.consume(len(expect))
            for _ in expect:
                self.model.popleft()

    @rule()
    def reattach(self) -> None:
        buf = self.ring._buf.obj
        assert isinstance(buf, bytearray)
        self.ring.close()
        self.ring = ByteRing(buf, init=False)

    @invariant()
    def sizes_agree(self) -> None:
        assert len(self.ring) == len(self.model)
        assert self.ring.used_bytes >= sum(frame_size(len(r)) for r in self.model)
        assert self.ring.free_bytes == self.capacity - self.ring.used_bytes
        if not self.model:
            assert self.ring.used_bytes == 0


TestRingModel = RingModel.TestCase
TestRingModel.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


def test_prefix_is_stored_in_front_of_every_record() -> None:
    r = ring(1024)
    assert r.put_many([b"a", b"bc"], prefix=b"P:") == 2
    assert r.take_many(5) == [b"P:a", b"P:bc"]
    with pytest.raises(ValueError):
        r.put_many([bytes(r.max_record_size)], prefix=b"x")

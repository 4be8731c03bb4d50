"""Frames, the message encoding and message ids (nsqd's protocol_v2.go and message.go)."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from pynsqd.wire.errors import CODES, ProtocolError
from pynsqd.wire.frames import (
    CLOSE_WAIT_FRAME,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    FrameParser,
    encode_error,
    encode_frame,
    encode_response,
)
from pynsqd.wire.message import (
    HEADER,
    HEADER_SIZE,
    IdFactory,
    decode_message,
    encode_message,
    message_attempts,
    message_id,
    shard_bits_for,
    with_attempts,
)

TWEPOCH_NS = 1288834974288 << 20


def norm(items: list[Any]) -> list[Any]:
    return [("ERROR", i.code, i.description) if isinstance(i, ProtocolError) else i for i in items]


def parse3(data: bytes, *, trailing: bool = True, **kw: int) -> list[Any]:
    """Whole, byte at a time, and followed by another frame: all must agree."""
    whole = norm(FrameParser(**kw).feed(data))
    parser = FrameParser(**kw)
    bytewise: list[Any] = []
    for i in range(len(data)):
        bytewise.extend(parser.feed(data[i:i + 1]))
    assert norm(bytewise) == whole
    if trailing:
        tail = norm(FrameParser(**kw).feed(data + OK_FRAME))
        if whole and whole[-1][0] == "ERROR":
            assert tail == whole
        else:
            assert tail == [*whole, (FRAME_RESPONSE, b"OK")]
    return whole


# --- encoding ----------------------------------------------------------------------------------

def test_frame_layout() -> None:
    assert encode_frame(FRAME_RESPONSE, b"OK") == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert OK_FRAME == encode_response(b"OK")
    assert HEARTBEAT_FRAME == b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    assert CLOSE_WAIT_FRAME == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"
    assert encode_frame(FRAME_MESSAGE, b"") == b"\x00\x00\x00\x04\x00\x00\x00\x02"


def test_error_frame() -> None:
    frame = encode_error(ProtocolError("E_INVALID", "invalid command ASDF"))
    assert frame == struct.pack(">ii", 4 + 30, FRAME_ERROR) + b"E_INVALID invalid command ASDF"


# --- FrameParser ---------------------------------------------------------------------------------

def test_parser_three_ways() -> None:
    msg = encode_message(1, 1, b"0" * 16, b"body")
    stream = (OK_FRAME + HEARTBEAT_FRAME + encode_frame(FRAME_MESSAGE, msg)
              + encode_error(ProtocolError("E_FIN_FAILED", "FIN x failed")) + encode_frame(7, b""))
    assert parse3(stream) == [
        (FRAME_RESPONSE, b"OK"), (FRAME_RESPONSE, b"_heartbeat_"), (FRAME_MESSAGE, msg),
        (FRAME_ERROR, b"E_FIN_FAILED FIN x failed"), (7, b"")]


def test_parser_every_split_point() -> None:
    stream = OK_FRAME + encode_frame(FRAME_MESSAGE, b"m" * 40) + HEARTBEAT_FRAME
    expected = [(0, b"OK"), (2, b"m" * 40), (0, b"_heartbeat_")]
    for cut in range(len(stream) + 1):
        parser = FrameParser()
        assert parser.feed(stream[:cut]) + parser.feed(stream[cut:]) == expected
        assert parser.buffered == 0


def test_parser_holds_partial_frames() -> None:
    parser = FrameParser()
    assert parser.feed(OK_FRAME[:7]) == []
    assert parser.buffered == 7
    assert parser.feed(OK_FRAME[7:]) == [(0, b"OK")]
    assert parser.buffered == 0


def test_parser_limit_keeps_the_rest_for_a_change_of_encoding() -> None:
    parser = FrameParser()
    rest = b"\xff\x06\x00\x00sNaPpY"  # e.g. the start of a snappy stream after IDENTIFY's reply
    assert parser.feed(HEARTBEAT_FRAME + OK_FRAME + rest, limit=1) == [(0, b"_heartbeat_")]
    assert parser.feed(b"", limit=1) == [(0, b"OK")]
    assert parser.take_buffered() == rest
    assert parser.buffered == 0 and parser.feed(OK_FRAME) == [(0, b"OK")]


@pytest.mark.parametrize("bad", [-1, 0, 3, 101, -(2**31)])
def test_bad_frame_sizes(bad: int) -> None:
    data = struct.pack(">i", bad)  # the 4 size bytes are enough to know
    assert parse3(data, max_frame_size=100) == [("ERROR", "E_BAD_BODY", f"invalid frame size {bad}")]
    assert "E_BAD_BODY" in CODES


def test_frames_before_a_bad_one_are_kept_and_nothing_after() -> None:
    parser = FrameParser()
    out = parser.feed(OK_FRAME + struct.pack(">i", 2) + OK_FRAME)
    assert norm(out) == [(0, b"OK"), ("ERROR", "E_BAD_BODY", "invalid frame size 2")]
    assert parser.failed and parser.buffered == 0
    assert parser.feed(OK_FRAME) == []


def test_size_4_is_an_empty_frame_and_max_is_inclusive() -> None:
    assert parse3(encode_frame(0, b"")) == [(0, b"")]
    assert parse3(encode_frame(0, b"x" * 96), max_frame_size=100) == [(0, b"x" * 96)]


# --- messages ------------------------------------------------------------------------------------

def test_message_layout() -> None:
    record = encode_message(0x0102030405060708, 0x0A0B, b"0123456789abcdef", b"hi")
    assert record == (b"\x01\x02\x03\x04\x05\x06\x07\x08" + b"\x0a\x0b" + b"0123456789abcdef" + b"hi")
    assert HEADER_SIZE == 26
    assert decode_message(record) == (0x0102030405060708, 0x0A0B, b"0123456789abcdef", b"hi")
    assert decode_message(memoryview(record)) == decode_message(record)
    assert message_id(record) == b"0123456789abcdef"
    assert message_attempts(record) == 0x0A0B


def test_message_round_trip_empty_body_and_negative_timestamp() -> None:
    record = encode_message(-5, 0, b"f" * 16, b"")
    assert len(record) == 26
    assert decode_message(record) == (-5, 0, b"f" * 16, b"")


def test_decode_short_message() -> None:
    with pytest.raises(ValueError, match="too short"):
        decode_message(b"\x00" * 25)


def test_with_attempts() -> None:
    record = encode_message(123, 1, b"a" * 16, b"body")
    again = with_attempts(record, 2)
    assert decode_message(again) == (123, 2, b"a" * 16, b"body")
    assert decode_message(record)[1] == 1  # the original is untouched
    assert message_attempts(with_attempts(record, 65535)) == 65535


def test_with_attempts_wraps_like_a_uint16() -> None:
    # nsqd's Attempts is a uint16 incremented on every delivery: 65535 + 1 is 0.
    record = encode_message(1, 65535, b"a" * 16, b"x")
    assert message_attempts(with_attempts(record, message_attempts(record) + 1)) == 0


# --- ids -------------------------------------------------------------------------------------------

class FakeClock:
    """Unix nanoseconds that only move when told to."""

    def __init__(self, ns: int = TWEPOCH_NS + (10**12 << 20)) -> None:
        self.ns = ns

    def __call__(self) -> int:
        return self.ns

    def tick(self, n: int = 1) -> None:
        self.ns += n << 20


def fields(msg_id: bytes, shard_bits: int = 0) -> tuple[int, int, int, int]:
    """(tick, node, seq, shard) of an id."""
    value = int(msg_id, 16)
    low = value & 0xFFF
    return value >> 22, (value >> 12) & 0x3FF, low >> shard_bits, low & ((1 << shard_bits) - 1)


def test_id_layout() -> None:
    clock = FakeClock(TWEPOCH_NS + (7 << 20))
    ids = IdFactory(5, clock=clock).next_ids(3)
    assert ids == [b"%016x" % ((7 << 22) | (5 << 12) | seq) for seq in range(3)]
    assert all(len(i) == 16 and i == i.lower() for i in ids)


def test_ids_unique_and_increasing_across_many_batches() -> None:
    clock = FakeClock()
    factory = IdFactory(1023, clock=clock)
    seen: list[bytes] = []
    for batch in range(300):
        seen += factory.next_ids(1 + batch % 37)
        if batch % 3 == 0:
            clock.tick()
        seen.append(factory.next_id())
    values = [int(i, 16) for i in seen]
    assert values == sorted(values)
    assert len(set(values)) == len(values)
    assert {fields(i)[1] for i in seen} == {1023}


@pytest.mark.parametrize("shards", [1, 4])
def test_next_id_gives_the_same_ids_as_next_ids_of_one(shards: int) -> None:
    """``next_id`` has its own path (a single PUB's): the same ids, tick borrowing included."""
    one, many = FakeClock(), FakeClock()
    single = IdFactory(7, shards - 1, shards, clock=one)
    batch = IdFactory(7, shards - 1, shards, clock=many)
    got: list[bytes] = []
    want: list[bytes] = []
    for step in range(5000):  # more than a tick holds: borrows the next tick
        got.append(single.next_id())
        want.append(batch.next_ids(1)[0])
        if step in (100, 4900):
            one.tick()
            many.tick()
    assert got == want
    assert len(set(got)) == len(got)


@pytest.mark.parametrize("shards", [1, 4])
def test_a_batch_of_ids_is_the_ids_made_one_at_a_time(shards: int) -> None:
    """``next_ids`` hex-encodes a run of ids at once: the same ids ``next_id`` makes one by
    one, across a borrowed tick (5,000 > a tick's sequence space with 4 shards)."""
    batch = IdFactory(7, shards - 1, shards, clock=FakeClock()).next_ids(5000)
    single = IdFactory(7, shards - 1, shards, clock=FakeClock())
    assert batch == [single.next_id() for _ in range(5000)]


def test_ids_keep_increasing_when_the_clock_goes_back() -> None:
    clock = FakeClock()
    factory = IdFactory(1, clock=clock)
    first = factory.next_ids(10)
    clock.ns -= 10**9
    later = factory.next_ids(10)
    assert int(later[0], 16) > int(first[-1], 16)


def test_sequence_exhausted_borrows_the_next_tick() -> None:
    clock = FakeClock()
    factory = IdFactory(3, clock=clock)
    ids = factory.next_ids(4096 + 10)  # one tick holds 4096
    tick0 = fields(ids[0])[0]
    assert [fields(i)[0] for i in ids[:4096]] == [tick0] * 4096
    assert [fields(i)[2] for i in ids[:4096]] == list(range(4096))
    assert [fields(i)[0] for i in ids[4096:]] == [tick0 + 1] * 10
    assert [fields(i)[2] for i in ids[4096:]] == list(range(10))
    # the clock catches up with the borrowed tick: no id is reused
    clock.tick()
    more = factory.next_ids(5)
    assert [fields(i)[:3:2] for i in more] == [(tick0 + 1, s) for s in range(10, 15)]
    values = [int(i, 16) for i in ids + more]
    assert values == sorted(set(values))


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7, 8, 16, 64, 256])
def test_ids_unique_across_shards_of_one_node(shards: int) -> None:
    clock = FakeClock()
    factories = [IdFactory(42, shard, shards, clock=clock) for shard in range(shards)]
    bits = shard_bits_for(shards)
    per_tick = 4096 >> bits
    all_ids: list[bytes] = []
    for round_ in range(3):
        for shard, factory in enumerate(factories):
            ids = factory.next_ids(per_tick + 3)  # overflow into a borrowed tick too
            assert {fields(i, bits)[3] for i in ids} == {shard}
            assert {fields(i, bits)[1] for i in ids} == {42}
            values = [int(i, 16) for i in ids]
            assert values == sorted(set(values))
            all_ids += ids
        clock.tick(2 + round_)
    assert len(set(all_ids)) == len(all_ids)


def test_shard_bits() -> None:
    assert [shard_bits_for(n) for n in (1, 2, 3, 4, 5, 8, 9, 256)] == [0, 1, 2, 2, 3, 3, 4, 8]
    for bad in (0, -1, 257):
        with pytest.raises(ValueError):
            shard_bits_for(bad)


@pytest.mark.parametrize(("node", "shard", "shards"), [
    (-1, 0, 1), (1024, 0, 1), (0, 1, 1), (0, -1, 2), (0, 0, 0), (0, 0, 257)])
def test_id_factory_range_errors(node: int, shard: int, shards: int) -> None:
    with pytest.raises(ValueError):
        IdFactory(node, shard, shards)


def test_node_id_edges() -> None:
    clock = FakeClock()
    assert fields(IdFactory(0, clock=clock).next_id())[1] == 0
    assert fields(IdFactory(1023, clock=clock).next_id())[1] == 1023


def test_default_clock_is_real_time() -> None:
    a, b = IdFactory(9).next_ids(2)
    assert int(b, 16) > int(a, 16)


@pytest.mark.parametrize("shards", [1, 2, 256])
def test_next_records_are_prefix_id_body_with_the_ids_next_ids_makes(shards: int) -> None:
    prefix = HEADER.pack(123456789, 0, b"")[:10]
    bodies = [bytes([i & 0xFF]) * (i % 7) for i in range(4096 + 300)]  # crosses a tick's sequence
    records = IdFactory(9, shards - 1, shards, clock=FakeClock()).next_records(prefix, bodies)
    ids = IdFactory(9, shards - 1, shards, clock=FakeClock()).next_ids(len(bodies))
    assert records == [prefix + msg_id + body for msg_id, body in zip(ids, bodies)]
    assert [decode_message(r)[2] for r in records[:3]] == ids[:3]


def test_next_records_takes_any_bytes_like_body() -> None:
    prefix = HEADER.pack(1, 0, b"")[:10]
    records = IdFactory(1, clock=FakeClock()).next_records(prefix, [memoryview(b"abc"), bytearray(b"de")])
    ids = IdFactory(1, clock=FakeClock()).next_ids(2)
    assert records == [prefix + ids[0] + b"abc", prefix + ids[1] + b"de"]

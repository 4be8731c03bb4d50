"""The message encoding and message ids.

A message travels, and is stored, as one byte string::

    [8B int64 BE timestamp, ns][2B uint16 BE attempts][16B id, ASCII hex][body]

This is both the payload of a message frame and a disk-queue record, so a queued message is
kept as that ``bytes`` object from publish to delivery: no per-message Python object is made
until a message goes in flight.

Ids are 16 hex digits of a 64-bit number laid out as NSQ's (``ts << 22 | node << 12 | seq``,
``ts`` in units of 2^20 ns since 2010-11-04). To keep ids unique across the shards of one
node without coordination, the 12 sequence bits are split: the low ``shard_bits`` name the
shard, the rest count. When a shard's sequence runs out inside one tick it borrows the next
tick instead of waiting (NSQ sleeps 1 ms), so ids stay unique and increasing as long as the
long-run rate stays under the capacity: 4096 ids per ~1.05 ms per node, about 3.9 million a
second, divided among shards.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from pynsqd.compiled import compiled_twin
from pynsqd.wire import idrecords

_twin = compiled_twin("pynsqd.wire._idrecords")
_make_records = idrecords.make_records if _twin is None else _twin.make_records

HEADER = struct.Struct(">qH16s")
TS_ATTEMPTS = struct.Struct(">qH")  # the header before the id: a new message's prefix
HEADER_SIZE = HEADER.size  # 26
ATTEMPTS = struct.Struct(">H")
ATTEMPTS_OFFSET = 8
ID_OFFSET = 10
BODY_OFFSET = 26
MIN_MESSAGE_SIZE = HEADER_SIZE

_TWEPOCH = 1288834974288  # NSQ's epoch, in 2^20-ns ticks since the Unix epoch
_TS_SHIFT = 22
_NODE_SHIFT = 12
_SEQ_BITS = 12


def encode_message(timestamp_ns: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """Encode one message (frame payload / disk record)."""
    return HEADER.pack(timestamp_ns, attempts, msg_id) + body


def decode_message(data: bytes | memoryview) -> tuple[int, int, bytes, bytes]:
    """Decode a message into ``(timestamp_ns, attempts, id, body)``.

    Raises ``ValueError`` when ``data`` is shorter than the 26-byte header.
    """
    if len(data) < HEADER_SIZE:
        raise ValueError(f"message too short ({len(data)} < {HEADER_SIZE} bytes)")
    ts, attempts, msg_id = HEADER.unpack_from(data)
    return ts, attempts, msg_id, bytes(data[BODY_OFFSET:])


def message_id(record: bytes) -> bytes:
    """The 16-byte id of an encoded message."""
    return record[ID_OFFSET:BODY_OFFSET]


def message_attempts(record: bytes) -> int:
    """The attempts counter of an encoded message."""
    return int(ATTEMPTS.unpack_from(record, ATTEMPTS_OFFSET)[0])


def with_attempts(record: bytes, attempts: int) -> bytes:
    """A copy of ``record`` with its attempts counter replaced.

    The counter is a uint16 and wraps past 65535 as nsqd's ``msg.Attempts++`` does, so a
    message redelivered that often keeps flowing instead of failing to encode.
    """
    return record[:ATTEMPTS_OFFSET] + ATTEMPTS.pack(attempts & 0xFFFF) + record[ID_OFFSET:]


def shard_bits_for(shards: int) -> int:
    """How many sequence bits name the shard when a node runs ``shards`` shards."""
    if not 1 <= shards <= 1 << 8:
        raise ValueError(f"shard count {shards} out of range 1-256")
    return (shards - 1).bit_length()


class IdFactory:
    """Makes message ids unique within a node, for one shard of it.

    Call ``next_records(prefix, bodies)`` for a batch's messages (MPUB), ``next_ids(n)`` for ids
    alone or ``next_id()`` for one. ``clock`` returns
    Unix time in nanoseconds (inject a fake one in tests). Raises ``ValueError`` for a node
    id outside [0,1024) or a shard outside [0,shards).
    """

    __slots__ = ("_clock", "_prefix", "_seq", "_seq_max", "_shard", "_shard_bits", "_tick")

    def __init__(self, node_id: int, shard: int = 0, shards: int = 1,
                 clock: Callable[[], int] = time.time_ns) -> None:
        if not 0 <= node_id < 1024:
            raise ValueError(f"node id {node_id} out of range [0,1024)")
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} out of range for {shards} shards")
        self._shard_bits = shard_bits_for(shards)
        self._prefix = node_id << _NODE_SHIFT
        self._shard = shard
        self._seq_max = 1 << (_SEQ_BITS - self._shard_bits)
        self._clock = clock
        self._tick = 0
        self._seq = 0

    def _now_tick(self) -> int:
        return (self._clock() >> 20) - _TWEPOCH

    def _ranges(self, count: int) -> list[tuple[int, int]]:
        """``count`` new ids as ranges ``(first id, how many)``, each counting up by
        ``1 << shard bits``: one range unless the tick's sequence runs out in between."""
        now = self._now_tick()
        if now > self._tick:
            self._tick, self._seq = now, 0
        out: list[tuple[int, int]] = []
        prefix, shard, shard_bits = self._prefix, self._shard, self._shard_bits
        while count:
            room = self._seq_max - self._seq
            if room <= 0:  # sequence exhausted inside this tick: borrow the next one
                self._tick += 1
                self._seq = 0
                room = self._seq_max
            take = min(room, count)
            # the sequence field is zero below it, so ``|`` is ``+``: the ids are a range
            out.append(((self._tick << _TS_SHIFT) | prefix | shard | (self._seq << shard_bits), take))
            self._seq += take
            count -= take
        return out

    def next_ids(self, count: int) -> list[bytes]:
        """``count`` new ids, increasing, as 16-byte ASCII hex."""
        return self.next_records(b"", [b""] * count)

    def next_records(self, prefix: bytes, bodies: list[bytes]) -> list[bytes]:
        """One message per body, ``prefix`` (its timestamp and attempts) + a new id + the
        body, the ids as ``next_ids`` makes them (``idrecords.make_records``, compiled
        where built)."""
        step = 1 << self._shard_bits
        ranges = self._ranges(len(bodies))
        if len(ranges) == 1:
            return _make_records(prefix, ranges[0][0], step, bodies)
        out: list[bytes] = []
        at = 0
        for first, take in ranges:
            out.extend(_make_records(prefix, first, step, bodies[at:at + take]))
            at += take
        return out

    def next_id(self) -> bytes:
        """One new id (``next_ids(1)[0]`` without its loop)."""
        return self.next_record(b"", b"")

    def next_record(self, prefix: bytes, body: bytes) -> bytes:
        """One message, ``next_records(prefix, [body])[0]`` without the range arithmetic:
        a single PUB's path."""
        now = self._now_tick()
        if now > self._tick:
            self._tick, self._seq = now, 0
        seq = self._seq
        if seq >= self._seq_max:
            return self.next_records(prefix, [body])[0]
        self._seq = seq + 1
        first = (self._tick << _TS_SHIFT) | self._prefix | self._shard | (seq << self._shard_bits)
        return _make_records(prefix, first, 1, (body,))[0]

"""A producer or consumer process for a ByteRing in a shared-memory segment (tests only).

``python -m tests.support.shm_worker produce NAME COUNT`` puts COUNT records of varying sizes, each
``[u64 index][u32 crc32 of payload][payload]``, spinning politely while the ring is full;
``consume NAME COUNT`` takes them (alternating ``take_many`` and ``peek_many``/``consume``),
checks order and checksums, and prints ``ok <count> <xor of crcs>``.
"""

from __future__ import annotations

import struct
import sys
import time
import zlib

from pynsqd.shm.ring import ByteRing
from pynsqd.shm.segment import Segment

HEAD = struct.Struct("<QI")


def payload(index: int) -> bytes:
    size = (index * 7919) % 700
    return (index.to_bytes(8, "little") * (size // 8 + 1))[:size]


def record(index: int) -> bytes:
    body = payload(index)
    return HEAD.pack(index, zlib.crc32(body)) + body


def produce(ring: ByteRing, count: int) -> None:
    index = 0
    while index < count:
        batch = [record(i) for i in range(index, min(count, index + 1 + index % 64))]
        while batch:
            n = ring.put_many(batch)
            index += n
            batch = batch[n:]
            if batch:
                time.sleep(0.0001)


def consume(ring: ByteRing, count: int) -> int:
    index = 0
    digest = 0
    while index < count:
        if index % 2:
            got = ring.take_many(97)
        else:
            got = ring.peek_many(131)
            ring.consume(len(got))
        if not got:
            time.sleep(0.0001)
        for rec in got:
            number, crc = HEAD.unpack_from(rec)
            body = rec[HEAD.size:]
            if number != index or zlib.crc32(body) != crc or body != payload(index):
                raise SystemExit(f"record {index}: got index {number}, crc ok={zlib.crc32(body) == crc}")
            digest ^= crc
            index += 1
    return digest


def main() -> None:
    role, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    segment = Segment.open(name, 0, create=False)
    ring = ByteRing(segment.buf, init=False)
    if role == "produce":
        produce(ring, count)
        print("ok", count, flush=True)
    else:
        print("ok", count, consume(ring, count), flush=True)
    ring.close()
    segment.close()


if __name__ == "__main__":
    main()

"""Record frames as a ``ByteRing`` stores them: a run built once, or checked once, then copied.

Theory of operation
-------------------
A ring record is framed as ``[u32 length][u32 length ^ 0xFFFFFFFF][payload][pad to 8]``.
A ``Frames`` is a run of whole frames in one ``bytes`` whose payloads all start with the
same ``lead`` (for a ``MessageLog``: the 16-byte READY state header) followed by a record.
``ByteRing.put_frames`` appends a run with ONE slice copy and one index store, so a run can
be framed once and appended to several rings (every channel's log) as it is.

Two ways to get one:

* ``frame_records`` builds it from records (``ByteRing.put_many``'s fast path, and the
  producer side of a cross-shard publish, which frames the batch once, as the owner's logs
  store it). Equal-size records — an MPUB of equal bodies, the common case — share one
  frame head, so the run is one ``bytes.join`` with pad + head as the separator: no Python
  object is made per record.
* ``check_frames`` adopts bytes another process wrote (a cross-shard ring record): every
  frame's length and its complement, the lead, the zero padding, a minimum payload size,
  the count, and that the run ends exactly where the bytes end are checked, else
  ``RingError`` — nothing but records ever differs from what ``frame_records`` writes, so
  nothing corrupt reaches a log. A run of equal frames is proven with strided slices (one
  C-level compare per byte of frame head, lead and pad, whatever the record count); any
  other run is checked by a Python walk, frame by frame.

A ``Frames`` is also a ``Sequence`` of its records (without frame or lead), decoded on first
use, so code that knows nothing about frames (a disk queue, a queue's slow path) sees the
records it always did; a run of equal frames is decoded with one slice per record at a fixed
stride, as a walk reading each frame head costs several times more.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import overload

FRAME = struct.Struct("<II")  # a record's frame head: its size, and size ^ WRAP
FRAME_SIZE = 8
WRAP = 0xFFFFFFFF
PADS = [b"\0" * n for n in range(8)]


class RingError(Exception):
    """The buffer is not a ring, or a record frame or index in it is corrupt."""


class Frames(Sequence[bytes]):
    """A run of frames ``data[start:end]`` (``len`` of them, the largest ``largest`` bytes
    with its head and pad), each payload ``lead`` + a record. Made by ``frame_records`` or
    ``check_frames`` only: ``ByteRing.put_frames`` trusts what they established."""

    __slots__ = ("_n", "_records", "data", "end", "equal", "largest", "lead", "start")

    def __init__(self, data: bytes, start: int, end: int, count: int, largest: int, lead: bytes,
                 records: Sequence[bytes] | None = None, equal: bool = False) -> None:
        self.data = data
        self.equal = equal  # every frame is ``largest`` bytes with the same head (same record size)
        self.start = start
        self.end = end
        self._n = count
        self.largest = largest
        self.lead = lead
        self._records = records

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        return self.records()[index]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.records())

    @property
    def decoded(self) -> bool:
        """True once ``records`` was needed (some queue could not take the run as it is)."""
        return self._records is not None

    def records(self) -> Sequence[bytes]:
        """The records (payloads without ``lead``), oldest first; decoded once."""
        if self._records is None:
            data = self.data
            skip = FRAME_SIZE + len(self.lead)
            if self.equal:  # one slice per record at a fixed stride: no header read per record
                n = FRAME.unpack_from(data, self.start)[0] - len(self.lead)
                self._records = [data[p:p + n] for p in range(self.start + skip, self.end, self.largest)]
                return self._records
            unpack = FRAME.unpack_from
            out = []
            pos = self.start
            end = self.end
            while pos < end:
                size = unpack(data, pos)[0]
                out.append(data[pos + skip:pos + FRAME_SIZE + size])
                pos += FRAME_SIZE + size + (-size & 7)
            self._records = out
        return self._records


def frame_records(records: Sequence[bytes], lead: bytes = b"", head: bytes = b"") -> Frames:
    """``records`` framed as a ring stores them (each payload ``lead`` + record), joined into
    one ``bytes`` behind ``head`` (the frames start at ``len(head)``)."""
    extra = len(lead)
    lens = list(map(len, records))
    low = min(lens, default=0)
    high = max(lens, default=0)
    largest = FRAME_SIZE + ((high + extra + 7) & ~7)
    if low == high:  # one C-level join with the pad and the next frame head as separator
        size = low + extra
        frame_head = FRAME.pack(size, size ^ WRAP) + lead
        pad = PADS[-size & 7]
        data = b"".join((head, frame_head, (pad + frame_head).join(records), pad)) if records else head
    else:
        heads: dict[int, tuple[bytes, bytes]] = {}
        for n in set(lens):
            size = n + extra
            heads[n] = (FRAME.pack(size, size ^ WRAP) + lead, PADS[-size & 7])
        pairs = [heads[n] for n in lens]
        parts = chain.from_iterable(zip([h for h, _ in pairs], records, [p for _, p in pairs]))
        data = b"".join(chain((head,), parts)) if head else b"".join(parts)
    return Frames(data, len(head), len(data), len(lens), largest, lead, records, equal=low == high)


def check_frames(data: bytes, start: int, count: int, lead: bytes = b"", min_size: int = 0) -> Frames:
    """Adopt ``data[start:]`` as ``count`` frames whose payloads are ``lead`` + a record of at
    least ``min_size`` bytes, ending exactly at the end of ``data``; ``RingError`` if not."""
    end = len(data)
    if count <= 0 or (end - start) % 8 or end - start < count * FRAME_SIZE:
        raise RingError(f"{end - start} bytes cannot hold {count} frames")
    least = len(lead) + min_size
    size, check = FRAME.unpack_from(data, start)
    frame = FRAME_SIZE + size + (-size & 7)
    if size ^ check == WRAP and size >= least and frame * count == end - start:
        # Equal frames: every head, lead and pad byte equals the first one's.
        first = data[start:start + FRAME_SIZE + len(lead)]
        fixed = [*range(len(first)), *range(FRAME_SIZE + size, frame)]
        if first[FRAME_SIZE:] == lead and not any(data[start + size + FRAME_SIZE:start + frame]) and all(
                data[start + k:end:frame] == data[start + k:start + k + 1] * count for k in fixed):
            return Frames(data, start, end, count, frame, lead, equal=True)
    unpack = FRAME.unpack_from
    skip = FRAME_SIZE + len(lead)
    pos = start
    seen = largest = 0
    while pos < end:
        size, check = unpack(data, pos)
        frame = FRAME_SIZE + size + (-size & 7)
        if size ^ check != WRAP or size < least or pos + frame > end:
            raise RingError(f"bad frame at {pos - start} (length {size})")
        if lead and data[pos + FRAME_SIZE:pos + skip] != lead:
            raise RingError(f"frame at {pos - start} does not start with its lead")
        if any(data[pos + FRAME_SIZE + size:pos + frame]):
            raise RingError(f"frame at {pos - start} is not padded with zeros")
        if frame > largest:
            largest = frame
        pos += frame
        seen += 1
    if seen != count:
        raise RingError(f"{seen} frames where {count} were announced")
    return Frames(data, start, end, count, largest, lead)

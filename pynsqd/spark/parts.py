"""Batch parts: how a micro-batch's messages travel from the driver's consumer to the executors.

Theory of operation
-------------------
The source's driver-side runner holds the NSQ connections (only it can FIN, and only after
Spark committed the batch), but any per-message work in that one process caps the stream at
what one core does. So the runner only *frames* what it received, as it received it: the
client's batch mode (``pynsqd.client.MessageBatch``) hands over runs of NSQ message frames,
undecoded, with their offsets, and a part is those runs back to back. The runner serves each
part from memory to the executor that asks for it (``server.py``); executors turn a part into
Arrow record batches with vectorised Arrow kernels — no Python loop per message on either side.

A part is::

    b"NSQPART1\\n"  [4B length, little-endian]  JSON header {"topic", "channel", "nsqd": [address, ...]}
    then per segment (a run of frames from one nsqd):
        [SEGMENT: 2B nsqd index, 4B count n, 4B base, 4B length L]  (little-endian)
        [(n + 1) x 4B offsets, little-endian]  frame i = data[offsets[i] - base : offsets[i + 1] - base]
        [L bytes of data: the n frames, as nsqd sent them]

A frame is ``[4B size][4B type][8B timestamp ns][2B attempts][16B id][body]`` (NSQ's message
frame, big-endian), so a body may hold any bytes, newlines included. The offsets are written
as the client's list holds them (``base`` is the first), so the driver never rebases them one
by one; executors subtract ``base`` in one Arrow kernel. ``encode`` returns the part as a list
of buffers whose frame data are views of the received bytes (nothing is copied until the
socket sends it). A bad part (not a part, truncated, offsets out of order or out of bounds, a
frame shorter than a message header) is a ``PartError``, never a crash of the Arrow kernels:
offsets are validated before use.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

MAGIC = b"NSQPART1\n"
HEADER = struct.Struct("<I")  # the JSON header's length
SEGMENT = struct.Struct("<HIII")
MIN_FRAME = 34  # frame header 8 + message header 26
ID_AT, TS_AT, ATTEMPTS_AT, BODY_AT = 18, 8, 16, 34  # field positions inside a frame

SCHEMA_DDL = "id string, attempts int, timestamp timestamp, body binary, nsqd string, topic string, channel string"
NAMES = ["id", "attempts", "timestamp", "body", "nsqd", "topic", "channel"]
ROWS_PER_ARROW_BATCH = 65536
_LITTLE = sys.byteorder == "little"

Segment = tuple[int, bytes, list[int]]  # (nsqd index, frames, offsets into frames: n + 1 of them)
RawSegment = tuple[int, int, memoryview, memoryview]  # decoded: (nsqd index, base, offsets bytes, frame bytes)


class PartError(Exception):
    """A part is missing, truncated, corrupt or not a part."""


def _le32(values: list[int]) -> bytes:
    out = array("I", values)
    if out.itemsize != 4:  # pragma: no cover - every platform CPython runs on has a 4-byte "I"
        out = array("L", values)
    if not _LITTLE:  # pragma: no cover
        out.byteswap()
    return out.tobytes()


def encode(topic: str, channel: str, nsqds: Sequence[str], segments: Sequence[Segment]) -> list[bytes | memoryview]:
    """The part holding ``segments``, as buffers to send back to back (frames are not copied)."""
    header = json.dumps({"topic": topic, "channel": channel, "nsqd": list(nsqds)}).encode()
    parts: list[bytes | memoryview] = [MAGIC + HEADER.pack(len(header)) + header]
    for index, frames, offsets in segments:
        n = len(offsets) - 1
        if n <= 0:
            continue
        base, end = offsets[0], offsets[-1]
        parts += [SEGMENT.pack(index, n, base, end - base) + _le32(offsets), memoryview(frames)[base:end]]
    return parts


def decode(name: str, data: bytes | bytearray | memoryview) -> tuple[dict[str, Any], list[RawSegment]]:
    """A part's header and segments; ``name`` says which part in errors."""
    view = memoryview(data)
    size = len(view)
    if view[:len(MAGIC)] != MAGIC or size < len(MAGIC) + HEADER.size:
        raise PartError(f"{name} is not a batch part")
    (length,) = HEADER.unpack_from(view, len(MAGIC))
    pos = len(MAGIC) + HEADER.size + length
    if pos > size:
        raise PartError(f"{name}: truncated header")
    try:
        header = json.loads(bytes(view[len(MAGIC) + HEADER.size:pos]))
        nsqds = header["nsqd"]
        header["topic"], header["channel"]
    except (ValueError, KeyError, TypeError):
        raise PartError(f"{name}: bad header") from None
    segments = []
    while pos < size:
        if pos + SEGMENT.size > size:
            raise PartError(f"{name}: truncated segment header at byte {pos}")
        index, n, base, length = SEGMENT.unpack_from(view, pos)
        pos += SEGMENT.size
        offsets_end = pos + 4 * (n + 1)
        if n == 0 or index >= len(nsqds) or offsets_end + length > size:
            raise PartError(f"{name}: bad segment at byte {pos - SEGMENT.size}")
        segments.append((index, base, view[pos:offsets_end], view[offsets_end:offsets_end + length]))
        pos = offsets_end + length
    return header, segments


def _frames(name: str, segments: list[RawSegment]) -> Any:
    """Every segment's frames as one Arrow binary array, validated: C array arithmetic per
    segment, Arrow kernels over the whole part, nothing per frame in Python."""
    import pyarrow as pa
    import pyarrow.compute as pc

    starts = array("I")  # each frame's offset as the runner sent it (a segment's end left out)
    shift = array("q")  # per frame: where its segment lands in the joined data, minus its base
    pos = 0
    for _, base, offsets, data in segments:
        n = len(offsets) // 4 - 1
        segment = array("I")
        segment.frombytes(offsets)
        if not _LITTLE:  # pragma: no cover
            segment.byteswap()
        if segment[0] != base or segment[n] - base != len(data):
            raise PartError(f"{name}: a segment's offsets do not match its frames")
        starts.extend(segment[:n])
        shift.extend(array("q", [pos - base]) * n)
        pos += len(data)
    total = len(starts)
    rebased = pc.add(pa.Array.from_buffers(pa.uint32(), total, [None, pa.py_buffer(starts)]).cast(pa.int64()),
                     pa.Array.from_buffers(pa.int64(), total, [None, pa.py_buffer(shift)]))
    ends = pa.concat_arrays([rebased, pa.array([pos], pa.int64())]).cast(pa.int32())
    data = pa.py_buffer(b"".join(data for _, _, _, data in segments))
    frames = pa.Array.from_buffers(pa.binary(), total, [None, ends.buffers()[1], data])
    try:
        frames.validate(full=True)  # offsets increasing and inside the data
    except pa.ArrowInvalid as exc:
        raise PartError(f"{name}: bad segment offsets: {exc}") from None
    if pc.min(pc.binary_length(frames)).as_py() < MIN_FRAME:
        raise PartError(f"{name}: a frame is shorter than a message header")
    return frames


def _big_endian(column: Any, code: str, arrow_type: Any) -> Any:
    """Fixed-width big-endian integers (an array of equal-length binary slices) → Arrow ints."""
    import pyarrow as pa

    values = array(code)
    packed = column.cast(pa.binary(values.itemsize))  # fixed-size: one contiguous buffer
    values.frombytes(memoryview(packed.buffers()[1])[:len(column) * values.itemsize])
    if _LITTLE:
        values.byteswap()
    return pa.Array.from_buffers(arrow_type, len(column), [None, pa.py_buffer(values)])


def arrow_batches(name: str, data: bytes | bytearray | memoryview) -> Iterator[Any]:
    """Parse a part into ``pyarrow.RecordBatch``es in the source's schema (executor side);
    ``name`` names it in errors."""
    import pyarrow as pa

    header, segments = decode(name, data)
    if not segments:
        return
    try:
        table = _table(name, header, segments)
    except (pa.ArrowInvalid, OverflowError) as exc:
        raise PartError(f"{name}: corrupt batch part: {exc}") from None
    yield from table.to_batches(max_chunksize=ROWS_PER_ARROW_BATCH)


def _table(name: str, header: dict[str, Any], segments: list[RawSegment]) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    frames = _frames(name, segments)
    n = len(frames)
    # which nsqd: one index per row, repeated per segment by C array arithmetic, then a take
    # (values as Arrow scalars: a pyarrow call on a Python str looks for pandas first, ~1 ms)
    nsqds = pa.array(header["nsqd"], pa.string())
    if len(nsqds) == 1:
        where = pa.repeat(nsqds[0], n)
    else:
        indices = array("i")
        for index, _, offs, _ in segments:
            indices.extend(array("i", [index]) * (len(offs) // 4 - 1))
        where = pc.take(nsqds, pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(indices)]))
    stamps = pc.divide(_big_endian(pc.binary_slice(frames, TS_AT, ATTEMPTS_AT), "q", pa.int64()),
                       pa.scalar(1000, pa.int64()))
    return pa.Table.from_arrays([
        pc.binary_slice(frames, ID_AT, BODY_AT).cast(pa.string()),
        _big_endian(pc.binary_slice(frames, ATTEMPTS_AT, ID_AT), "H", pa.uint16()).cast(pa.int32()),
        stamps.cast(pa.timestamp("us", tz="UTC")),
        pc.binary_slice(frames, BODY_AT, 2**31 - 1),
        where,
        pa.repeat(pa.scalar(header["topic"], pa.string()), n),
        pa.repeat(pa.scalar(header["channel"], pa.string()), n),
    ], names=NAMES)

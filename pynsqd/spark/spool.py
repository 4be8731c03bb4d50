"""Spool files: how a micro-batch travels from the driver's consumer to the executors.

Theory of operation
-------------------
The source's driver-side runner holds the NSQ connections (only it can FIN, and only after
Spark committed the batch), but any per-message work in that one process caps the stream at
what one core does. So the runner only *writes*, and writes what it received as it received
it: the client's batch mode (``pynsqd.client.MessageBatch``) hands over runs of NSQ message
frames, undecoded, with their offsets, and a spool file is those runs back to back. Executors
turn a file into Arrow record batches with vectorised Arrow kernels — no Python loop per
message on either side.

A spool file is::

    b"NSQSPOOL2\\n"  JSON header line {"topic", "channel", "nsqd": [address, ...]}  b"\\n"
    then per segment (a run of frames from one nsqd):
        [SEGMENT: 2B nsqd index, 4B count n, 4B base, 4B length L]  (little-endian)
        [(n + 1) x 4B offsets, little-endian]  frame i = data[offsets[i] - base : offsets[i + 1] - base]
        [L bytes of data: the n frames, as nsqd sent them]

A frame is ``[4B size][4B type][8B timestamp ns][2B attempts][16B id][body]`` (NSQ's message
frame, big-endian), so a body may hold any bytes, newlines included. The offsets are written
as the client's list holds them (``base`` is the first), so the driver never rebases them one
by one; executors subtract ``base`` in one Arrow kernel. Files are written to a temporary name
and renamed into place, so a reader sees a whole file or none; a file for a sequence number
that is reused after a restart is simply replaced. A bad file (not a spool file, truncated,
offsets out of order or out of bounds, a frame shorter than a message header) is a
``SpoolError``, never a crash of the Arrow kernels: offsets are validated before use.

Each runner spools into a directory of its own (``runner_dir``), which holds a lock file the
runner keeps ``flock``ed for its whole life; the kernel drops the lock when the process
dies, kill -9 included. A new runner removes the directories whose lock nobody holds: their
runner is gone, and a restarted query never reads a dead runner's files (the batch is
re-planned empty, nsqd redelivers). A directory without a lock file is left alone. The new
directory is made under a dot-name, locked, then renamed into place, so no scan can find it
unlocked.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import struct
import sys
import uuid
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

MAGIC = b"NSQSPOOL2\n"
SEGMENT = struct.Struct("<HIII")
MIN_FRAME = 34  # frame header 8 + message header 26
ID_AT, TS_AT, ATTEMPTS_AT, BODY_AT = 18, 8, 16, 34  # field positions inside a frame

SCHEMA_DDL = "id string, attempts int, timestamp timestamp, body binary, nsqd string, topic string, channel string"
NAMES = ["id", "attempts", "timestamp", "body", "nsqd", "topic", "channel"]
ROWS_PER_ARROW_BATCH = 65536
_LITTLE = sys.byteorder == "little"

Segment = tuple[int, bytes, list[int]]  # (nsqd index, frames, offsets into frames: n + 1 of them)


class SpoolError(Exception):
    """A spool file is missing, truncated, corrupt or not a spool file."""


def _le32(values: list[int]) -> bytes:
    out = array("I", values)
    if out.itemsize != 4:  # pragma: no cover - every platform CPython runs on has a 4-byte "I"
        out = array("L", values)
    if not _LITTLE:  # pragma: no cover
        out.byteswap()
    return out.tobytes()


RUNNER_LOCK = ".runner.lock"
_runner_locks: dict[str, int] = {}  # this process's spool directories -> their locked fd


def runner_dir(spool_dir: str, prefix: str) -> str:
    """A new spool directory ``<spool_dir>/<prefix>.<random>`` owned by this process (see the
    module doc); first removes the directories of runners that are gone."""
    os.makedirs(spool_dir, exist_ok=True)
    for name in os.listdir(spool_dir):
        path = os.path.join(spool_dir, name)
        if name.startswith(".") or path in _runner_locks:
            continue
        try:
            fd = os.open(os.path.join(path, RUNNER_LOCK), os.O_RDONLY)
        except OSError:  # not a runner's directory (or already removed)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path, ignore_errors=True)  # nobody held it: its runner is dead
        except OSError:
            pass  # its runner is alive
        finally:
            os.close(fd)
    final = os.path.join(spool_dir, f"{prefix}.{uuid.uuid4().hex[:12]}")
    new = os.path.join(spool_dir, f".{os.path.basename(final)}.new")
    os.makedirs(new)
    fd = os.open(os.path.join(new, RUNNER_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(new, final)
    _runner_locks[final] = fd
    return final


def write_spool(path: str, topic: str, channel: str, nsqds: Sequence[str], segments: Sequence[Segment]) -> int:
    """Write ``segments`` to ``path`` atomically; return the number of messages written."""
    header = json.dumps({"topic": topic, "channel": channel, "nsqd": list(nsqds)}).encode()
    parts: list[bytes | memoryview] = [MAGIC, header, b"\n"]
    count = 0
    for index, frames, offsets in segments:
        n = len(offsets) - 1
        if n <= 0:
            continue
        base, end = offsets[0], offsets[-1]
        parts += [SEGMENT.pack(index, n, base, end - base), _le32(offsets), memoryview(frames)[base:end]]
        count += n
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.writelines(parts)
    os.replace(tmp, path)
    return count


def read_spool(path: str) -> tuple[dict[str, Any], list[tuple[int, int, memoryview, memoryview]]]:
    """A spool file's header and segments ``(nsqd index, base, offsets bytes, frame bytes)``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SpoolError(f"spool file {path} is missing: executors must see the driver's spoolDir") from None
    if not data.startswith(MAGIC):
        raise SpoolError(f"{path} is not a spool file")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise SpoolError(f"{path}: truncated header")
    try:
        header = json.loads(data[len(MAGIC):end])
        nsqds = header["nsqd"]
        header["topic"], header["channel"]
    except (ValueError, KeyError, TypeError):
        raise SpoolError(f"{path}: bad header") from None
    view = memoryview(data)
    segments = []
    pos, size = end + 1, len(data)
    while pos < size:
        if pos + SEGMENT.size > size:
            raise SpoolError(f"{path}: truncated segment header at byte {pos}")
        index, n, base, length = SEGMENT.unpack_from(data, pos)
        pos += SEGMENT.size
        offsets_end = pos + 4 * (n + 1)
        if n == 0 or index >= len(nsqds) or offsets_end + length > size:
            raise SpoolError(f"{path}: bad segment at byte {pos - SEGMENT.size}")
        segments.append((index, base, view[pos:offsets_end], view[offsets_end:offsets_end + length]))
        pos = offsets_end + length
    return header, segments


def _frames_array(path: str, base: int, offsets: memoryview, frames: memoryview) -> Any:
    """One segment as an Arrow binary array of whole frames, validated."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(offsets) // 4 - 1
    offs = pa.Array.from_buffers(pa.uint32(), n + 1, [None, pa.py_buffer(offsets)])
    if offs[0].as_py() != base:
        raise SpoolError(f"{path}: segment offsets do not start at their base")
    rebased = pc.subtract(offs, pa.scalar(base, pa.uint32())).cast(pa.int32())
    arr = pa.Array.from_buffers(pa.binary(), n, [None, rebased.buffers()[1], pa.py_buffer(frames)])
    try:
        arr.validate(full=True)  # offsets increasing and inside the data
    except pa.ArrowInvalid as exc:
        raise SpoolError(f"{path}: bad segment offsets: {exc}") from None
    if rebased[n].as_py() != len(frames) or pc.min(pc.binary_length(arr)).as_py() < MIN_FRAME:
        raise SpoolError(f"{path}: a segment's frames do not match its offsets")
    return arr


def _big_endian(column: Any, code: str, arrow_type: Any) -> Any:
    """Fixed-width big-endian integers (an array of equal-length binary slices) → Arrow ints."""
    import pyarrow as pa

    values = array(code)
    packed = column.cast(pa.binary(values.itemsize))  # fixed-size: one contiguous buffer
    values.frombytes(memoryview(packed.buffers()[1])[:len(column) * values.itemsize])
    if _LITTLE:
        values.byteswap()
    return pa.Array.from_buffers(arrow_type, len(column), [None, pa.py_buffer(values)])


def arrow_batches(path: str) -> Iterator[Any]:
    """Parse a spool file into ``pyarrow.RecordBatch``es in the source's schema (executor side)."""
    import pyarrow as pa

    header, segments = read_spool(path)
    if not segments:
        return
    try:
        table = _table(path, header, segments)
    except (pa.ArrowInvalid, OverflowError) as exc:
        raise SpoolError(f"{path}: corrupt spool file: {exc}") from None
    yield from table.to_batches(max_chunksize=ROWS_PER_ARROW_BATCH)


def _table(path: str, header: dict[str, Any], segments: list[tuple[int, int, memoryview, memoryview]]) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    frames = pa.concat_arrays([_frames_array(path, base, offs, data) for _, base, offs, data in segments])
    nsqds: list[str] = header["nsqd"]
    where = pa.concat_arrays([pa.repeat(nsqds[index], len(offs) // 4 - 1).cast(pa.string())
                              for index, _, offs, _ in segments])
    n = len(frames)
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

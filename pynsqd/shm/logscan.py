"""The per-record loops of a ``MessageLog``, in pure Python: finding records in a state,
delivering them (state, attempts, NSQ frames, ids), releasing finished ones at the front, and
recovering a log a previous process left, a bounded run of records at a time (states, then
message ids); and appending one record (``put_one``, ``shm/ring.py``'s: a single PUB's
message). ``live_records`` (the log's live records at exit) shares ``recover_run``'s walk
and has no twin.

``buf`` is the log's whole buffer (ring header included), ``cap`` its record-area size,
``read``/``write`` the ring's indices; positions are offsets in the record area of a
record's state byte (just past its frame head). ``pynsqd.shm._logscan`` is the compiled
twin of this module (same functions but ``live_records``, same results byte for byte);
``pynsqd.shm.kernels`` picks one. The record layout is ``shm/log.py``'s.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Container

from pynsqd.shm.frames import FRAME, FRAME_SIZE, WRAP, RingError
from pynsqd.shm.ring import HEADER_SIZE, put_one

__all__ = ["deliver_ready", "deliver_run", "find", "frame_at", "live_ids", "put_one", "recover_run", "release_front"]

READY = 1
IN_FLIGHT = 2
DEFERRED = 3
DONE = 4
STATE_SIZE = 16
ATTEMPTS_AT = STATE_SIZE + 8  # offset of the message's attempts field within a record
ID_AT = 10  # offset of the message id within a message

_ATTEMPTS = struct.Struct(">H")
DUE = struct.Struct("<Q")  # a record's due time (wall-clock ns), 8 bytes into its state
_WIRE_HEADER = struct.Struct(">ii")  # an NSQ frame's size and type (2: message)

Runs = list[tuple[list[int], list[int]]]


def frame_at(buf: memoryview, cap: int, read: int) -> tuple[int, int, int]:
    """The record at index ``read`` (< write), past a wrap marker: (index, area pos, size)."""
    pos = read % cap
    size, check = FRAME.unpack_from(buf, HEADER_SIZE + pos)
    if size == WRAP and check == 0:
        read += cap - pos
        pos = 0
        size, check = FRAME.unpack_from(buf, HEADER_SIZE)
    if size ^ check != WRAP or size < STATE_SIZE:
        raise RingError(f"corrupt record frame at {pos} (length {size})")
    return read, pos, size


def find(buf: memoryview, cap: int, read: int, write: int, cursor: int, max_count: int,
         want: int) -> tuple[Runs, int]:
    """Records in state ``want`` from index ``cursor`` on, at most ``max_count``:
    ([(starts, ends)] per contiguous run (a wrap starts a new one), cursor). A record's
    start is its position (its state byte), its end is just past its message. The returned
    cursor is just past the last record looked at. ``RingError`` if a frame is corrupt."""
    if cursor < read:
        cursor = read
    unpack = FRAME.unpack_from
    runs: Runs = []
    found = 0
    while cursor < write and found < max_count:
        pos = start = cursor % cap
        end = pos + min(write - cursor, cap - pos)
        starts: list[int] = []
        ends: list[int] = []
        left = max_count - found
        while pos < end and len(starts) < left:
            size, check = unpack(buf, HEADER_SIZE + pos)
            if size ^ check != WRAP:
                raise RingError(f"corrupt record frame at {pos} (length {size})")
            if size == WRAP:
                pos = cap
                break
            frame = FRAME_SIZE + size + (-size & 7)
            if pos + frame > end or size < STATE_SIZE:
                raise RingError(f"record length {size} at {pos} runs past the written data")
            if buf[HEADER_SIZE + pos + FRAME_SIZE] == want:
                starts.append(pos + FRAME_SIZE)
                ends.append(pos + FRAME_SIZE + size)
            pos += frame
        if starts:
            runs.append((starts, ends))
            found += len(starts)
        cursor += pos - start
    return runs, cursor


def deliver_run(buf: memoryview, starts: list[int], ends: list[int], out: bytearray, ids: list[bytes]) -> None:
    """Mark the records of one contiguous run (``starts``/``ends`` as ``find`` gives them)
    in flight with their attempts counted up, then append their NSQ message frames to
    ``out`` and their ids to ``ids``."""
    at = HEADER_SIZE + ATTEMPTS_AT + 1  # the low byte of the big-endian attempts field
    for pos in starts:
        low = buf[at + pos]
        if low < 255:
            buf[at + pos] = low + 1
        else:
            attempts = (_ATTEMPTS.unpack_from(buf, at + pos - 1)[0] + 1) & 0xFFFF
            _ATTEMPTS.pack_into(buf, at + pos - 1, attempts)
        buf[HEADER_SIZE + pos] = IN_FLIGHT
    first = starts[0]
    chunk = buf[HEADER_SIZE + first:HEADER_SIZE + ends[-1]].tobytes()
    header = _WIRE_HEADER.pack
    message_at = STATE_SIZE - first
    id_at = message_at + ID_AT
    for a, b in zip(starts, ends):
        out += header(b - a - STATE_SIZE + 4, 2)
        out += chunk[a + message_at:b - first]
        ids.append(chunk[a + id_at:a + id_at + 16])


def deliver_ready(buf: memoryview, cap: int, read: int, write: int, cursor: int, max_count: int,
                  out: bytearray, ids: list[bytes]) -> tuple[list[int], int]:
    """``find`` READY records, then ``deliver_run`` each run: (positions, cursor)."""
    runs, cursor = find(buf, cap, read, write, cursor, max_count, READY)
    positions: list[int] = []
    for starts, ends in runs:
        deliver_run(buf, starts, ends, out, ids)
        positions += starts
    return positions, cursor


def release_front(buf: memoryview, cap: int, read: int, write: int) -> tuple[int, int]:
    """Walk the DONE records at the front from index ``read``: (the read index past them,
    how many). ``RingError`` if a frame is corrupt."""
    unpack = FRAME.unpack_from
    released = 0
    while read < write:
        pos = read % cap
        size, check = unpack(buf, HEADER_SIZE + pos)
        if size == WRAP or size ^ check != WRAP or size < STATE_SIZE:
            read, pos, size = frame_at(buf, cap, read)  # a wrap marker (or corruption: raises)
        if buf[HEADER_SIZE + pos + FRAME_SIZE] != DONE:
            break
        read += FRAME_SIZE + size + (-size & 7)
        released += 1
    return read, released


def _record(buf: memoryview, cap: int, cursor: int, write: int) -> tuple[int, int]:
    """The frame at index ``cursor`` (< ``write``), checked: (area position, record size),
    or (-1, bytes to skip) for a wrap marker. ``RingError`` if it is corrupt."""
    pos = cursor % cap
    size, check = FRAME.unpack_from(buf, HEADER_SIZE + pos)
    if size ^ check != WRAP:
        raise RingError(f"corrupt record frame at {pos} (length {size})")
    if size == WRAP:
        if write - cursor < cap - pos:
            raise RingError(f"wrap marker at {pos} beyond the write index")
        return -1, cap - pos
    frame = FRAME_SIZE + size + (-size & 7)
    if frame > write - cursor or pos + frame > cap or size < STATE_SIZE:
        raise RingError(f"record length {size} at {pos} runs past the written data")
    return pos, size


def _walk(buf: memoryview, cap: int, read: int, write: int, cursor: int, max_count: int,
          visit: Callable[[int, int], None]) -> tuple[int, int]:
    """The one checked walk of ``recover_run`` and ``live_ids``: ``visit(pos, size)`` for
    each of up to ``max_count`` records from index ``cursor`` on (not before ``read``),
    wrap markers skipped. Returns (cursor past the last record walked, records walked);
    ``RingError`` (``_record``) if a frame is corrupt."""
    if cursor < read:
        cursor = read
    walked = 0
    while cursor < write and walked < max_count:
        pos, size = _record(buf, cap, cursor, write)
        if pos < 0:  # a wrap marker: ``size`` is the skip
            cursor += size
            continue
        visit(pos, size)
        cursor += FRAME_SIZE + size + (-size & 7)
        walked += 1
    return cursor, walked


def recover_run(buf: memoryview, cap: int, read: int, write: int, cursor: int,
                max_count: int) -> tuple[int, int, int, int, list[int]]:
    """Recover up to ``max_count`` records from index ``cursor`` on (after a restart): each
    IN_FLIGHT record becomes READY (attempts kept). Returns (cursor past the last record
    walked, records walked, ready ones, live ones (not DONE), positions of the DEFERRED
    ones). ``RingError`` if a frame is corrupt or a state unknown."""
    counts = [0, 0]  # ready, live
    deferred: list[int] = []

    def visit(pos: int, size: int) -> None:
        at = HEADER_SIZE + pos + FRAME_SIZE
        state = buf[at]
        if state == READY or state == IN_FLIGHT:
            buf[at] = READY
            counts[0] += 1
            counts[1] += 1
        elif state == DEFERRED:
            deferred.append(pos + FRAME_SIZE)
            counts[1] += 1
        elif state != DONE:
            raise RingError(f"record at {pos} has unknown state {state}")

    cursor, walked = _walk(buf, cap, read, write, cursor, max_count, visit)
    return cursor, walked, counts[0], counts[1], deferred


def live_ids(buf: memoryview, cap: int, read: int, write: int, cursor: int, max_count: int,
             among: Container[bytes] | None, out: set[bytes]) -> int:
    """Add to ``out`` the message ids of the live (not DONE) records among the next
    ``max_count`` from index ``cursor`` on (only those in ``among``, if given; a record too
    short to hold an id has none); returns the cursor past the last record walked. Frames
    are checked as ``recover_run`` checks them."""
    at_id = HEADER_SIZE + FRAME_SIZE + STATE_SIZE + ID_AT

    def visit(pos: int, size: int) -> None:
        if size >= STATE_SIZE + ID_AT + 16 and buf[HEADER_SIZE + pos + FRAME_SIZE] != DONE:
            msg_id = buf[at_id + pos:at_id + pos + 16].tobytes()
            if among is None or msg_id in among:
                out.add(msg_id)

    return _walk(buf, cap, read, write, cursor, max_count, visit)[0]


def live_records(buf: memoryview, cap: int, read: int, write: int) -> tuple[list[bytes], list[tuple[int, bytes]]]:
    """Every live record from ``read`` to ``write``, oldest first, without changing
    anything: (ready and in-flight messages, [(due, message)] of deferred ones); not
    twinned (it runs once, at exit). ``RingError`` if a frame is corrupt."""
    ready: list[bytes] = []
    deferred: list[tuple[int, bytes]] = []

    def visit(pos: int, size: int) -> None:
        at = HEADER_SIZE + pos + FRAME_SIZE
        state = buf[at]
        if state == DEFERRED:
            deferred.append((DUE.unpack_from(buf, at + 8)[0], buf[at + STATE_SIZE:at + size].tobytes()))
        elif state == READY or state == IN_FLIGHT:
            ready.append(buf[at + STATE_SIZE:at + size].tobytes())

    _walk(buf, cap, read, write, read, write - read, visit)
    return ready, deferred

"""A topic's or channel's messages in shared memory, each with its delivery state.

Theory of operation
-------------------
``MessageLog`` is a ``ByteRing`` whose records are ``[16-byte state header][message]``; the
header is ``[u8 state][7 pad][u64 due, wall-clock ns]`` and the message is NSQ's encoding,
whose attempts field is updated in place. States:

* ``READY``     waiting for delivery;
* ``IN_FLIGHT`` delivered, not yet FINed (attempts already counts the delivery);
* ``DEFERRED``  waiting until ``due`` (REQ with a delay, DPUB);
* ``DONE``      finished, or moved elsewhere; only waiting to be released.

The owner (one process) appends at the write end and changes states in place, so every
message that was accepted and not FINed is in the segment whatever the process does next.
Ready records are found by a *delivery cursor* that walks from the read index towards the
write index, skipping records in other states. ``release`` advances the ring's read index
past DONE records at the front (and hands whole pages it passed to ``discard``, so a drained
ring gives its memory back). A live record at the front blocks release; ``relocate_front``
copies it to the write end (the caller updates its references) and marks the old copy DONE.

After a crash, the log is walked once, in steps (``shm/logrecovery.py``, ``recover_run``):
in-flight records become ready again (attempts kept), deferred ones are reported with their
due time, done ones are skipped; meanwhile the owner delivers and releases only up to where
the walk has come (the ``end`` of ``walk``, ``deliver_ready`` and ``release``).
On a clean exit of a durable queue, ``live_records`` hands every live record to the owner,
which moves them to disk before the segment is removed (``pynsqd.shard.queue``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Container, Sequence

from pynsqd.shm import kernels, logscan
from pynsqd.shm.frames import FRAME, FRAME_SIZE, Frames, check_frames, frame_records
from pynsqd.shm.logscan import ATTEMPTS_AT, DEFERRED, DONE, DUE, ID_AT, IN_FLIGHT, READY, STATE_SIZE, frame_at
from pynsqd.shm.ring import HEADER_SIZE, ByteRing, Writable

__all__ = ["DEFERRED", "DONE", "IN_FLIGHT", "READY", "READY_HEADER", "STATE_SIZE", "MessageLog", "check_ready",
           "frame_ready", "state_header"]

_ATTEMPTS = struct.Struct(">H")
MESSAGE_HEADER = 26  # NSQ's message header: timestamp, attempts, id
_TIMESTAMP = struct.Struct(">q")
READY_HEADER = bytes([READY]) + bytes(STATE_SIZE - 1)

Discard = Callable[[int, int], None]


def state_header(state: int, due: int = 0) -> bytes:
    return bytes([state]) + bytes(7) + DUE.pack(due)


def frame_ready(messages: Sequence[bytes], head: bytes = b"") -> Frames:
    """``messages`` as READY records exactly as ``append_ready`` writes them, behind ``head``
    (appended to any log with ``put_frames``)."""
    return frame_records(messages, READY_HEADER, head)


def check_ready(data: bytes, start: int, count: int) -> Frames:
    """Adopt ``data[start:]`` (written by another process) as ``count`` READY records of whole
    messages; ``RingError`` if it is anything else, so it can never corrupt a log."""
    return check_frames(data, start, count, READY_HEADER, MESSAGE_HEADER)


class MessageLog(ByteRing):
    """Messages with delivery states over a ring buffer (one owner process)."""

    __slots__ = ("_discard", "_discarded", "states")

    def __init__(self, buf: Writable, *, init: bool, discard: Discard | None = None) -> None:
        super().__init__(buf, init=init)
        self.states = self._buf[HEADER_SIZE:]  # states[pos] is the state byte of a record
        self._discard = discard
        self._discarded = self._words[16]  # read index up to which pages were discarded

    @property
    def read_index(self) -> int:
        return int(self._words[16])

    @property
    def write_index(self) -> int:
        return int(self._words[8])

    @property
    def max_frame(self) -> int:
        return self._max_frame

    def mark(self) -> tuple[int, int]:
        """The write end now, for ``rollback``."""
        return int(self._words[8]), int(self._words[9])

    def rollback(self, mark: tuple[int, int]) -> None:
        """Drop what was appended since ``mark`` (owner only; nobody has read it yet)."""
        self._words[9] = mark[1]
        self._words[8] = mark[0]

    # -- appending -----------------------------------------------------------------------

    def append_ready(self, messages: Sequence[bytes]) -> int:
        """Append as many ready messages as fit; return how many. (One message, as an HTTP
        ``/pub`` or a TCP ``PUB`` brings, takes ``put``'s single-record path.)"""
        if len(messages) == 1:
            return 1 if self.put(READY_HEADER + messages[0]) else 0
        return self.put_many(messages, READY_HEADER)

    def put_ready(self, message: bytes) -> bool:
        """Append one ready message if it fits now before the end of the area; False if
        not (``append_ready`` also wraps)."""
        return kernels.put_one(self._buf, self._words, self._cap, self._max_frame, READY_HEADER, message)

    def append(self, message: bytes, state: int, due: int = 0) -> int | None:
        """Append one message in ``state``; its position, or None when it does not fit."""
        lead = state_header(state, due)
        if not kernels.put_one(self._buf, self._words, self._cap, self._max_frame, lead, message) and not \
                self.put_many((message,), lead):
            return None
        size = STATE_SIZE + len(message)
        return (self.write_index - (size + (-size & 7))) % self._cap

    # -- in place ------------------------------------------------------------------------

    def set_state(self, pos: int, state: int) -> None:
        self._buf[HEADER_SIZE + pos] = state

    def set_deferred(self, pos: int, due: int) -> None:
        DUE.pack_into(self._buf, HEADER_SIZE + pos + 8, due)
        self._buf[HEADER_SIZE + pos] = DEFERRED

    def deliver(self, pos: int, attempts: int) -> None:
        """Mark in flight with ``attempts`` (this delivery included)."""
        buf = self._buf
        _ATTEMPTS.pack_into(buf, HEADER_SIZE + pos + ATTEMPTS_AT, attempts)
        buf[HEADER_SIZE + pos] = IN_FLIGHT

    def message_at(self, pos: int) -> tuple[int, int, bytes]:
        """(state, due, message) of the record at ``pos``."""
        size = FRAME.unpack_from(self._buf, HEADER_SIZE + pos - FRAME_SIZE)[0]
        record = self._buf[HEADER_SIZE + pos:HEADER_SIZE + pos + size].tobytes()
        return record[0], DUE.unpack_from(record, 8)[0], record[STATE_SIZE:]

    # -- walking -------------------------------------------------------------------------

    def find(self, cursor: int, max_count: int, want: int = READY, end: int | None = None,
             ) -> tuple[list[tuple[list[int], list[int]]], int]:
        """Records in state ``want`` from index ``cursor`` on (up to ``end``, the write index
        unless given), at most ``max_count``: ([(starts, ends)] per contiguous run (a wrap
        starts a new one), cursor). A record's start is its position (its state byte), its
        end is just past its message. The returned cursor is just past the last record
        looked at. ``RingError`` if a frame is corrupt."""
        return kernels.find(self._buf, self._cap, self.read_index, self.write_index if end is None else end,
                            cursor, max_count, want)

    def walk(self, cursor: int, max_count: int, want: int = READY, end: int | None = None,
             ) -> tuple[list[int], list[bytes], int]:
        """Records in state ``want`` from index ``cursor`` on (up to ``end``, if given):
        (positions, messages, cursor).

        At most ``max_count``; the returned cursor is just past the last record looked at.
        """
        runs, cursor = self.find(cursor, max_count, want, end)
        buf = self._buf
        positions: list[int] = []
        messages: list[bytes] = []
        for starts, ends in runs:
            first = starts[0]
            chunk = buf[HEADER_SIZE + first:HEADER_SIZE + ends[-1]].tobytes()
            messages += [chunk[a - first + STATE_SIZE:b - first] for a, b in zip(starts, ends)]
            positions += starts
        return positions, messages, cursor

    def deliver_ready(self, cursor: int, max_count: int, out: bytearray, ids: list[bytes],
                      end: int | None = None) -> tuple[list[int], int]:
        """Deliver up to ``max_count`` ready records from ``cursor`` on (up to ``end``, if
        given), in one pass: each becomes IN_FLIGHT with its attempts counted up in place,
        its NSQ message frame is appended to ``out`` (attempts included) and its id to
        ``ids``. Returns (positions, cursor)."""
        return kernels.deliver_ready(self._buf, self._cap, self.read_index, self.write_index if end is None else end,
                                     cursor, max_count, out, ids)

    def deliver_at(self, positions: Sequence[int], out: bytearray, ids: list[bytes]) -> None:
        """``deliver_ready`` for known positions of READY records (requeued in place)."""
        buf = self._buf
        for pos in positions:
            size = FRAME.unpack_from(buf, HEADER_SIZE + pos - FRAME_SIZE)[0]
            kernels.deliver_run(buf, [pos], [pos + size], out, ids)

    def id_at(self, pos: int) -> bytes:
        """The message id of the record at ``pos``."""
        at = HEADER_SIZE + pos + STATE_SIZE + ID_AT
        return self._buf[at:at + 16].tobytes()

    def timestamp_at(self, pos: int) -> int:
        """The publish time (ns) of the message at ``pos``."""
        return int(_TIMESTAMP.unpack_from(self._buf, HEADER_SIZE + pos + STATE_SIZE)[0])

    def _frame_at(self, read: int) -> tuple[int, int, int]:
        """The record at index ``read`` (< write), past a wrap marker: (index, area pos, size)."""
        return frame_at(self._buf, self._cap, read)

    def front(self) -> tuple[int, int, int] | None:
        """(position, state, frame bytes) of the oldest record, or None when empty."""
        read = self.read_index
        if read >= self.write_index:
            return None
        _, pos, size = self._frame_at(read)
        return pos + FRAME_SIZE, self._buf[HEADER_SIZE + pos + FRAME_SIZE], FRAME_SIZE + size + (-size & 7)

    def release(self, end: int | None = None) -> int:
        """Advance the read index past DONE records at the front (not past ``end``, if
        given); return bytes released."""
        start = self.read_index
        read, released = kernels.release_front(self._buf, self._cap, start, self.write_index if end is None else end)
        if read != start:
            self._advance(read, released)
            self._discard_pages(read)
        return read - start

    def _discard_pages(self, read: int) -> None:
        """Give back the pages released since the last discard, once there is 1 MiB of them."""
        if self._discard is None or read - self._discarded < (1 << 20):
            return
        cap = self._cap
        # never the area of live records: those are the last (write - read) bytes before write
        begin = max(self._discarded, self.write_index - cap)
        a, b = begin % cap, read % cap
        if read - begin >= cap:  # only when empty: the whole area
            self._discard(HEADER_SIZE, cap)
        elif a < b:
            self._discard(HEADER_SIZE + a, b - a)
        else:
            self._discard(HEADER_SIZE + a, cap - a)
            self._discard(HEADER_SIZE, b)
        self._discarded = read

    def close(self) -> None:
        self.states.release()
        super().close()

    def detach(self) -> None:
        self.states.release()
        super().detach()

    def relayout(self, buf: Writable, capacity: int, read: int, write: int) -> None:
        """``ByteRing.relayout``, with the state view of the new buffer."""
        super().relayout(buf, capacity, read, write)
        self.states = self._buf[HEADER_SIZE:]
        self._discarded = read

    def attach(self, buf: Writable) -> None:
        super().attach(buf)
        self.states = self._buf[HEADER_SIZE:]

    def reset(self) -> None:
        """Empty the log and give all its pages back."""
        super().reset()
        self._discarded = 0
        if self._discard is not None:
            self._discard(HEADER_SIZE, self._cap)

    # -- recovery ------------------------------------------------------------------------

    def recover_run(self, cursor: int, end: int, max_count: int) -> tuple[int, int, int, int, list[int]]:
        """After a restart, recover up to ``max_count`` records from index ``cursor`` to
        ``end``: in flight → ready. (cursor after them, records walked, ready ones, live ones,
        positions of deferred ones); ``RingError`` if a frame is corrupt. Driven in steps by
        ``shm/logrecovery.LogScan``."""
        return kernels.recover_run(self._buf, self._cap, self.read_index, end, cursor, max_count)

    def deferred_at(self, positions: Sequence[int]) -> list[tuple[int, int, bytes]]:
        """[(pos, due, message)] of the DEFERRED records at ``positions``."""
        out = []
        for pos in positions:
            _, due, message = self.message_at(pos)
            out.append((pos, due, message))
        return out

    def live_ids_run(self, cursor: int, max_count: int, among: Container[bytes] | None,
                     out: set[bytes]) -> int:
        """Add the ids of live (not DONE) records among the next ``max_count`` from index
        ``cursor`` to ``out`` (only those in ``among``, if given); the cursor after them.
        ``RingError`` if a frame is corrupt."""
        return kernels.live_ids(self._buf, self._cap, self.read_index, self.write_index, cursor, max_count,
                                among, out)

    def live_records(self) -> tuple[list[bytes], list[tuple[int, bytes]]]:
        """Every live record, oldest first, without changing anything: (ready and in-flight
        messages, [(due, message)] of deferred ones). ``RingError`` if a frame is corrupt."""
        return logscan.live_records(self._buf, self._cap, self.read_index, self.write_index)

    @staticmethod
    def frame_of(message_size: int) -> int:
        size = STATE_SIZE + message_size
        return FRAME_SIZE + size + (-size & 7)

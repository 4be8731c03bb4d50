"""A FIFO of variable-size byte records over one writable buffer (pure: no I/O, no clock).

Theory of operation
-------------------
The buffer starts with a 192-byte header and then ``capacity`` bytes of record area::

    0    magic "PYNSQRG1"           8 bytes
    8    version (u32), header size (u32)
    16   capacity (u64)             record-area bytes, a multiple of 8
    64   write index (u64)          producer-owned cache line
    72   records written (u64)
    128  read index (u64)           consumer-owned cache line
    136  records consumed (u64)
    144  consumer's note (u64)      what the consumer is in the middle of (0: nothing)

Both indices are monotonic byte counters; ``index % capacity`` is the position in the record
area, ``write - read`` the bytes in use, so full and empty never look alike. A record is
framed as ``[u32 length][u32 ~length][payload][pad to 8]``: the complement catches a
corrupt length before it is trusted. A record never straddles the end of the area: when the
next frame does not fit before the end, the producer writes a wrap marker (length
0xFFFFFFFF) and the frame goes to the start; the skipped tail counts as used until the
consumer passes it. A frame is therefore at most half the area, so any record of at most
``max_record_size`` fits once the ring is empty wherever the indices stand.

SPSC publication: the producer copies the frames in (one slice assignment per contiguous
run, at most two per batch), then stores the record count, then the write index. The
consumer reads the write index, copies records out, then stores the read index and then its
record count. Index stores are single aligned 8-byte writes (an item store into a native ``"Q"``
memoryview is one ``memcpy`` of 8 bytes, a single instruction on x86-64; ``struct`` with
an explicit byte order writes byte by byte and must not be used for them), and x86 does not reorder
stores with stores, so the other side never sees an index ahead of the bytes it covers. One
producer process and one consumer process may use a ring at a time.

The consumer's note is one word the consumer may store for itself in the ring, where it
outlives the process (``shard/inbound.py`` notes the batch it is applying); the ring never
reads it.

The counts serve ``__len__`` only (``written - consumed``, clamped at 0). A process killed
between its two stores leaves them one batch high, never low (each side stores its count on
the side that overstates what waits); a log's walk after a crash repairs them
(``shm/logrecovery.py``). Indices are checked
on every call: an index out of range or a frame that fails its check raises ``RingError``,
never garbage.

Speed: frames of a batch are joined into one ``bytes`` (``shm/frames.frame_records``: one
shared frame head for equal-size records) and copied with one slice assignment;
``put_frames`` appends such a run built or checked elsewhere as it is (a cross-shard batch
framed by its producer, appended to every channel's log). A take walks the frame headers
with ``struct.unpack_from``, copies the covered bytes once and slices the records out of
that copy. The frame format itself (``FRAME``, ``WRAP``, ``RingError``) lives in
``shm/frames.py`` and is re-exported here.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence

from pynsqd.shm.frames import FRAME, FRAME_SIZE, PADS, WRAP, Frames, RingError, frame_records

MAGIC = b"PYNSQRG1"
VERSION = 1
HEADER_SIZE = 192
MIN_CAPACITY = 64
UNBOUNDED = 1 << 62  # peek_many's default max_bytes: no byte bound

_MAGIC_OFF = 0
_VERSION_OFF = 8
# indices of the header's 8-byte words (byte offset / 8)
_CAP = 2
_WRITE = 8
_WSEQ = 9
_READ = 16
_RSEQ = 17
_NOTE = 18

_VER = struct.Struct("<II")
_WRAP_FRAME = FRAME.pack(WRAP, 0)

__all__ = ["FRAME", "FRAME_SIZE", "HEADER_SIZE", "WRAP", "ByteRing", "Frames", "RingError", "Writable",
           "buffer_size", "frame_size", "put_one"]

Writable = bytearray | memoryview | mmap.mmap
# records a walk passed in one contiguous stretch: (how many came before them, their area
# positions' offset from the ring's indices, the positions where each starts and ends)
Run = tuple[int, int, list[int], list[int]]


def put_one(buf: memoryview, words: memoryview, cap: int, max_frame: int, lead: bytes, record: bytes) -> bool:
    """Append ``lead`` + ``record`` as one record if its frame fits now before the end of the
    area (and in ``max_frame``); False if not. ``words`` is the ring header as native 8-byte
    words; the bytes are written first, then the record count, then the write index
    (the publication order above)."""
    size = len(lead) + len(record)
    frame = (size + 15) & ~7
    read: int = words[_READ]
    write: int = words[_WRITE]
    start = write % cap
    if (read <= write and not (read | write) & 7 and frame <= cap - (write - read) and frame <= cap - start
            and frame <= max_frame):
        at = HEADER_SIZE + start
        buf[at:at + frame] = FRAME.pack(size, size ^ WRAP) + lead + record + PADS[-size & 7]
        words[_WSEQ] = words[_WSEQ] + 1
        words[_WRITE] = write + frame
        return True
    return False


def buffer_size(capacity: int) -> int:
    """Bytes of buffer needed for a ring with ``capacity`` bytes of record area."""
    return HEADER_SIZE + ((capacity + 7) & ~7)


def frame_size(record_size: int) -> int:
    """Bytes of record area one record of ``record_size`` bytes occupies."""
    return FRAME_SIZE + ((record_size + 7) & ~7)


class ByteRing:
    """FIFO of byte records in ``buf``; ``init=True`` formats it, ``False`` attaches.

    Attaching validates the header (``RingError`` if it is not a ring). The producer calls
    ``put``/``put_many``; the consumer ``take_many``, or ``peek_many`` then ``consume``.
    Call ``close()`` before closing an mmap under the ring (the ring holds a view of it).
    """

    __slots__ = ("_buf", "_cap", "_max_frame", "_peek_count", "_peek_read", "_peek_runs", "_peek_taken", "_peek_whole",
                 "_words")

    def __init__(self, buf: Writable, *, init: bool) -> None:
        view = memoryview(buf)
        if view.readonly or view.ndim != 1 or view.itemsize != 1:
            view.release()
            raise ValueError("a ring needs a writable 1-D byte buffer")
        if len(view) < HEADER_SIZE + MIN_CAPACITY:
            view.release()
            if init:
                raise ValueError(f"buffer too small for a ring ({len(view)} bytes)")
            raise RingError(f"not a ring (only {len(view)} bytes)")
        self._buf = view
        # Native 8-byte words: item stores and loads are single aligned memcpy's of 8 bytes.
        self._words = words = view[:HEADER_SIZE].cast("Q")
        self._peek_read = -1  # read index of the last peek (-1: none), then the read index after
        self._peek_runs: list[Run] = []  # where its records end (``_walk``); how many, how many consumed
        self._peek_count = self._peek_taken = 0
        self._peek_whole = False  # that peek reached the write index
        if init:
            cap = (len(view) - HEADER_SIZE) & ~7
            view[:HEADER_SIZE] = bytes(HEADER_SIZE)
            _VER.pack_into(view, _VERSION_OFF, VERSION, HEADER_SIZE)
            words[_CAP] = cap
            view[_MAGIC_OFF:_MAGIC_OFF + 8] = MAGIC  # last: a torn format is not a ring
        else:
            try:
                cap = self._check_header(view, words)
            except RingError:
                words.release()  # not ``close``: a subclass's may release views not made yet
                view.release()
                raise
        self._cap = cap
        self._max_frame = (cap // 2) & ~7

    @staticmethod
    def _check_header(view: memoryview, words: memoryview) -> int:
        if bytes(view[:8]) != MAGIC:
            raise RingError("not a ring (bad magic)")
        version, header = _VER.unpack_from(view, _VERSION_OFF)
        if version != VERSION or header != HEADER_SIZE:
            raise RingError(f"unsupported ring version {version}/{header}")
        cap = words[_CAP]
        if cap < MIN_CAPACITY or cap % 8 or cap > len(view) - HEADER_SIZE:
            raise RingError(f"bad ring capacity {cap} for a {len(view)}-byte buffer")
        return int(cap)

    # -- sizes ---------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Bytes of record area (frames, padding and wrap skips all count against it)."""
        return self._cap

    @property
    def max_record_size(self) -> int:
        """The largest record that always fits once the ring is empty."""
        return self._max_frame - FRAME_SIZE

    @property
    def used_bytes(self) -> int:
        write, read = self._indices()
        return write - read

    @property
    def free_bytes(self) -> int:
        return self._cap - self.used_bytes

    def __len__(self) -> int:
        words = self._words
        count: int = words[_WSEQ] - words[_RSEQ]
        return count if count > 0 else 0

    def has_records(self) -> bool:
        """Whether a record is published and not consumed: two index loads, no check."""
        words = self._words
        return words[_WRITE] != words[_READ]

    @staticmethod
    def any_records(rings: Sequence[ByteRing]) -> bool:
        """``has_records`` of any of ``rings``, in one call (a check on a hot path)."""
        for ring in rings:
            words = ring._words
            if words[_WRITE] != words[_READ]:
                return True
        return False

    @property
    def note(self) -> int:
        """The consumer's note (see the module doc)."""
        return int(self._words[_NOTE])

    @note.setter
    def note(self, value: int) -> None:
        self._words[_NOTE] = value

    def _indices(self) -> tuple[int, int]:
        words = self._words
        read: int = words[_READ]
        write: int = words[_WRITE]
        if read > write or write - read > self._cap or (read | write) & 7:
            raise RingError(f"corrupt ring indices (read {read}, write {write})")
        return write, read

    # -- producer ------------------------------------------------------------------------

    def put(self, record: bytes) -> bool:
        """Append one record; False when it does not fit now. ValueError if it never can.
        (One record that fits before the end is written by ``put_before_end``, a quarter of
        the cost of ``put_many``'s batch set-up; everything else goes through ``put_many``.)"""
        return self.put_before_end(record) or self.put_many((record,)) == 1

    def put_before_end(self, record: bytes) -> bool:
        """Append one record if it fits now before the end of the area; False if not."""
        return put_one(self._buf, self._words, self._cap, self._max_frame, b"", record)

    def put_many(self, records: Sequence[bytes], prefix: bytes = b"") -> int:
        """Append as many whole records as fit, in order; return how many were written.

        All of them become visible to the consumer at once (one index store). ``prefix``,
        if given, is stored in front of every record (as part of it).
        ``ValueError`` if the first record that does not fit is larger than
        ``max_record_size`` (it would never fit).
        """
        buf = self._buf
        cap = self._cap
        write, read = self._indices()
        free = cap - (write - read)
        start = write % cap
        tail = cap - start
        # Fast path: the whole batch fits before the end (framed by ``frame_records``).
        if records and sum(map(len, records)) + (FRAME_SIZE + len(prefix)) * len(records) <= min(free, tail):
            count = self.put_frames(frame_records(records, prefix))
            if count:
                return count
        max_frame = self._max_frame
        extra = len(prefix)
        head: list[bytes] = []
        wrapped: list[bytes] = []
        pieces = head
        pack = FRAME.pack
        pads = PADS
        used = 0
        count = 0
        for record in records:
            size = len(record) + extra
            frame = FRAME_SIZE + size + (-size & 7)
            if frame > max_frame:
                if count:
                    break
                raise ValueError(f"record of {size} bytes exceeds max_record_size {self.max_record_size}")
            if frame > tail:
                if pieces is wrapped or tail + frame > free:
                    break
                if tail:
                    head.append(_WRAP_FRAME)
                used += tail
                free -= tail
                tail = cap
                pieces = wrapped
            elif frame > free:
                break
            pieces.append(pack(size, size ^ WRAP))
            if extra:
                pieces.append(prefix)
            pieces.append(record)
            pad = -size & 7
            if pad:
                pieces.append(pads[pad])
            used += frame
            free -= frame
            tail -= frame
            count += 1
        if not count:
            return 0
        if head:
            data = b"".join(head)
            buf[HEADER_SIZE + start:HEADER_SIZE + start + len(data)] = data
        if wrapped:
            data = b"".join(wrapped)
            buf[HEADER_SIZE:HEADER_SIZE + len(data)] = data
        words = self._words
        words[_WSEQ] = words[_WSEQ] + count
        words[_WRITE] = write + used
        return count

    def put_frames(self, frames: Frames) -> int:
        """Append a run of frames (``frame_records``/``check_frames`` made and checked it)
        whole, with one copy and one index store; returns its count, or 0 when it does not
        fit before the end of the area now (or holds a frame larger than ``max_record_size``
        allows): the caller then takes ``put_many``'s path."""
        count = len(frames)
        total = frames.end - frames.start
        write, read = self._indices()
        cap = self._cap
        start = write % cap
        if (count <= 0 or total % 8 or total > cap - (write - read) or total > cap - start
                or frames.largest > self._max_frame):
            return 0
        at = HEADER_SIZE + start
        self._buf[at:at + total] = memoryview(frames.data)[frames.start:frames.end]
        words = self._words
        words[_WSEQ] = words[_WSEQ] + count
        words[_WRITE] = write + total
        return count

    # -- consumer ------------------------------------------------------------------------

    def _walk(self, read: int, write: int, max_count: int, out: list[bytes] | None,
              max_bytes: int = UNBOUNDED, runs: list[Run] | None = None) -> tuple[int, int]:
        """Walk up to ``max_count`` frames from index ``read`` towards ``write``, and no more
        once the records walked hold ``max_bytes`` (the first is always walked).

        Returns (records walked, the read index after them); appends copies of the records
        to ``out`` unless it is None (one copy of the buffer per contiguous run), and to
        ``runs``, unless it is None, what says where each record ends (``_end_of``).
        """
        buf = self._buf
        cap = self._cap
        unpack = FRAME.unpack_from
        count = 0
        walked = 0  # record bytes
        while read < write and count < max_count and walked < max_bytes:
            pos = start = read % cap
            end = pos + min(write - read, cap - pos)
            starts: list[int] = []
            stops: list[int] = []
            while pos < end and count < max_count and walked < max_bytes:
                size, check = unpack(buf, HEADER_SIZE + pos)
                if size ^ check != WRAP:
                    raise RingError(f"corrupt record frame at {pos} (length {size})")
                if size == WRAP:
                    if write - read - (pos - start) < cap - pos:
                        raise RingError(f"wrap marker at {pos} beyond the write index")
                    pos = cap
                    break
                frame = FRAME_SIZE + size + (-size & 7)
                if pos + frame > end:
                    raise RingError(f"record length {size} at {pos} runs past the written data")
                starts.append(pos + FRAME_SIZE)
                stops.append(pos + FRAME_SIZE + size)
                pos += frame
                count += 1
                walked += size
            if out is not None and starts:
                first = starts[0]
                chunk = buf[HEADER_SIZE + first:HEADER_SIZE + stops[-1]].tobytes()
                out += [chunk[a - first:b - first] for a, b in zip(starts, stops)]
            if runs is not None and starts:
                runs.append((count - len(starts), read - start, starts, stops))
            read += pos - start
        return count, read

    def count_from(self, index: int) -> int:
        """Records published from ``index`` on (a record boundary between the read and the
        write index): ``RingError`` if it is not one."""
        write, read = self._indices()
        if not read <= index <= write or index & 7:
            raise RingError(f"index {index} is outside the records {read}..{write}")
        return self._walk(index, write, UNBOUNDED, None)[0]

    def take_many(self, max_count: int) -> list[bytes]:
        """Copy out and consume up to ``max_count`` records (oldest first)."""
        write, read = self._indices()
        out: list[bytes] = []
        count, new_read = self._walk(read, write, max_count, out)
        if new_read != read:
            self._advance(new_read, count)
        return out

    def peek_many(self, max_count: int, max_bytes: int = UNBOUNDED) -> list[bytes]:
        """Copy out up to ``max_count`` records without consuming them; ``consume`` next
        (all of them at once, or a few at a time). No record is added once those taken
        hold ``max_bytes`` (the first always comes)."""
        write, read = self._indices()
        out: list[bytes] = []
        runs: list[Run] = []
        count, new_read = self._walk(read, write, max_count, out, max_bytes, runs)
        self._peek_read, self._peek_runs, self._peek_count, self._peek_taken = read, runs, count, 0
        self._peek_whole = new_read == write
        return out

    @property
    def peeked_all(self) -> bool:
        """The last ``peek_many`` returned every record published then (no bound cut it)."""
        return self._peek_whole

    def consume(self, count: int) -> None:
        """Drop the oldest ``count`` records (the next ones a ``peek_many`` returned)."""
        if count <= 0:
            return
        taken = self._peek_taken + count
        if self._words[_READ] == self._peek_read and taken <= self._peek_count:  # the peek's next ones
            new_read = self._end_of(taken - 1)
            self._peek_read, self._peek_taken = new_read, taken
        else:
            write, read = self._indices()
            walked, new_read = self._walk(read, write, count, None)
            if walked < count:
                raise ValueError(f"consume({count}) but only {walked} records are queued")
            self._peek_read = -1
        self._store_read(new_read, count)

    def _end_of(self, record: int) -> int:
        """The index after the peek's ``record``-th record (from its first)."""
        for first, base, starts, stops in reversed(self._peek_runs):
            if record >= first:
                at, stop = starts[record - first], stops[record - first]
                return base + stop + (-(stop - at) & 7)
        raise ValueError(f"record {record} was not peeked")

    def _advance(self, new_read: int, count: int) -> None:
        self._peek_read = -1
        self._store_read(new_read, count)

    def _store_read(self, new_read: int, count: int) -> None:
        words = self._words
        words[_READ] = new_read
        words[_RSEQ] = words[_RSEQ] + count

    # -- owner ---------------------------------------------------------------------------

    def counts(self) -> tuple[int, int]:
        """(records written, records consumed) as the header has them (``recount``)."""
        words = self._words
        return int(words[_WSEQ]), int(words[_RSEQ])

    def recount(self, excess: int) -> None:
        """Correct the record counts, which held ``excess`` records more than were queued
        (fewer when negative): ``recover``'s repair, for a walk made in steps while the
        owner used the ring (``shm/logrecovery.py``). Owner only."""
        words = self._words
        written, consumed = int(words[_WSEQ]), int(words[_RSEQ]) + excess
        if consumed < 0:
            written -= consumed
            consumed = 0
        words[_WSEQ] = written
        words[_RSEQ] = consumed

    def unwrapped(self) -> tuple[int, int, int] | None:
        """(read index, write index, read position) when the queued bytes lie in one run that
        ends at or before the end of the area, so the area can be made larger behind them
        without moving a record (``relayout``); None while they wrap around the end."""
        write, read = self._indices()
        at = read % self._cap
        return (read, write, at) if at + (write - read) <= self._cap else None

    def relayout(self, buf: Writable, capacity: int, read: int, write: int) -> None:
        """Owner only, nobody else attached: take ``buf`` (this ring's bytes, now with room for
        ``capacity`` bytes of area; the old views released first, ``detach``) and store
        ``capacity`` and the indices ``read``/``write``. Made for growing an ``unwrapped``
        ring: with read = its read position and write = read + bytes queued, every record
        keeps its position. Idempotent: ``shm/store.py`` journals the three values first
        and stores them again after a crash, as the stores here are not one."""
        view = memoryview(buf)
        if (capacity % 8 or capacity < MIN_CAPACITY or len(view) < HEADER_SIZE + capacity
                or not 0 <= read <= write <= capacity or (read | write) & 7):
            view.release()
            raise ValueError(f"cannot lay out a {capacity}-byte area with indices {read}..{write} "
                             f"in a {len(view)}-byte buffer")
        self._buf = view
        self._words = words = view[:HEADER_SIZE].cast("Q")
        self._peek_read = -1
        words[_CAP] = capacity
        words[_WRITE] = write
        words[_READ] = read
        self._cap = capacity
        self._max_frame = (capacity // 2) & ~7

    def detach(self) -> None:
        """Release the views of the buffer (before it is remapped); ``relayout`` or ``attach``
        take it again."""
        self._words.release()
        self._buf.release()

    def attach(self, buf: Writable) -> None:
        """Take ``buf`` again, as it is, after ``detach`` (``RingError`` if it is no ring)."""
        view = memoryview(buf)
        words = view[:HEADER_SIZE].cast("Q")
        try:
            cap = self._check_header(view, words)
        except RingError:
            words.release()
            view.release()
            raise
        self._buf, self._words, self._peek_read = view, words, -1
        self._cap = cap
        self._max_frame = (cap // 2) & ~7

    def reset(self) -> None:
        """Empty the ring (indices, counts and note to zero); only while nobody else uses it."""
        words = self._words
        self._peek_read = -1
        for word in (_WRITE, _WSEQ, _READ, _RSEQ, _NOTE):
            words[word] = 0

    def close(self) -> None:
        """Release the view of the buffer (needed before an mmap under it can close)."""
        self._words.release()
        self._buf.release()

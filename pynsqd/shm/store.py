"""Where a node's topic and channel logs live: one shared-memory segment per queue.

A segment is ``[4 KiB name page][MessageLog]``. The name page holds the kind and name of the
queue it belongs to (``PYNSQSEG``, u16 length, ``kind NUL name``), so a restarted process
can find every queue the dead one had — even one created too late to reach ``nsqd.dat`` —
without anything only the dead process knew. Segment names come from
``segment.segment_name(data path, kind, name)``; channels are named ``topic:channel``.

``open_log`` attaches to an existing segment (and says so: the caller then recovers the
log) or makes a new one; a segment that does not hold a valid log is logged, reset and
reused. ``leftovers`` lists this node's segments that no queue claimed, with the name each
records; the owner recreates the ones with live messages and unlinks the rest. A drained
log hands its pages back with ``madvise(MADV_REMOVE)`` (``discard``), so resident memory
follows what is queued, not what has passed through.

``grow_log`` makes a log's area larger in place (``shm/sizing.py`` decides when and how
much): only while its records lie in one run that does not wrap around the end
(``ByteRing.unwrapped``), so none moves; the segment is grown (ftruncate + mremap) and the
ring header gets the new capacity with its indices rebased to positions. Those three header
words cannot be stored at once, so the target values go to the name page first (the growth
journal at ``_GROWTH_AT``: magic, capacity, read, write) and are cleared after; ``open_log``
finds a journal a kill -9 left and finishes the growth (or drops it, if the segment never
grew: the header was not touched yet). Either way every record keeps its position.

``BackendMark`` keeps, in the name page at ``_MARK_AT``, where the queue's disk queue has
been read up to (committed), and, while spilled messages are being appended to the log, the
position past them with the log's write index before the append. The disk queue persists its
read position only when it syncs (every ``--sync-every`` operations or ``--sync-timeout``),
but this page survives a kill -9: the next process resumes reading where the dead one had
really got to, so what it moved into the log is not read a second time. Two slots and a
sequence number: a slot is written whole, then the sequence that selects it is stored, so a
kill -9 at any instruction leaves one whole slot selected (zeros mean no mark).

``ApplyMark``, at ``_APPLY_AT`` and made the same way, says how much of a cross-shard batch
the queue holds (``shard/unit.py``): the batch (the producer shard, the time its first record
was sent), how many of its first messages the queue held before an append, and while the
append runs, the log's write index, the disk queue's write position and the journal's size
before it. A restart counts what reached them past those (``MessageQueue.start_recovery``).
"""

from __future__ import annotations

import logging
import mmap
import struct
from collections.abc import Callable

from pynsqd.shm.log import Discard, MessageLog
from pynsqd.shm.ring import RingError, buffer_size
from pynsqd.shm.segment import SHM_DIR, Segment, SegmentError, list_segments, segment_name, unlink_segment

log = logging.getLogger("pynsqd.shm")

NAME_PAGE = 4096
_NAME_MAGIC = b"PYNSQSEG"
_NAME_LEN = struct.Struct("<H")
PAGE = mmap.PAGESIZE
_GROWTH_AT = 2048  # in the name page (names are at most ~520 bytes)
_GROWTH_MAGIC = b"PYNSQGRW"
_GROWTH = struct.Struct("<QQQ")  # capacity, read, write
_MARK_AT = 3072  # in the name page, after the growth journal
_MARK_SEQ = struct.Struct("Q")  # native: one aligned 8-byte store
# committed file, offset; then file, offset past an append in progress, log write index + 1 before it (0: none)
_MARK = struct.Struct("QQQQQ")
_APPLY_AT = 3328  # in the name page, after the backend mark
# producer shard + 1, first sent ns, messages held; log write index + 1 before an append in
# progress (0: none), the disk queue's write file and offset before it, the journal's size + 1
# before an append to it (0: none)
_APPLY = struct.Struct("QQQQQQQ")
_SLOTS = (_APPLY_AT + 8, _APPLY_AT + 8 + _APPLY.size)
Position = tuple[int, int]


def log_capacity(mem_queue_bytes: int, max_msg_size: int) -> int:
    """Record-area bytes of a queue's log: the flag, but room for two of the largest messages."""
    need = 2 * (max_msg_size + 26 + 16 + 8) + 64
    return (max(mem_queue_bytes, need) + PAGE - 1) // PAGE * PAGE


def grow_log(segment: Segment, log_: MessageLog, capacity: int) -> int | None:
    """Make ``log_``'s area ``capacity`` bytes (see the module doc). Returns how far its
    indices moved back (the owner's delivery cursor moves with them), or None when it cannot
    now: the records wrap around the end, or the system refused the larger segment."""
    layout = log_.unwrapped()
    if layout is None or capacity <= log_.capacity:
        return None
    old_read, old_write, at = layout
    read, write = at, at + (old_write - old_read)
    buf = segment.buf
    _GROWTH.pack_into(buf, _GROWTH_AT + 8, capacity, read, write)
    buf[_GROWTH_AT:_GROWTH_AT + 8] = _GROWTH_MAGIC
    log_.detach()
    try:
        segment.resize(NAME_PAGE + buffer_size(capacity))
    except SegmentError as exc:
        log.warning("%s", exc)
        buf[_GROWTH_AT:_GROWTH_AT + 8] = bytes(8)
        _with_area(segment, log_.attach)
        return None
    _with_area(segment, lambda area: log_.relayout(area, capacity, read, write))
    buf[_GROWTH_AT:_GROWTH_AT + 8] = bytes(8)
    return old_read - read


def _with_area(segment: Segment, use: Callable[[memoryview], None]) -> None:
    area = memoryview(segment.buf)[NAME_PAGE:]
    try:
        use(area)
    finally:
        area.release()  # the log holds its own view


def _finish_growth(segment: Segment, log_: MessageLog) -> None:
    """A growth a kill -9 interrupted: store its journaled layout (the segment grew), or drop
    the journal (it did not: the header is as it was)."""
    buf = segment.buf
    if buf[_GROWTH_AT:_GROWTH_AT + 8] != _GROWTH_MAGIC:
        return
    capacity, read, write = _GROWTH.unpack_from(buf, _GROWTH_AT + 8)
    if len(buf) >= NAME_PAGE + buffer_size(capacity):
        log_.detach()
        _with_area(segment, lambda area: log_.relayout(area, capacity, read, write))
        log.info("%s: finished growing its log to %d bytes", segment.name, capacity)
    buf[_GROWTH_AT:_GROWTH_AT + 8] = bytes(8)


class BackendMark:
    """Where a queue's disk queue has been read up to, in its segment (see the module doc)."""

    __slots__ = ("_segment",)

    def __init__(self, segment: Segment) -> None:
        self._segment = segment

    def save(self, committed: Position, after: Position | None = None, write_index: int = 0) -> None:
        """The disk queue's read is committed up to ``committed``; with ``after``, messages up
        to ``after`` are being appended to the log, whose write index was ``write_index``."""
        buf = self._segment.buf
        seq = _MARK_SEQ.unpack_from(buf, _MARK_AT)[0] + 1
        pending = (0, 0, 0) if after is None else (*after, write_index + 1)
        _MARK.pack_into(buf, _MARK_AT + 8 + (seq & 1) * _MARK.size, *committed, *pending)
        _MARK_SEQ.pack_into(buf, _MARK_AT, seq)

    def load(self, write_index: int) -> Position | None:
        """Where reading goes on after a crash, given the log's ``write_index`` now: past an
        append in progress if it reached the log, else the committed position; None when no
        mark was saved."""
        buf = self._segment.buf
        seq = _MARK_SEQ.unpack_from(buf, _MARK_AT)[0]
        if not seq:
            return None
        file_num, pos, after_file, after_pos, before = _MARK.unpack_from(buf, _MARK_AT + 8 + (seq & 1) * _MARK.size)
        if before and write_index >= before:  # the append was published: the log has them
            return after_file, after_pos
        return file_num, pos


class ApplyMark:
    """How much of a cross-shard batch a queue holds, in its segment (see the module doc)."""

    __slots__ = ("_segment", "_seq")

    def __init__(self, segment: Segment) -> None:
        self._segment = segment  # its buffer is looked up at each use: the segment may be remapped (growth)
        self._seq = _MARK_SEQ.unpack_from(segment.buf, _APPLY_AT)[0]  # this process is its only writer

    def save(self, src: int, first: int, held: int, write_index: int = -1, backend: Position = (0, 0),
             journal: int = -1) -> None:
        """The queue holds the first ``held`` messages of batch (``src``, ``first``); with
        ``write_index`` (the log's before it), ``backend`` (the disk queue's write position
        before it) and ``journal`` (the journal's size before it, if it is appended to), it is
        appending more of them."""
        buf = self._segment.buf
        self._seq = seq = self._seq + 1
        _APPLY.pack_into(buf, _SLOTS[seq & 1], src + 1, first, held, write_index + 1, backend[0], backend[1],
                         journal + 1)
        _MARK_SEQ.pack_into(buf, _APPLY_AT, seq)

    def load(self) -> tuple[int, int, int, int, Position, int] | None:
        """(src, first, held, log write index before an append in progress or -1, disk queue
        position before it, journal size before it or -1), or None when no mark was saved."""
        buf = self._segment.buf
        seq = _MARK_SEQ.unpack_from(buf, _APPLY_AT)[0]
        if not seq:
            return None
        src, first, held, before, file_num, pos, journal = _APPLY.unpack_from(buf, _SLOTS[seq & 1])
        return src - 1, first, held, before - 1, (file_num, pos), journal - 1


def _write_name(buf: mmap.mmap, kind: str, name: str) -> None:
    text = f"{kind}\0{name}".encode()
    buf[:NAME_PAGE] = (_NAME_MAGIC + _NAME_LEN.pack(len(text)) + text).ljust(NAME_PAGE, b"\0")


def read_name(buf: mmap.mmap) -> tuple[str, str] | None:
    """(kind, name) recorded in a segment, or None if it holds none."""
    if len(buf) < NAME_PAGE or buf[:8] != _NAME_MAGIC:
        return None
    size = _NAME_LEN.unpack_from(buf, 8)[0]
    kind, _, name = bytes(buf[10:10 + size]).decode(errors="replace").partition("\0")
    return kind, name


def _discarder(buf: mmap.mmap) -> Discard:
    def discard(offset: int, length: int) -> None:
        start = (NAME_PAGE + offset + PAGE - 1) // PAGE * PAGE
        end = (NAME_PAGE + offset + length) // PAGE * PAGE
        if end > start:
            try:
                buf.madvise(mmap.MADV_REMOVE, start, end - start)
            except OSError:
                pass
    return discard


def open_log(data_path: str, kind: str, name: str, capacity: int) -> tuple[Segment, MessageLog, bool]:
    """The segment and log of a queue; the flag says it existed (the caller recovers it).
    ``RingError`` if the queue's own segment holds a log that fails its checks: it is left
    untouched (docs/architecture.md, *Corruption*)."""
    shm_name = segment_name(data_path, kind, name)
    try:
        segment = Segment.open(shm_name, NAME_PAGE + buffer_size(capacity), create=True)
    except SegmentError as exc:
        raise OSError(str(exc)) from exc
    buf = segment.buf
    area = memoryview(buf)[NAME_PAGE:]
    discard = _discarder(buf)
    existed = not segment.created
    recorded = read_name(buf) if existed else None
    try:
        if recorded == (kind, name):
            try:
                found = MessageLog(area, init=False, discard=discard)
            except (RingError, ValueError) as exc:
                unusable = exc
            else:
                _finish_growth(segment, found)
                return segment, found, True
        else:
            if recorded is not None:
                log.error("%s %s: segment %s holds another queue; starting it empty", kind, name, shm_name)
            found = MessageLog(area, init=True, discard=discard)
            _write_name(buf, kind, name)  # after the log: a segment with a name holds a valid one
            return segment, found, False
    finally:
        area.release()  # the log holds its own view
    segment.close()
    raise RingError(f"{kind} {name}: its shared-memory log is unusable ({unusable}); it is left as it "
                    f"is: remove {SHM_DIR}{shm_name} to start the queue empty")

Leftover = tuple[str, str, str, int]  # shm name, kind, name, records in the log


def leftovers(data_path: str, claimed: set[str],
              mine: Callable[[str, str], bool] | None = None) -> list[Leftover]:
    """This node's segments not in ``claimed``, with the queue each records ("" if none) and
    how many records its log holds (0 if it holds no valid log). With ``mine``, only the
    segments whose recorded (kind, name) it accepts (a shard looks only at its own topics'
    segments, never at another live shard's, nor at a nameless one: a ring, or a segment
    another process is creating right now)."""
    out: list[Leftover] = []
    for shm_name in list_segments(data_path):
        if shm_name in claimed:
            continue
        kind = name = ""
        records = 0
        try:
            segment = Segment.open(shm_name, 0, create=False)
        except SegmentError:
            continue
        try:
            recorded = read_name(segment.buf)
            if mine is not None and (recorded is None or not mine(*recorded)):
                continue
            if recorded is not None:
                kind, name = recorded
                area = memoryview(segment.buf)[NAME_PAGE:]
                try:
                    ring = MessageLog(area, init=False)
                    records = len(ring)
                    ring.close()
                except RingError:
                    pass
                finally:
                    area.release()
        finally:
            segment.close()
        out.append((shm_name, kind, name, records))
    return out


def claimed_names(data_path: str, queues: list[tuple[str, str]]) -> set[str]:
    """The shm names of ``[(kind, name)]`` queues."""
    return {segment_name(data_path, kind, name) for kind, name in queues}


__all__ = ["ApplyMark", "BackendMark", "claimed_names", "leftovers", "log_capacity", "open_log", "read_name",
           "unlink_segment"]

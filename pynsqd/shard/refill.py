"""Spilled messages read back from the backend into a queue's log, exactly once across a kill -9.

Theory of operation
-------------------
A queue delivers from its log only; once the log has nothing ready, ``Refill.run`` moves
messages from the backend (the disk queue) into it: they are read with the backend's peek,
appended to the log, and only then committed. When fewer fit than were read, only those are
committed and the rest stay on disk, at the front, to be read again: nothing is written
back, so a failing disk cannot lose them.

The disk queue persists its read position only when it syncs, so after a kill -9 its
metadata could point before messages already moved into the log. The refill therefore keeps
the position in the queue's segment too (``pynsqd.shm.store.BackendMark``: mapped memory, no
syscall): before each append, the position past the peeked messages with the log's write
index; after the commit, the committed position. A restart reads the mark back
(``resume_position``) and, once the log's walk proved it whole, hands the backend the
position that matches the log (``skip_to``), so a kill -9 at any point reads no refilled
message a second time.
"""

from __future__ import annotations

import logging
from typing import Protocol

from pynsqd.shard.backend import Backend, DropBackend
from pynsqd.shm.log import MessageLog
from pynsqd.shm.segment import Segment
from pynsqd.shm.store import BackendMark, Position

logger = logging.getLogger("pynsqd.shard")


class Room(Protocol):
    """What a refill needs from the queue whose log it fills."""

    log: MessageLog

    def make_room(self, frame: int) -> bool:
        """Compact the log; True if a frame of ``frame`` bytes may fit now."""

    def make_larger(self, need: int) -> bool:
        """Grow the log; True if ``need`` more bytes fit now."""

    def took_in(self, count: int) -> None:
        """``count`` READY records were appended to the log."""


class Refill:
    """The backend behind a log, and where it has been read up to (see the module doc)."""

    __slots__ = ("_mark", "backend", "largest")

    def __init__(self, backend: Backend, segment: Segment | None) -> None:
        self.backend = backend
        self.largest = 4096  # the largest message seen coming back from the backend
        # where the backend has been read up to, kept in shared memory (durable queues only)
        self._mark = None if segment is None or isinstance(backend, DropBackend) else BackendMark(segment)

    def resume_position(self, write_index: int) -> Position | None:
        """Where the backend resumes given the log's write index as a previous process left
        it (None: no mark, or nothing to skip)."""
        return None if self._mark is None else self._mark.load(write_index)

    def skip_to(self, resume: Position | None) -> None:
        """The log proved whole: the backend's metadata may be older than the mark kept in
        shared memory, so skip what the log holds (had the log been corrupt, they would be
        read again from the backend)."""
        if resume is not None:
            self.backend.skip_to(resume)

    def run(self, room: Room, count: int) -> None:
        """Move up to ``count`` spilled messages from the backend into ``room``'s log, reading
        only as many as fit if each were as large as the largest seen so far."""
        log = room.log
        moved = 0
        no_room = False  # nothing fit even after ``make_room``: try once more, then stop
        while moved < count and self.backend.depth:
            batch = min(count - moved, log.free_bytes // log.frame_of(self.largest))
            if batch <= 0:
                if not room.make_room(log.frame_of(self.largest)) and not room.make_larger(
                        log.frame_of(self.largest) * (count - moved)):
                    break
                continue
            try:
                records = self.backend.peek_many(batch)
            except Exception:  # a read error is the backend's to log; serve what we have
                logger.exception("failed to read from %r", self.backend)
                break
            if not records:
                self.commit()  # a peek may have skipped a corrupt file
                break
            self.largest = max(self.largest, *map(len, records))
            n = self._move_in(room, records)
            moved += n
            if n == len(records):
                no_room = False
            elif no_room or not room.make_room(log.frame_of(self.largest)):
                break  # still no room: the rest stays on disk, read again later
            else:
                no_room = not n

    def _move_in(self, room: Room, records: list[bytes]) -> int:
        """Append the backend's peeked ``records`` to the log and commit those that fit (all,
        or the first ones: the rest are read again). Exact across a kill -9: before the
        append, the mark in shared memory says where the backend's reading ends once the
        log has them, with the log's write index before it; so a restart resumes reading
        past them if the append was published, before them if not (``BackendMark``)."""
        log = room.log
        mark = log.mark()
        if self._mark is not None:
            self._mark.save(self.backend.committed_position or (0, 0), self.backend.read_position, mark[0])
        n = log.append_ready(records)
        if 0 < n < len(records):  # only some fit: append exactly those, under their own mark
            log.rollback(mark)
            self.commit(0)
            try:
                again = self.backend.peek_many(n)  # the same first ``n``: they fit
            except Exception:
                logger.exception("failed to read from %r", self.backend)
                return 0
            return self._move_in(room, again)
        room.took_in(n)
        self.commit(n if n < len(records) else None)  # a crash before this reads none twice
        return n

    def commit(self, count: int | None = None) -> None:
        """Consume what was peeked from the backend (only the first ``count``, if given)."""
        try:
            self.backend.commit(count)
        except Exception:  # kept unconsumed: read again later (duplicates, never loss)
            logger.exception("failed to commit a read of %r", self.backend)
        self.save_mark()

    def save_mark(self) -> None:
        """Keep the backend's committed read position in shared memory (no syscall)."""
        position = self.backend.committed_position
        if self._mark is not None and position is not None:
            self._mark.save(position)

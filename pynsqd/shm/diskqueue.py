"""A FIFO of byte records on disk, file- and format-compatible with go-diskqueue v1.1.0.

Theory of operation
-------------------
nsqd topics and channels spill here once ``--mem-queue-size`` is full. Records are appended
to ``<name>.diskqueue.NNNNNN.dat`` files (``diskqueue_format`` has the exact bytes); a new file
is started before a write that would take the current one past ``max_bytes_per_file``
(nsqd: 100 MiB). Reading walks the files in order and deletes each one once it has been
read past. ``<name>.diskqueue.meta.dat`` records depth and both positions; it is replaced
atomically (temp file, fsync, rename) and only after the data files it points into have been
fsynced, so the metadata on disk never claims bytes that a power cut could take away.

Durability is go-diskqueue's: ``put`` returns after ``write()``, not after ``fsync``.
``sync()`` (fsync + metadata) runs when ``sync_every`` puts and reads have happened (nsqd:
2500), on every roll, when reading finishes a file, on ``close``, and (``sync_wanted``, asked by
the shard's syncer) once ``sync_timeout`` (nsqd: 2 s) has passed with activity. A crash can therefore leave
stale metadata; opening repairs what it finds:

* a torn record at the end of the write file is cut off;
* whole records after the recorded write position are kept, counted into the depth, and
  writing moves to a fresh file so they are never overwritten;
* no (or unreadable) metadata, files beyond the recorded write file, or a write file shorter
  than recorded: the files are scanned to rebuild the depth, writing moves to a fresh file;
* a stale read position re-delivers records read since the last sync (at least once),
  unless the owner kept the committed position where a crash cannot lose it and hands it
  back with ``skip_to`` (``pynsqd.shard.refill`` keeps it in shared memory).

``peek_many`` reads records without consuming them and ``commit`` consumes everything peeked
(or only the first ``count``: the reader moves back and the rest are read again):
a sync persists only the committed read position (and counts uncommitted records in the
depth), and a file read past is deleted once a committed position has left it, by the sync
that persists that position. On a full disk the metadata write is what fails: the sync then
deletes the files read past first (their records are stored elsewhere) and writes the
metadata again into the space they freed, so consumption gives a full disk its space back at
once. Should that write fail too, the files stay deleted and the metadata lags behind until
a sync succeeds; opening repairs it (the missing files are skipped, the depth recounted), but
after a reboot the records read from those files since the last sync are gone with whatever
held them. A caller that stores what it peeked elsewhere before committing sees duplicates
after a crash at any point, never a loss (``read_many`` is the two in one call).

A record that cannot be parsed while reading (size outside [min, max], a torn record) makes
the whole file ``<file>.bad`` (a missing file is skipped); reading goes on with the next file
and the depth is recounted from the files that remain (one sequential scan, only on
corruption). Other read errors (EIO, EMFILE) raise and leave the file in place. A failed
write (ENOSPC, EFBIG) truncates what it wrote and raises; the queue is unchanged.

Speed: a batch is one ``pwrite`` of the joined records; reads ``pread`` 1 MiB at a time and
parse records from memory (``diskqueue_format.parse_records``), so both run at millions of
records per second. Every call is short except ``sync`` (one or a few fsyncs), which may run
in another thread: the state lock is held only to take a snapshot, metadata renames are
ordered by a sequence number, and a snapshot older than one already persisted is dropped.
A sync that falls due inside ``put_many`` or ``commit`` is handed to ``on_sync_due`` when
the owner set it (a shard runs them on a worker thread: ``pynsqd.shard.syncer``), and run
inline otherwise. ``on_dirty`` tells the owner when a clean queue (nothing since the last
sync) gets something to sync, so it need only look at those queues for ``sync_wanted``.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence

from pynsqd.shm import diskqueue_format as fmt
from pynsqd.shm.diskqueue_format import HEADER, HEADER_SIZE, Meta, Stop
from pynsqd.shm.diskqueue_recovery import Scanner

READ_BUFFER = 1 << 20


class DiskQueueError(Exception):
    """A write, sync or read failure; the queue's state stays consistent."""


class _Corrupt(Exception):
    """The read file cannot be parsed further."""


class DiskQueue:
    """One queue: ``put``/``put_many`` append, ``read``/``read_many`` consume, ``close`` when done."""

    def __init__(self, name: str, data_path: str, *, max_bytes_per_file: int, min_msg_size: int,
                 max_msg_size: int, sync_every: int, sync_timeout_ns: int,
                 logger: logging.Logger | None = None) -> None:
        """Open the queue in ``data_path``, repairing files a crash left (see the module doc).

        Raises ``DiskQueueError`` when the directory or the files cannot be read.
        """
        self.name = name
        self._dir = data_path
        self._max_bytes = max_bytes_per_file
        self._min_size = min_msg_size
        self._max_size = max_msg_size
        self._sync_every = max(1, sync_every)
        self._sync_timeout_ns = sync_timeout_ns
        self._log = logger or logging.getLogger("pynsqd.diskqueue")
        self._lock = threading.Lock()        # state; never held across an fsync
        self._sync_lock = threading.Lock()   # orders metadata renames and file removals
        self._wfd = -1
        self._rolled: dict[int, int] = {}    # file number -> fd of a rolled file awaiting fsync
        self._rfd = -1
        self._rbuf = b""
        self._rbuf_start = 0
        self._read_end: int | None = None    # size of the read file once writing has left it
        self._consumed: list[int] = []       # read files to delete once metadata moved past them
        self._pending = 0                    # records peeked and not yet committed
        self._sync_due = False               # a peek finished or skipped a file
        self._count = 0
        self._last_sync_ns = time.monotonic_ns()
        self._seq = 0
        self._persisted_seq = 0
        self._closed = False
        self.on_sync_due: Callable[[], None] | None = None  # runs due syncs elsewhere, if set
        # called (on the caller's thread) when a write, commit or skip makes a clean queue unsynced
        self.on_dirty: Callable[[], None] | None = None
        self._scanner = Scanner(name, data_path, min_msg_size, max_msg_size, self._log)
        try:
            state = self._scanner.open()
        except OSError as exc:
            raise DiskQueueError(f"DISKQUEUE({name}) cannot open in {data_path}: {exc}") from exc
        self._depth, self._read_file, self._read_pos, self._write_file, self._write_pos = (
            state.depth, state.read_file, state.read_pos, state.write_file, state.write_pos)
        self._committed = (self._read_file, self._read_pos)  # the read position a sync persists

    @property
    def depth(self) -> int:
        """Records written and not yet read (still valid after ``close``)."""
        return self._depth

    # ---------------------------------------------------------------- writing

    def put(self, record: bytes) -> None:
        """Append one record. Raises ``DiskQueueError`` (nothing stored) on a bad size or I/O error."""
        self.put_many((record,))

    def put_many(self, records: Sequence[bytes]) -> None:
        """Append records in order with one write per file touched; all or nothing.

        Raises ``DiskQueueError`` when a size is outside [min_msg_size, max_msg_size] or the
        write fails; then no record of the batch is stored and ``depth`` is unchanged.
        """
        if not records:
            return
        lengths = list(map(len, records))
        bad = fmt.check_sizes(lengths, self._min_size, self._max_size)
        if bad is not None:
            raise DiskQueueError(f"DISKQUEUE({self.name}) invalid message write size ({lengths[bad]}) "
                                 f"minMsgSize={self._min_size} maxMsgSize={self._max_size}")
        with self._lock:
            self._check_open()
            rolled = self._write_locked(records, lengths)
            self._depth += len(records)
            dirtied = not self._count
            self._count += len(records)
            due = rolled or self._count >= self._sync_every
        if dirtied:
            self._dirtied()
        if due:
            self._sync_requested()

    def _write_locked(self, records: Sequence[bytes], lengths: list[int]) -> bool:
        segments = fmt.plan_segments(self._write_pos, lengths, self._max_bytes)
        orig_file, orig_pos = self._write_file, self._write_pos
        touched: list[tuple[int, int]] = []
        try:
            for first, stop, roll in segments:
                if roll:
                    self._roll_write_file()
                if self._wfd < 0:
                    self._wfd = os.open(self._path(self._write_file), os.O_WRONLY | os.O_CREAT, 0o600)
                touched.append((self._write_file, self._write_pos))
                whole = first == 0 and stop == len(records)
                data = fmt.frame(records if whole else records[first:stop], lengths[first:stop])
                _pwrite_all(self._wfd, data, self._write_pos)
                self._write_pos += len(data)
        except OSError as exc:
            self._undo_write(orig_file, orig_pos, touched)
            raise DiskQueueError(f"DISKQUEUE({self.name}) failed to write - {exc}") from exc
        return len(segments) > 1 or segments[0][2]

    def _roll_write_file(self) -> None:
        if self._wfd >= 0:
            self._rolled[self._write_file] = self._wfd
            self._wfd = -1
        if self._read_file == self._write_file:
            self._read_end = None
        self._write_file += 1
        self._write_pos = 0

    def _undo_write(self, orig_file: int, orig_pos: int, touched: list[tuple[int, int]]) -> None:
        """Remove every byte of a failed batch and restore the write position."""
        if self._write_file != orig_file:
            _close(self._wfd)
            for num in [n for n in self._rolled if n > orig_file]:
                _close(self._rolled.pop(num))
            self._wfd = self._rolled.pop(orig_file, -1)
        restored = True
        for num, start in reversed(touched):
            try:
                if num != orig_file:
                    os.unlink(self._path(num))      # created by this batch
                else:
                    os.truncate(self._path(num), start)
            except FileNotFoundError:
                pass
            except OSError as exc:
                restored = False
                self._log.error("DISKQUEUE(%s) failed to remove a failed write from %s - %s",
                                self.name, self._path(num), exc)
        self._write_file, self._write_pos = orig_file, orig_pos
        self._read_end = None
        if not restored:   # never append after bytes that could not be removed
            if self._wfd >= 0:
                self._rolled[orig_file] = self._wfd   # still owed an fsync
            self._wfd = -1
            self._write_file = max(num for num, _ in touched) + 1
            self._write_pos = 0

    # ---------------------------------------------------------------- reading

    def read(self) -> bytes | None:
        """The next record, consumed; ``None`` when the queue is empty."""
        records = self.read_many(1)
        return records[0] if records else None

    def read_many(self, max_count: int) -> list[bytes]:
        """Up to ``max_count`` records in order, consumed. Corrupt files are skipped (logged)."""
        out = self.peek_many(max_count)
        self.commit()
        return out

    def peek_many(self, max_count: int) -> list[bytes]:
        """Up to ``max_count`` records after those already peeked, not yet consumed: a sync
        persists the read position of the last ``commit``, so a crash before it reads them
        again (duplicates, never loss). ``depth`` already leaves them out."""
        out: list[bytes] = []
        if max_count <= 0:
            return out
        with self._lock:
            self._check_open()
            due = self._read_locked(max_count, out)
            self._depth -= len(out)
            self._pending += len(out)
            if (self._read_file, self._read_pos) == (self._write_file, self._write_pos) and self._depth:
                self._log.error("DISKQUEUE(%s) %s depth at tail (%d), %s, resetting 0...", self.name,
                                *(("negative", self._depth, "metadata corruption") if self._depth < 0
                                  else ("positive", self._depth, "data loss")))
                self._depth = 0
                due = True
            self._sync_due = self._sync_due or due
        return out

    def commit(self, count: int | None = None) -> None:
        """Consume every record peeked so far (the caller has stored them elsewhere), or
        only the first ``count`` of them: the others are read again by the next peek."""
        with self._lock:
            self._check_open()
            if count is not None and count < self._pending:
                self._unpeek(count)
            self._committed = (self._read_file, self._read_pos)
            dirtied = not self._count and self._pending > 0
            self._count += self._pending
            self._pending = 0
            due, self._sync_due = self._sync_due or self._count >= self._sync_every, False
        if dirtied:
            self._dirtied()
        if due:
            self._sync_requested()

    @property
    def read_position(self) -> tuple[int, int]:
        """(file number, offset) just past the last record peeked: what ``committed_position``
        becomes when everything peeked is committed."""
        return self._read_file, self._read_pos

    @property
    def committed_position(self) -> tuple[int, int]:
        """(file number, offset) of the last ``commit``: where a reopened queue goes on
        reading once a sync has persisted it."""
        return self._committed

    @property
    def write_position(self) -> tuple[int, int]:
        """(file number, offset) where the next record will be written."""
        return self._write_file, self._write_pos

    def records_after(self, position: tuple[int, int]) -> int:
        """Whole records written from ``position`` (a ``write_position`` this queue had) to
        the end of what is written: after a crash, how many of an append that began there
        reached the files (a torn one is cut off at open)."""
        file_num, pos = position
        with self._lock:
            self._check_open()
            end = (self._write_file, self._write_pos)
            if not position < end:
                return 0
            return sum(self._scanner.scan_file(num, pos if num == file_num else 0,
                                               end[1] if num == end[0] else None)[0]
                       for num in range(file_num, end[0] + 1))

    def skip_to(self, position: tuple[int, int]) -> int:
        """Go on reading at ``position``, a ``committed_position`` this queue had before a
        crash that came before the sync persisting it (the owner kept it where a crash
        cannot lose it). Call it after opening, before any peek. The records in between are
        consumed: counted out of the depth, their files deleted by the next sync (which
        persists the new position). Returns how many were skipped; 0, with nothing changed,
        when ``position`` is not a record boundary between the read and the write position."""
        file_num, pos = position
        with self._lock:
            self._check_open()
            start = (self._read_file, self._read_pos)
            if self._pending or not start < position <= (self._write_file, self._write_pos):
                return 0
            skipped = 0
            removed = False  # a file read past was removed before a sync could persist the move
            for num in range(start[0], file_num + 1):
                removed = removed or (num < file_num and not os.path.exists(self._path(num)))
                count, end, why = self._scanner.scan_file(
                    num, start[1] if num == start[0] else 0, pos if num == file_num else None)
                if why is not Stop.END or (num == file_num and end != pos):
                    self._log.error("DISKQUEUE(%s) cannot resume reading at %d:%d (not a record "
                                    "boundary); reading from %d:%d", self.name, *position, *start)
                    return 0
                skipped += count
            self._reset_reader()
            self._consumed += range(start[0], file_num)
            self._read_file, self._read_pos = self._committed = position
            if removed:  # the depth on disk still counts its records: count what is left
                self._depth = (self._scanner.count_from(file_num, self._write_file, self._write_pos)
                               - self._scanner.scan_file(file_num, 0, pos)[0])
            else:
                self._depth = max(0, self._depth - skipped)
            dirtied = not self._count and skipped > 0
            self._count += skipped  # the next sync persists the position
        if dirtied:
            self._dirtied()
        self._log.info("DISKQUEUE(%s) resuming reading at %d:%d, past %d record(s) read before "
                       "the last sync", self.name, file_num, pos, skipped)
        return skipped

    def _unpeek(self, keep: int) -> None:
        """Move the reader back to the committed position and past ``keep`` records again
        (the first ``keep`` peeked; they parsed a moment ago). Only on a partial commit."""
        self._reset_reader()
        self._read_file, self._read_pos = self._committed
        self._consumed = [num for num in self._consumed if num < self._read_file]
        self._depth += self._pending
        self._pending = 0
        again: list[bytes] = []
        self._sync_due = self._read_locked(keep, again) or self._sync_due
        self._depth -= len(again)
        self._pending = len(again)

    def _read_locked(self, max_count: int, out: list[bytes]) -> bool:
        """Fill ``out``; returns whether a sync is due (a file finished or skipped)."""
        due = False
        while len(out) < max_count:
            try:
                if self._read_file == self._write_file:
                    end = self._write_pos
                    if self._read_pos >= end:
                        break
                else:
                    end = self._read_end if self._read_end is not None else self._measure_read_file()
                    if self._read_pos >= end:
                        self._finish_read_file()
                        due = True
                        continue
                self._read_step(end, max_count, out)
            except (_Corrupt, FileNotFoundError) as exc:
                self._skip_bad_file(exc)
                # the caller subtracts what was read before the corruption
                self._depth = len(out) + self._scanner.count_from(
                    self._read_file, self._write_file, self._write_pos)
                due = True
            except OSError as exc:      # EMFILE, EIO...: not the file's fault, keep it
                self._reset_reader()
                if not out:
                    raise DiskQueueError(f"DISKQUEUE({self.name}) failed to read - {exc}") from exc
                self._log.error("DISKQUEUE(%s) failed to read - %s", self.name, exc)
                break
        return due

    def _read_step(self, end: int, max_count: int, out: list[bytes]) -> None:
        """Parse records from the buffer, or refill it so the next step can."""
        start, buf = self._rbuf_start, self._rbuf
        idx = self._read_pos - start
        stop = min(len(buf), end - start)
        need = HEADER_SIZE
        if 0 <= idx < stop:
            pos, why = fmt.parse_records(buf, idx, stop, self._min_size, self._max_size,
                                         max_count - len(out), out)
            self._read_pos = start + pos
            if why is Stop.CORRUPT:
                raise _Corrupt(f"invalid message read size ({HEADER.unpack_from(buf, pos)[0]})")
            if why is not Stop.PARTIAL:
                return
            if pos + HEADER_SIZE <= stop:
                need += HEADER.unpack_from(buf, pos)[0]
        n = min(max(READ_BUFFER, need), end - self._read_pos)
        if n < need:
            raise _Corrupt(f"record of {need} bytes at {self._read_pos} runs past the end ({end})")
        data = os.pread(self._open_read_file(), n, self._read_pos)
        if len(data) < need:
            raise _Corrupt(f"unexpected end of file at {self._read_pos + len(data)}")
        self._rbuf, self._rbuf_start = data, self._read_pos

    def _open_read_file(self) -> int:
        if self._rfd < 0:
            self._rfd = os.open(self._path(self._read_file), os.O_RDONLY)
        return self._rfd

    def _measure_read_file(self) -> int:
        self._read_end = os.fstat(self._open_read_file()).st_size
        return self._read_end

    def _reset_reader(self) -> None:
        _close(self._rfd)
        self._rfd = -1
        self._rbuf, self._rbuf_start, self._read_end = b"", 0, None

    def _finish_read_file(self) -> None:
        self._reset_reader()
        self._consumed.append(self._read_file)   # deleted by the sync that persists the move
        self._read_file += 1
        self._read_pos = 0

    def _skip_bad_file(self, exc: BaseException) -> None:
        bad = self._path(self._read_file)
        self._log.error("DISKQUEUE(%s) reading at %d of %s - %s", self.name, self._read_pos, bad, exc)
        self._reset_reader()
        if self._read_file == self._write_file:
            _close(self._wfd)
            self._wfd = -1
            self._write_file += 1
            self._write_pos = 0
        try:
            os.rename(bad, bad + ".bad")
            self._log.warning("DISKQUEUE(%s) jump to next file and saving bad file as %s.bad",
                              self.name, bad)
        except FileNotFoundError:
            self._log.warning("DISKQUEUE(%s) %s is missing, jump to next file", self.name, bad)
        except OSError as err:
            self._log.error("DISKQUEUE(%s) failed to rename bad file %s - %s", self.name, bad, err)
        self._read_file += 1
        self._read_pos = 0

    # ---------------------------------------------------------------- durability

    def sync(self) -> None:
        """fsync the data files written since the last sync, then persist the metadata atomically.

        Safe to run in a worker thread while the owner keeps calling the other methods.
        Raises ``DiskQueueError``; the next sync retries.
        """
        with self._lock:
            if self._closed:
                return
            self._seq += 1
            seq = self._seq
            meta = Meta(self._depth + self._pending, *self._committed, self._write_file, self._write_pos)
            try:
                fds = [*self._rolled.values(), *([os.dup(self._wfd)] if self._wfd >= 0 else [])]
            except OSError as exc:
                raise DiskQueueError(f"DISKQUEUE({self.name}) failed to sync - {exc}") from exc
            self._rolled = {}
            consumed = [num for num in self._consumed if num < self._committed[0]]
            self._consumed = [num for num in self._consumed if num >= self._committed[0]]
            self._count = 0
            self._last_sync_ns = time.monotonic_ns()
        try:
            for fd in fds:
                os.fsync(fd)
            with self._sync_lock:
                if seq > self._persisted_seq:   # else a newer state is already on disk
                    try:
                        self._persist(meta)
                    except OSError:
                        if not consumed:
                            raise
                        # a full disk: give back the space consumption freed, then try again
                        # (if that fails too, the files stay removed; see the module doc)
                        self._remove(consumed)
                        consumed = []
                        self._persist(meta)
                    self._persisted_seq = seq
                self._remove(consumed)
                consumed = []
        except OSError as exc:
            with self._lock:
                self._count = max(self._count, 1)
                self._consumed[:0] = consumed
            raise DiskQueueError(f"DISKQUEUE({self.name}) failed to sync - {exc}") from exc
        finally:
            for fd in fds:
                _close(fd)

    def _remove(self, files: list[int]) -> None:
        for num in files:
            _unlink(self._path(num), self._log)

    def sync_wanted(self, now_ns: int) -> bool:
        """Anything happened and ``sync_timeout`` has passed since the last sync (or attempt)."""
        return not self._closed and self._count > 0 and now_ns - self._last_sync_ns >= self._sync_timeout_ns

    @property
    def unsynced(self) -> bool:
        """Anything happened since the last sync: ``sync_wanted`` becomes true with time."""
        return not self._closed and self._count > 0

    def _dirtied(self) -> None:
        if self.on_dirty is not None:
            self.on_dirty()

    def _sync_requested(self) -> None:
        """A sync is due (``sync_every``, a roll, a file read past): ``on_sync_due`` runs it
        elsewhere (a worker thread: ``pynsqd.shard.syncer``) when set, else it runs here."""
        if self.on_sync_due is not None:
            self.on_sync_due()
        else:
            self._sync_logged()

    def _sync_logged(self) -> None:
        try:
            self.sync()
        except DiskQueueError as exc:
            self._log.error("%s", exc)

    def _persist(self, meta: Meta, durable: bool = True) -> None:
        path = os.path.join(self._dir, fmt.meta_file_name(self.name))
        tmp = f"{path}.{random.getrandbits(63)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                _pwrite_all(fd, meta.encode(), 0)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:
            _unlink(tmp, self._log)
            raise

    # ---------------------------------------------------------------- lifecycle

    def empty(self) -> None:
        """Drop every record: delete the data files and the metadata, continue in a new file."""
        with self._lock:
            self._check_open()
            self._log.info("DISKQUEUE(%s): emptying", self.name)
            self._close_fds()
            last = self._write_file
            self._write_file += 1
            self._read_file, self._read_pos, self._write_pos = self._write_file, 0, 0
            self._depth = self._count = self._pending = 0
            self._committed = (self._read_file, self._read_pos)
            self._consumed = []
            self._seq += 1
            seq = self._seq
        with self._sync_lock:
            self._persisted_seq = max(self._persisted_seq, seq)
            for num in self._scanner.data_files():
                if num <= last:
                    _unlink(self._path(num), self._log)
            _unlink(os.path.join(self._dir, fmt.meta_file_name(self.name)), self._log)

    def delete(self) -> None:
        """Close without syncing and remove every file of this queue, ``.bad`` files included."""
        with self._lock:
            self._log.info("DISKQUEUE(%s): deleting", self.name)
            self._closed = True
            self._close_fds()
        with self._sync_lock:
            self._persisted_seq = 1 << 62
            for path in self._scanner.all_files():
                _unlink(path, self._log)

    def close(self) -> None:
        """Sync and release the files; idempotent. Raises ``DiskQueueError`` if the final sync fails."""
        if self._closed:
            return
        self._log.info("DISKQUEUE(%s): closing", self.name)
        try:
            self.sync()
        finally:
            with self._lock:
                self._closed = True
                self._close_fds()

    def release(self) -> None:
        """Persist the metadata and close the files without an fsync, for another process of
        this host to open the queue next (a shard's replacement, ``shard/transfer.py``): it
        reads the same page cache, and syncs what is unsynced. Files read past are removed.
        Idempotent. Raises ``DiskQueueError`` if the metadata cannot be written (the next
        process then repairs from the files, as after a crash)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            meta = Meta(self._depth + self._pending, *self._committed, self._write_file, self._write_pos)
            consumed = [num for num in self._consumed if num < self._committed[0]]
            self._consumed = []
            self._close_fds()
            self._seq += 1
            seq = self._seq
        try:
            with self._sync_lock:
                self._persist(meta, durable=False)
                self._persisted_seq = seq
                self._remove(consumed)
        except OSError as exc:
            raise DiskQueueError(f"DISKQUEUE({self.name}) failed to hand over - {exc}") from exc

    def _close_fds(self) -> None:
        self._reset_reader()
        for fd in [self._wfd, *self._rolled.values()]:
            _close(fd)
        self._wfd = -1
        self._rolled = {}

    def _check_open(self) -> None:
        if self._closed:
            raise DiskQueueError(f"DISKQUEUE({self.name}) is closed")

    def _path(self, file_num: int) -> str:
        return os.path.join(self._dir, fmt.data_file_name(self.name, file_num))


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        written = os.pwrite(fd, view[done:], offset + done)
        if written <= 0:
            raise OSError(errno.EIO, "write returned 0 bytes")
        done += written


def _close(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


def _unlink(path: str, log: logging.Logger) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("failed to remove %s - %s", path, exc)

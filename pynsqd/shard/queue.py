"""A topic's or channel's messages: a shared-memory log up to ``--mem-queue-size`` ready
messages (grown to hold them, within its ceiling: ``pynsqd.shm.sizing``), then a backend.

``MessageQueue`` owns one ``pynsqd.shm.log.MessageLog`` (in a shared-memory segment, so it
outlives the process) and the backend that takes what the log cannot hold: a disk queue for
durable names, or ``DropBackend`` for ``#ephemeral`` ones, which drops the overflow as NSQ
does. The queue is one FIFO across the two: while the backend holds messages, new ones go
behind them (to the backend too), even when the log has room again, because consumers are
served from the log first and the backend is read only once the log has nothing ready
(nsqd's random select between its memory channel and its disk queue gives no order here;
pynsqd keeps publish order). Spilled messages are moved back into the log before they are
delivered, so every message in flight has a record in shared memory; so has every deferred
one, except one that found the log full (journaled on disk and held in process memory,
below).

Counts kept here (the log itself only knows bytes): ``ready`` (READY records in the log),
``live`` (records not DONE). ``take`` walks a delivery cursor over the log;
``finish`` marks a record DONE, and every ``RELEASE_EVERY`` of those the front of the log is
released. When the log is out of room while most of it is DONE behind a long-lived record
at the front, ``make_room`` moves that record to the write end (``on_move`` tells the
owner, which holds positions of in-flight and deferred messages).

A durable queue (one with ``files``, its sidecar and journal: ``deferredfiles.py``) leaves
nothing in shared memory on a clean ``close`` (``_persist``, step 3 of docs/architecture.md's
"Clean shutdown"): the segment is unlinked only once its records are on disk, so a kill -9
in between gives duplicates, never loss, and a reboot after a clean stop loses nothing. A
deferred message that finds no room in the log while the process runs is journaled before it
is acknowledged; the owner holds it in memory meanwhile. After a restart the owner adopts
the log in steps while it serves (``start_recovery``, then ``recover_step`` until it says
done: ``pynsqd.shm.logrecovery`` says what holds meanwhile); ``start_recovery`` loads the
sidecar and the journal back as deferred records (after the segment's own records).
Spilled messages come back into the log through ``refill.py``, exactly once across a kill -9.

A cross-shard batch (``put_many`` or ``append`` with a ``Unit``) may be applied again: the
queue skips the messages of it that it holds (``shard/unit.py``: its ``Tally``, kept in its
segment too by ``store.ApplyMark``, opened just before an append and closed after it).
``start_recovery`` adds what an append the crash interrupted put in the log (past its write
index then), the disk queue (past its write position then) or the journal (past its size).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Container, Sequence
from typing import Any

from pynsqd.shard.backend import Backend, DropBackend
from pynsqd.shard.deferredfiles import DeferredFiles
from pynsqd.shard.refill import Refill
from pynsqd.shard.unit import Tally, Unit
from pynsqd.shm import sidecar as sidecar_file
from pynsqd.shm.frames import Frames, RingError
from pynsqd.shm.log import DEFERRED, DONE, IN_FLIGHT, READY, READY_HEADER, MessageLog
from pynsqd.shm.logrecovery import Deferred, LogScan
from pynsqd.shm.segment import Segment
from pynsqd.shm.store import ApplyMark, open_log

logger = logging.getLogger("pynsqd.shard")


RELEASE_EVERY = 256
PERSIST_BATCH = 4096  # records per backend write when a queue moves to disk on exit
MoveHook = Callable[[int, int, int, bytes], None]
Grow = Callable[[MessageLog, int], "int | None"]  # (log, bytes needed) -> index shift, or None


class MessageQueue:
    """Ready messages in a shared-memory log, then the backend. ``put_many`` may raise the
    backend's error (then nothing was stored)."""

    __slots__ = ("_applied", "_done", "again", "backend", "cursor", "files", "grow", "limit", "live", "log", "on_move",
                 "ready", "recovering", "refill", "scan", "segment", "shifted", "tally")

    def __init__(self, log: MessageLog, limit: int, backend: Backend, segment: Segment | None = None,
                 recovering: bool = False, sidecar: str | None = None) -> None:
        self.log = log
        # where deferred messages wait outside the log (durable queues only)
        self.files = None if sidecar is None else DeferredFiles(sidecar)
        self.recovering = recovering  # the owner calls ``start_recovery`` first
        self.scan: LogScan | None = None  # while the log a previous process left is walked
        self.shifted = 0  # how far the log's indices moved back in all (growth), for walkers
        self.again: dict[int, None] = {}  # READY records behind the cursor (requeued in place)
        self.segment = segment
        self.limit = limit
        self.backend = backend
        self.cursor = log.read_index
        self.ready = 0
        self.live = 0
        self._done = 0
        self.on_move: MoveHook | None = None
        self.grow: Grow | None = None  # makes the log larger (``shm/sizing.Grower``), if it may
        self.refill = Refill(backend, segment)
        # how much of the last cross-shard batch put here it holds (``shard/unit.py``), and the same in the segment
        self.tally = Tally()
        self._applied = None if segment is None or isinstance(backend, DropBackend) else ApplyMark(segment)

    def __len__(self) -> int:
        if self.scan is not None:
            return self.ready + self.scan.unscanned + self.backend.depth
        return self.ready + self.backend.depth

    @property
    def scanning(self) -> bool:
        """True while the log a previous process left is being recovered."""
        return self.scan is not None

    def _end(self) -> int | None:
        """How far delivery and release may go in the log: the scan's cursor while it runs."""
        return None if self.scan is None else self.scan.cursor

    @property
    def backend_depth(self) -> int:
        return self.backend.depth

    def start_recovery(self) -> Deferred:
        """Adopt what a previous process left: its log is walked by ``recover_step`` from
        here on. Returns [(pos, due wall ns, message)] of the deferred messages of the sidecar
        and the journal (appended to the log now; pos -1 for one that found no room)."""
        self.recovering = False
        if self._applied is not None:  # first: nothing below may append before it counts
            self.tally = self._recovered_tally(self._applied)
        # the mark says where the backend resumes given the log's write index as it was left
        self.scan = LogScan(self.log, self.refill.resume_position(self.log.write_index))
        self.cursor = self.log.read_index
        if self.files is not None:
            return self.files.load(self._place_loaded)
        return []

    def _place_loaded(self, message: bytes, due: int) -> int | None:
        """A deferred message of the sidecar or journal, into the log (no ``make_room``: the
        owner does not know the recovered positions yet)."""
        pos = self.log.append(message, DEFERRED, due)
        if pos is not None:
            self.live += 1
        return pos

    def recover_step(self, max_count: int) -> Deferred:
        """Recover up to ``max_count`` more records of the log: the deferred ones found
        [(pos, due wall ns, message)]; ``scanning`` is False once the whole log is done.
        ``RingError`` if a frame is corrupt."""
        scan = self.scan
        if scan is None:
            return []
        ready, live, deferred = scan.step(max_count)
        self.ready += ready
        self.live += live
        if scan.done:
            self.scan = None
            self.refill.skip_to(scan.resume)
        return deferred

    def _recovered_tally(self, mark: ApplyMark) -> Tally:
        """The tally a previous process left; if it was killed while appending a batch's
        messages, those that reached the log, the disk queue and the journal are counted in."""
        saved = mark.load()
        if saved is None:
            return Tally()
        src, first, held, write_index, backend, journal = saved
        if write_index >= 0:
            try:
                held += self.log.count_from(write_index)
            except RingError as exc:  # never: nothing moves the log's indices back before it
                logger.error("%r: cannot count an interrupted append - %s", self.log, exc)
            held += self.backend.records_after(backend)
            if journal >= 0 and self.files is not None:
                held += sidecar_file.journal_records_after(self.files.journal, journal)
            mark.save(src, first, held)
        return Tally(src, first, held)

    # --- in ---------------------------------------------------------------------------
    def put_many(self, records: Sequence[bytes], unit: Unit | None = None) -> None:
        """Store ``records`` ready: the log up to ``limit`` ready messages and its bytes, the
        backend past it, and the backend alone while it holds messages (they are older, and
        the log is served first; only a backend that refuses the write lets new ones into
        the log ahead of its messages). A run of READY frames (``Frames``: a cross-shard
        batch, framed by its producer) is appended with one copy when the path below would
        append it whole with no ``make_room`` (room for every message, 31 bytes a message to
        spare) and it fits before the log's end: the same bytes that path writes. Otherwise
        it takes that path with the messages. With ``unit`` (they are a cross-shard batch's,
        from message ``unit.start`` on) the ones this queue holds already are skipped."""
        if unit is None:
            self._put(records, None, 0)
            return
        held = self.tally.skip(unit, len(records))
        if held:
            if held == len(records):
                return
            records = (records.records() if isinstance(records, Frames) else records)[held:]
        before = unit.start + held
        try:
            self._put(records, unit, before)
        except Exception:
            self._close_unit(unit, before)
            raise
        self.tally.took(unit, before + len(records))
        self._close_unit(unit, before + len(records))

    def _open_unit(self, unit: Unit, held: int, journal: int = -1) -> None:
        """Just before appending messages of ``unit`` past the first ``held``: the log's and
        the backend's ends (and the journal's size, before an append to it) in the segment,
        so a restart can count what got in."""
        if self._applied is not None:
            self._applied.save(unit.src, unit.first, held, self.log.write_index, self.backend.write_position,
                               journal)

    def _close_unit(self, unit: Unit, held: int) -> None:
        if self._applied is not None:
            self._applied.save(unit.src, unit.first, held)

    def _put(self, records: Sequence[bytes], unit: Unit | None, held: int) -> None:
        log = self.log
        room = self.limit - self.ready - (0 if self.scan is None else self.scan.unscanned)
        if self.backend.depth:
            plain = records.records() if type(records) is Frames else records
            try:
                if unit is not None:
                    self._open_unit(unit, held)
                self.backend.put_many(plain)
                return
            except Exception:
                if room <= 0:
                    raise
                records = plain  # the disk refuses writes: the log takes them, out of order
        elif len(records) == 1 and room > 0 and log.put_ready(records[0]):  # one message: PUB, /pub
            self.ready += 1
            self.live += 1
            return
        if type(records) is Frames:
            n = len(records)
            # frames are >= 24 bytes a message more than the messages: spare is >= need below
            spare = log.free_bytes - (records.end - records.start) - 7 * n
            if room >= n and spare >= 0 and records.lead == READY_HEADER:
                if unit is not None:
                    self._open_unit(unit, held)
                if log.put_frames(records):
                    self.ready += n
                    self.live += n
                    return
            records = records.records()
        if room <= 0:
            if unit is not None:
                self._open_unit(unit, held)
            self.backend.put_many(records)
            return
        part = records if room >= len(records) else records[:room]
        need = 31 * len(part) + sum(map(len, part))  # frames are at most 31 bytes more
        if log.free_bytes < need and not self.make_room(need):
            self.make_larger(need)
        mark = log.mark()
        if unit is not None:  # after ``make_room`` and ``make_larger``: they move the log's end
            self._open_unit(unit, held)
        n = log.append_ready(part)
        if n < len(records):
            try:
                self.backend.put_many(records[n:])
            except Exception:
                log.rollback(mark)  # store nothing
                raise
        self.ready += n
        self.live += n

    def append(self, record: bytes, state: int, due: int, unit: Unit | None = None) -> int | None:
        """Store one deferred record (``due`` wall-clock ns); its position, or None without
        room in the log: then a durable queue appends it to its journal (raising
        ``OSError`` when it cannot: nothing stored) and the owner holds it in memory, and
        calls ``unjournal`` once it is stored elsewhere. ``unit``: it is message
        ``unit.start`` of a cross-shard batch (the caller asked ``tally.skip`` first)."""
        log = self.log
        frame = log.frame_of(len(record))
        held = -1 if unit is None else unit.start
        try:
            if unit is not None:
                self._open_unit(unit, held)
            pos = log.append(record, state, due)
            if pos is None and (self.make_room(frame) or self.make_larger(frame)):
                if unit is not None:
                    self._open_unit(unit, held)
                pos = log.append(record, state, due)
            if pos is not None:
                self.live += 1
            elif self.files is not None:
                if unit is not None:
                    self._open_unit(unit, held, sidecar_file.journal_size(self.files.journal))
                self.files.hold(due, record)
        except Exception:
            if unit is not None:
                self._close_unit(unit, held)
            raise
        if unit is not None:
            self.tally.took(unit, held + 1)
            self._close_unit(unit, held + 1)
        return pos

    def unjournal(self, messages: Sequence[bytes]) -> None:
        """``messages`` that ``append`` journaled are stored elsewhere now (the log, the
        backend, a channel): struck off the journal (one write), which is removed when none
        is left."""
        if self.files is not None:
            self.files.strike(messages)

    # --- out --------------------------------------------------------------------------
    def mark_in_flight(self, pos: int, attempts: int) -> None:
        """The READY record at ``pos`` (from ``take``) is delivered: IN_FLIGHT, ``attempts``
        written into its message."""
        self.log.deliver(pos, attempts)

    def defer(self, pos: int, due: int) -> None:
        """The in-flight record at ``pos`` waits until ``due`` (wall-clock ns), in place."""
        self.log.set_deferred(pos, due)

    def message_at(self, pos: int) -> bytes:
        """The message of the record at ``pos``, attempts as stored."""
        return self.log.message_at(pos)[2]

    def live_ids(self, among: Container[bytes] | None = None) -> set[bytes]:
        """Ids of the messages in the log not yet done (only those in ``among``, if given);
        one walk over the whole log at once (``live_ids_run`` walks it in steps)."""
        out: set[bytes] = set()
        cursor = self.log.read_index
        while cursor < self.log.write_index:
            cursor = self.log.live_ids_run(cursor, 1 << 20, among, out)
        return out

    def live_ids_run(self, cursor: int, max_count: int, among: Container[bytes] | None, out: set[bytes]) -> int:
        """``MessageLog.live_ids_run``: add to ``out`` the live ids among the next
        ``max_count`` records from index ``cursor`` (``shifted`` says how far indices moved
        since); the cursor after them, or -1 past the write end."""
        cursor = self.log.live_ids_run(cursor, max_count, among, out)
        return cursor if cursor < self.log.write_index else -1

    def timestamp_at(self, pos: int) -> int:
        """The publish time (ns) of the message at ``pos``."""
        return self.log.timestamp_at(pos)

    def holds(self, pos: int, msg_id: bytes) -> bool:
        """``pos`` holds ``msg_id`` in flight, as the process this queue was handed over
        from left it (``adopt``)."""
        log = self.log
        return 0 <= pos < log.capacity and log.states[pos] == IN_FLIGHT and log.id_at(pos) == msg_id

    # --- handed over between two processes of this host (``shard/transfer.py``) -------------
    def export(self) -> dict[str, Any]:
        """What only this process knows of the log (it is never walked while one of this
        process's own runs: the caller waited for ``scanning`` to end)."""
        tally = self.tally
        return {"ready": self.ready, "live": self.live, "cursor": self.cursor, "again": list(self.again),
                "done": self._done, "largest": self.refill.largest,
                "journaled": 0 if self.files is None else self.files.journaled,
                "tally": [tally.src, tally.first, tally.held]}

    def adopt(self, state: dict[str, Any]) -> None:
        """Carry on from ``export`` of the process that handed this queue over: the log is
        exactly as it left it, so nothing is walked, and its sidecar and journal are not
        loaded again (its in-memory deferred messages come with the rest of its state)."""
        self.recovering = False
        self.scan = None
        self.ready, self.live, self.cursor = int(state["ready"]), int(state["live"]), int(state["cursor"])
        self.again = dict.fromkeys(int(pos) for pos in state["again"])
        self._done, self.refill.largest = int(state["done"]), int(state["largest"])
        if self.files is not None:
            self.files.journaled = int(state["journaled"])
        self.tally = Tally(*map(int, state.get("tally", (-1, 0, 0))))  # what of a cross-shard batch it holds

    def requeue(self, pos: int) -> None:
        """Make the (in-flight or deferred) record at ``pos`` ready again, in place."""
        self.log.set_state(pos, READY)
        self.again[pos] = None
        self.ready += 1

    def _pop_again(self, count: int) -> list[int]:
        """Up to ``count`` positions of the records requeued behind the cursor, oldest first."""
        again = self.again
        positions = list(again) if len(again) <= count else list(again)[:count]
        for pos in positions:
            del again[pos]
        return positions

    def take(self, count: int) -> tuple[list[int], list[bytes]]:
        """Up to ``count`` ready messages and their positions; the caller marks them."""
        if self.again:
            positions = self._pop_again(count)
            message_at = self.log.message_at
            self.ready -= len(positions)
            return positions, [message_at(pos)[2] for pos in positions]
        if self.ready or self._refilled(count):
            positions, messages, self.cursor = self.log.walk(self.cursor, count, end=self._end())
            self.ready -= len(positions)
            if positions:
                return positions, messages
            if self.scan is None:
                self.ready = 0  # the count drifted (it never should); trust the log
        return [], []

    def deliver(self, count: int, out: bytearray, ids: list[bytes]) -> list[int]:
        """``take`` and mark in one pass: up to ``count`` ready messages become IN_FLIGHT
        (attempts counted up in the log), their frames are appended to ``out`` and their
        ids to ``ids``; returns their positions."""
        log = self.log
        if self.again:
            positions = self._pop_again(count)
            log.deliver_at(positions, out, ids)
        elif self.ready or self._refilled(count):
            positions, self.cursor = log.deliver_ready(self.cursor, count, out, ids, self._end())
            if not positions:
                if self.scan is None:
                    self.ready = 0  # the count drifted (it never should); trust the log
                return positions
        else:
            return []
        self.ready -= len(positions)
        return positions

    def _refilled(self, count: int) -> bool:
        """Nothing ready in the log: move up to ``count`` from the backend; True if any.
        (Not while the log is recovered: its older records come first.)"""
        if self.backend.depth and self.scan is None:
            self.refill.run(self, count)
        return self.ready > 0

    def took_in(self, count: int) -> None:
        """``count`` READY records were appended to the log by its refill."""
        self.ready += count
        self.live += count

    def finish(self, pos: int) -> None:
        """The record at ``pos`` is done (FIN, sampled out, handed on by a topic)."""
        self.log.states[pos] = DONE
        self._finished(1)

    def finish_many(self, positions: Sequence[int]) -> None:
        """The records at ``positions`` are done (a run of FINs): one state byte each."""
        states = self.log.states
        for pos in positions:
            states[pos] = DONE
        self._finished(len(positions))

    def _finished(self, count: int) -> None:
        """``count`` records were marked DONE; every ``RELEASE_EVERY`` of them the front of
        the log is released."""
        self.live -= count
        self._done += count
        if self._done >= RELEASE_EVERY:
            self._done = 0
            self.log.release(self._end())

    # --- space ------------------------------------------------------------------------
    def make_room(self, frame: int) -> bool:
        """Release DONE records, then move live ones that block the front; True if a frame
        of ``frame`` bytes may fit now."""
        log = self.log
        log.release(self._end())
        self._done = 0
        moved = 0
        while (log.free_bytes < frame + 8 and self.scan is None and self.live < len(log) // 2
               and moved < 4096):
            front = log.front()
            if front is None:
                break
            pos, state, size = front
            if state == DONE:
                log.release()
                continue
            if log.free_bytes < 2 * size:
                break
            state, due, message = log.message_at(pos)
            new = log.append(message, state, due)
            if new is None:
                break
            log.set_state(pos, DONE)
            if state == READY:
                self.again.pop(pos, None)  # the cursor finds the new copy
            elif self.on_move is not None:
                self.on_move(pos, new, state, message)
            moved += 1
            log.release()
        if self.cursor < log.read_index:
            self.cursor = log.read_index
        return log.free_bytes >= frame

    def make_larger(self, need: int) -> bool:
        """Make the log larger so ``need`` more bytes fit (``grow``); True if they do now."""
        if self.grow is None:
            return False
        shift = self.grow(self.log, need)
        if shift is None:
            return False
        self.cursor -= shift  # the log's indices moved back by ``shift``; positions did not
        self.shifted += shift
        if self.scan is not None:
            self.scan.shift(shift)
        return self.log.free_bytes >= need

    # --- admin ------------------------------------------------------------------------
    def empty(self) -> None:
        self.scan = None  # nothing left to recover
        self.log.reset()
        self.cursor = self.log.read_index
        self.ready = self.live = self._done = 0
        self.again.clear()
        self.backend.empty()
        self.refill.save_mark()
        if self.files is not None:
            self.files.remove()

    def close(self, delete: bool = False, deferred: Sequence[tuple[int, bytes]] = ()) -> None:
        """Shut down. ``delete`` removes everything (disk files, sidecar, segment). Otherwise a
        durable queue moves every live record to disk (see the module doc) and removes its
        segment; a queue without a sidecar detaches and its segment stays for the next
        process. ``deferred`` are [(due wall ns, message)] the owner holds outside the log
        (no room in shared memory): they go to the sidecar, or ready to the backend."""
        unlink = delete
        if delete:
            self.scan = None
            self.backend.delete()  # its files include the sidecar (``all_files_pattern``)
        elif self.files is not None and self.segment is not None:
            unlink = self._persist(self.files, deferred)
        else:
            if deferred:
                try:
                    self.backend.put_many([message for _, message in deferred])
                    self.unjournal([message for _, message in deferred])
                except Exception:
                    logger.exception("%d deferred messages lost on exit", len(deferred))
            self.backend.close()
        self.log.close()
        if self.segment is not None:
            if unlink:
                self.segment.unlink()
            self.segment.close()

    def hand_over(self) -> None:
        """Let another process of this host carry on with this queue (a shard's replacement,
        ``shard/transfer.py``): the backend's files are closed with their metadata written,
        the segment is left as it is (in-flight and deferred records in place; the next
        process recovers it), the journal stays."""
        try:
            self.backend.release()
        except Exception:  # the next process repairs from the files, as after a crash
            logger.exception("failed to hand %r over cleanly", self.backend)
        self.log.close()
        if self.segment is not None:
            self.segment.close()

    def _persist(self, files: DeferredFiles, held: Sequence[tuple[int, bytes]]) -> bool:
        """Write every live record to disk; True once all of it is durable. On failure the
        segment keeps them (and the next process may see some twice)."""
        try:
            ready, deferred = self.log.live_records()  # in flight or not, recovered or not
            if self.scan is not None:  # the log proved whole: the backend resumes past its records
                self.refill.skip_to(self.scan.resume)
                self.scan = None
            for start in range(0, len(ready), PERSIST_BATCH):
                self.backend.put_many(ready[start:start + PERSIST_BATCH])
            self.backend.close()  # syncs the data and persists the metadata
            files.save(deferred + list(held))
        except Exception:
            logger.exception("failed to move %r to disk; its messages stay in shared memory", self.backend)
            try:
                self.backend.close()
            except Exception as exc:  # the same failure, most likely; the segment keeps the messages
                logger.error("failed to close %r - %s", self.backend, exc)
            return False
        return True


def segment_queue(data_path: str, limit: int, capacity: int, kind: str, name: str,
                  backend: Backend) -> MessageQueue:
    """A queue whose log is in the node's shared-memory segment for ``kind``/``name``
    (attached and marked for recovery when a previous process left it, or a clean exit
    left deferred messages in its sidecar file). ``#ephemeral`` queues have no sidecar."""
    segment, log_, existed = open_log(data_path, kind, name, capacity)
    sidecar = None if isinstance(backend, DropBackend) else sidecar_file.sidecar_path(data_path, name)
    recovering = existed or (sidecar is not None and (
        os.path.exists(sidecar) or os.path.exists(sidecar_file.journal_of(sidecar))))
    return MessageQueue(log_, limit, backend, segment, recovering=recovering, sidecar=sidecar)

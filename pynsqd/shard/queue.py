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

The queue's state and counts are ``queuestate.QueueState``; room in the log is
``queuespace.py``; carrying on from a previous process (recovery after a crash, or a
hand-over) is ``queuetakeover.py``; shutting down is ``queueexit.py``. A deferred message
that finds no room in the log while the process runs is journaled before it is
acknowledged (``deferredfiles.py``); the owner holds it in memory meanwhile. Spilled
messages come back into the log through ``refill.py``, exactly once across a kill -9.

A cross-shard batch (``put_many`` or ``append`` with a ``Unit``) may be applied again: the
queue skips the messages of it that it holds (``shard/unit.py``: its ``Tally``, kept in its
segment too by ``store.ApplyMark``, opened just before an append and closed after it).
"""

from __future__ import annotations

import os
from collections.abc import Container, Sequence
from typing import Any

from pynsqd.shard import queueexit, queuespace, queuetakeover
from pynsqd.shard.backend import Backend, DropBackend
from pynsqd.shard.queuestate import QueueState
from pynsqd.shard.unit import Unit
from pynsqd.shm import sidecar as sidecar_file
from pynsqd.shm.frames import Frames
from pynsqd.shm.log import IN_FLIGHT, READY_HEADER
from pynsqd.shm.logrecovery import Deferred
from pynsqd.shm.store import open_log


class MessageQueue(QueueState):
    """Ready messages in a shared-memory log, then the backend. ``put_many`` may raise the
    backend's error (then nothing was stored)."""

    __slots__ = ()

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
        if self.applied is not None:
            self.applied.save(unit.src, unit.first, held, self.log.write_index, self.backend.write_position,
                               journal)

    def _close_unit(self, unit: Unit, held: int) -> None:
        if self.applied is not None:
            self.applied.save(unit.src, unit.first, held)

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

    def take(self, count: int) -> tuple[list[int], list[bytes]]:
        """Up to ``count`` ready messages and their positions; the caller marks them."""
        if self.again:
            positions = self._pop_again(count)
            message_at = self.log.message_at
            self.ready -= len(positions)
            return positions, [message_at(pos)[2] for pos in positions]
        if self.ready or self._refilled(count):
            positions, messages, self.cursor = self.log.walk(self.cursor, count, end=self.delivery_end())
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
            positions, self.cursor = log.deliver_ready(self.cursor, count, out, ids, self.delivery_end())
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

    # --- admin ------------------------------------------------------------------------
    def empty(self) -> None:
        self.scan = None  # nothing left to recover
        self.log.reset()
        self.cursor = self.log.read_index
        self.ready = self.live = self.done_since_release = 0
        self.again.clear()
        self.backend.empty()
        self.refill.save_mark()
        if self.files is not None:
            self.files.remove()

    # --- elsewhere: ``queuetakeover.py``, ``queuespace.py``, ``queueexit.py`` ----------------
    def start_recovery(self) -> Deferred:
        """``queuetakeover.start_recovery``."""
        return queuetakeover.start_recovery(self)

    def recover_step(self, max_count: int) -> Deferred:
        """``queuetakeover.recover_step``."""
        return queuetakeover.recover_step(self, max_count)

    def export(self) -> dict[str, Any]:
        """``queuetakeover.export``."""
        return queuetakeover.export(self)

    def adopt(self, state: dict[str, Any]) -> None:
        """``queuetakeover.adopt``."""
        queuetakeover.adopt(self, state)

    def make_room(self, frame: int) -> bool:
        """``queuespace.make_room``."""
        return queuespace.make_room(self, frame)

    def make_larger(self, need: int) -> bool:
        """``queuespace.make_larger``."""
        return queuespace.make_larger(self, need)

    def close(self, delete: bool = False, deferred: Sequence[tuple[int, bytes]] = ()) -> None:
        """``queueexit.close``."""
        queueexit.close(self, delete, deferred)

    def hand_over(self) -> None:
        """``queueexit.hand_over``."""
        queueexit.hand_over(self)


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


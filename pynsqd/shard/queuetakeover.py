"""A queue carrying on from a previous process of this host. After a crash or a restart
it adopts the log in steps while it serves (``start_recovery``, then ``recover_step`` until
it says done: ``pynsqd.shm.logrecovery`` says what holds meanwhile); ``start_recovery``
loads the sidecar and the journal back as deferred records (after the segment's own
records) and counts in what an append of a cross-shard batch the crash interrupted put in
the log (past its write index then), the disk queue (past its write position then) or the
journal (past its size). Handed over by a running process (``shard/transfer.py``), it
takes that process's ``export`` with ``adopt`` instead, and nothing is walked."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from pynsqd.shard.queuestate import QueueState
from pynsqd.shard.unit import Tally
from pynsqd.shm import sidecar as sidecar_file
from pynsqd.shm.frames import RingError
from pynsqd.shm.log import DEFERRED
from pynsqd.shm.logrecovery import Deferred, LogScan
from pynsqd.shm.store import ApplyMark

logger = logging.getLogger("pynsqd.shard")


def start_recovery(queue: QueueState) -> Deferred:
    """Adopt what a previous process left: its log is walked by ``recover_step`` from
    here on. Returns [(pos, due wall ns, message)] of the deferred messages of the sidecar
    and the journal (appended to the log now; pos -1 for one that found no room)."""
    queue.recovering = False
    if queue.applied is not None:  # first: nothing below may append before it counts
        queue.tally = recovered_tally(queue, queue.applied)
    # the mark says where the backend resumes given the log's write index as it was left
    queue.scan = LogScan(queue.log, queue.refill.resume_position(queue.log.write_index))
    queue.cursor = queue.log.read_index
    if queue.files is not None:
        return queue.files.load(partial(place_loaded, queue))
    return []


def place_loaded(queue: QueueState, message: bytes, due: int) -> int | None:
    """A deferred message of the sidecar or journal, into the log (no ``make_room``: the
    owner does not know the recovered positions yet)."""
    pos = queue.log.append(message, DEFERRED, due)
    if pos is not None:
        queue.live += 1
    return pos


def recover_step(queue: QueueState, max_count: int) -> Deferred:
    """Recover up to ``max_count`` more records of the log: the deferred ones found
    [(pos, due wall ns, message)]; ``scanning`` is False once the whole log is done.
    ``RingError`` if a frame is corrupt."""
    scan = queue.scan
    if scan is None:
        return []
    ready, live, deferred = scan.step(max_count)
    queue.ready += ready
    queue.live += live
    if scan.done:
        queue.scan = None
        queue.refill.skip_to(scan.resume)
    return deferred


def recovered_tally(queue: QueueState, mark: ApplyMark) -> Tally:
    """The tally a previous process left; if it was killed while appending a batch's
    messages, those that reached the log, the disk queue and the journal are counted in."""
    saved = mark.load()
    if saved is None:
        return Tally()
    src, first, held, write_index, backend, journal = saved
    if write_index >= 0:
        try:
            held += queue.log.count_from(write_index)
        except RingError as exc:  # never: nothing moves the log's indices back before it
            logger.error("%r: cannot count an interrupted append - %s", queue.log, exc)
        held += queue.backend.records_after(backend)
        if journal >= 0 and queue.files is not None:
            held += sidecar_file.journal_records_after(queue.files.journal, journal)
        mark.save(src, first, held)
    return Tally(src, first, held)


def export(queue: QueueState) -> dict[str, Any]:
    """What only this process knows of the log (it is never walked while one of this
    process's own runs: the caller waited for ``scanning`` to end)."""
    tally = queue.tally
    return {"ready": queue.ready, "live": queue.live, "cursor": queue.cursor, "again": list(queue.again),
            "done": queue.done_since_release, "largest": queue.refill.largest,
            "journaled": 0 if queue.files is None else queue.files.journaled,
            "tally": [tally.src, tally.first, tally.held]}


def adopt(queue: QueueState, state: dict[str, Any]) -> None:
    """Carry on from ``export`` of the process that handed this queue over: the log is
    exactly as it left it, so nothing is walked, and its sidecar and journal are not
    loaded again (its in-memory deferred messages come with the rest of its state)."""
    queue.recovering = False
    queue.scan = None
    queue.ready, queue.live, queue.cursor = int(state["ready"]), int(state["live"]), int(state["cursor"])
    queue.again = dict.fromkeys(int(pos) for pos in state["again"])
    queue.done_since_release, queue.refill.largest = int(state["done"]), int(state["largest"])
    if queue.files is not None:
        queue.files.journaled = int(state["journaled"])
    queue.tally = Tally(*map(int, state.get("tally", (-1, 0, 0))))  # what of a cross-shard batch it holds

"""Disk-queue syncs of one shard, run on a worker thread so that no fsync stalls the loop.

Theory of operation
-------------------
A disk queue's ``sync`` (fsync of the data files written since the last one, then the
metadata replaced atomically, then the files read past removed) takes from microseconds to
seconds, depending on the disk and on how much the page cache holds. Run on the shard's
event loop, every client of the shard waited for it. ``DiskQueue.sync`` is safe to run in
another thread while the loop keeps writing and reading (it holds the queue's state lock
only to take a snapshot), so the shard hands every sync to one worker thread:

* ``request(queue)``: a sync fell due inside ``put_many``/``commit`` (``--sync-every``
  writes and reads, a roll, a file read past; ``DiskQueue.on_sync_due``) — it starts at
  once, or right after the one running for that queue;
* ``scan(now)``: from the shard's 100 ms scan, for each queue ``--sync-timeout`` after the
  activity that made it unsynced (``DiskQueue.sync_wanted``).

The scan looks only at the queues with something to sync, not at every queue of the shard:
a queue joins ``unsynced`` when a write, commit or skip makes it unsynced
(``DiskQueue.on_dirty``), when it is attached, and when a sync is asked for (a sync that
fails leaves it unsynced); the scan drops it once it finds it synced with no sync running
for it. Syncs change what a queue owes only inside ``sync``, that is while it is running,
so a queue dropped is clean until its owner's next write, which adds it again.

One thread, so syncs of a shard never compete with each other for the disk. The guarantee
is go-diskqueue's as before: a ``put`` returns after ``write()``; a sync starts after every
``--sync-every`` operations, on a roll and after ``--sync-timeout`` with activity; it covers
what was written when it started (writes made meanwhile are counted for the next one); a
clean exit syncs every queue inline (``DiskQueue.close``).

A sync that fails (ENOSPC writing the metadata, EIO from fsync) leaves the queue consistent
and its operation count non-zero, so it is retried. A failing spell is logged once, when it
begins (``failed to sync ... retrying``), and once when a sync succeeds again; meanwhile the
scan retries after a back-off (``pynsqd.backoff``) that doubles from ``RETRY_MIN`` to
``RETRY_MAX``. Syncs asked for by writes and reads still start at once: they also remove the
files consumption has read past, which is what gives a full disk its space back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import weakref
from dataclasses import dataclass, field

from pynsqd.backoff import Backoff
from pynsqd.shm.diskqueue import DiskQueue, DiskQueueError

log = logging.getLogger("pynsqd.shard")

RETRY_MIN = 0.1  # s: first back-off after a failed sync
RETRY_MAX = 10.0  # s: longest back-off between retries of a failing queue


@dataclass(slots=True)
class _State:
    running: bool = False
    again: bool = False  # asked for while running: start another when it ends
    # consecutive failed syncs (0: healthy) and the delay each earns; no jitter: the retries
    # are this shard's own, with no peers to fall into step with
    retry: Backoff = field(default_factory=lambda: Backoff(RETRY_MIN, RETRY_MAX, jitter=0.0))
    retry_at: int = 0  # monotonic ns before which the scan does not retry a failing queue


class Syncer:
    """Runs the syncs of a shard's disk queues on one worker thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pynsqd-sync")
        self._states: weakref.WeakKeyDictionary[DiskQueue, _State] = weakref.WeakKeyDictionary()
        self.unsynced: dict[DiskQueue, None] = {}  # what the scan looks at (insertion-ordered)
        self._closed = False

    def attach(self, queue: DiskQueue) -> None:
        """Run the syncs ``queue`` falls due for from now on here."""
        queue.on_sync_due = lambda: self.request(queue)
        queue.on_dirty = lambda: self.unsynced.setdefault(queue)
        self.unsynced[queue] = None  # it may have been written to before

    def request(self, queue: DiskQueue) -> None:
        """Sync ``queue`` now (or as soon as the sync running for it ends)."""
        self.unsynced[queue] = None  # until the scan finds it synced (a failure leaves it unsynced)
        state = self._states.get(queue)
        if state is None:
            state = self._states[queue] = _State()
        if state.running:
            state.again = True
            return
        if self._closed:
            return
        state.running = True
        future = self._loop.run_in_executor(self._pool, queue.sync)
        future.add_done_callback(lambda fut: self._done(queue, state, fut))

    def scan(self, now_ns: int) -> None:
        """From the shard's scan: ``maybe`` for each queue with something to sync; forget
        the queues found synced (or closed) with no sync running."""
        states = self._states
        for queue in list(self.unsynced):
            if queue.unsynced:
                self.maybe(queue, now_ns)
            else:
                state = states.get(queue)
                if state is None or not state.running:
                    del self.unsynced[queue]

    def maybe(self, queue: DiskQueue, now_ns: int) -> None:
        """Sync if ``--sync-timeout`` has passed with activity (a failing queue: once its
        back-off has passed too)."""
        if not queue.sync_wanted(now_ns):
            return
        state = self._states.get(queue)
        if state is not None and (state.running or now_ns < state.retry_at):
            return
        self.request(queue)

    def _done(self, queue: DiskQueue, state: _State, future: asyncio.Future[None]) -> None:
        state.running = False
        exc = None if future.cancelled() else future.exception()
        if exc is None:
            if state.retry.failures:
                log.warning("DISKQUEUE(%s) synced again after %d failed attempt(s)", queue.name,
                            state.retry.failures)
            state.retry.reset()
            state.retry_at = 0
        else:
            state.retry_at = time.monotonic_ns() + int(state.retry.failed() * 1e9)
            if state.retry.failures == 1:
                why = str(exc) if isinstance(exc, DiskQueueError) else f"DISKQUEUE({queue.name}) sync failed - {exc!r}"
                log.error("%s; retrying with back-off (up to %gs)", why, RETRY_MAX)
        if state.again:
            state.again = False
            self.request(queue)

    @property
    def busy(self) -> bool:
        """A sync is running or asked for."""
        return any(state.running or state.again for state in self._states.values())

    def close(self) -> None:
        """Wait for the sync running now (shutdown: every queue then syncs inline)."""
        self._closed = True
        self._pool.shutdown(wait=True)

"""The once-per-node start of the supervisor, undone whole when it fails.

A start that fails says one line (``UsageError``: ``nsqd: error: ...``, exit status 1) and
leaves nothing behind: no listening socket, no lock, no ``pynsqd.placement`` and no data
directory that it created, no inbound ring. ``Startup`` is a context manager that records
what each step made and, when the block raises, undoes it in reverse order; an ``OSError``
(a read-only data path, a full disk) becomes the one line naming the file.

The order is the supervisor's: what needs no file first (TLS files, then the listening
addresses and ports, so ``--tcp-address=nohost`` or a port in use touch nothing on disk),
then the data path: locked, probed for writing (``nsqd.dat`` and the queues' files must be
writable, and root passes ``access(2)`` whatever the mode, so a file is really created and
removed), recorded as the owner of its shared memory, then the placement table and the
rings.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import socket
from collections.abc import Callable
from types import TracebackType

from pynsqd.node.datapath import lock_data_path, recoverable
from pynsqd.node.metadata import TopicRecord
from pynsqd.node.placement import FILENAME, Placement
from pynsqd.node.shmowner import OwnerRecord, reclaim
from pynsqd.options import UsageError
from pynsqd.shm import store

log = logging.getLogger("pynsqd.supervisor")

PROBE = ".pynsqd-start.tmp"


class Startup:
    """``with Startup(data_dir) as start:`` the supervisor's constructor steps."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> Startup:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            return
        for undo in reversed(self._undo):
            with contextlib.suppress(OSError):
                undo()
        self._undo.clear()
        if isinstance(exc, OSError):
            where = f" {exc.filename}" if exc.filename else ""
            raise UsageError(f"failed to start:{where} - {exc.strerror or exc}") from None

    def on_failure(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def close_on_failure(self, sock: socket.socket) -> socket.socket:
        self._undo.append(sock.close)
        return sock

    def lock(self) -> int:
        """Create the data path if needed (removed again on failure), lock it, check that
        files can be made in it. Returns the lock's fd."""
        missing = []
        path = os.path.abspath(self.data_dir)
        while not os.path.lexists(path):
            missing.append(path)
            path = os.path.dirname(path)
        for made in reversed(missing):  # undone last: after every file in them is gone
            self._undo.append(functools.partial(os.rmdir, made))
        fd = lock_data_path(self.data_dir)
        self._undo.append(lambda: os.close(fd))
        probe = os.path.join(self.data_dir, PROBE)
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
            os.unlink(probe)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise UsageError(f"--data-path={self.data_dir} is not writable - {exc.strerror}") from None
            # e.g. /proc, which exists but refuses new files with ENOENT: name the file
            raise UsageError(f"--data-path={self.data_dir}: cannot create files in it - open {probe}: "
                             f"{exc.strerror}") from None
        return fd

    def own_shared_memory(self, lock_fd: int) -> OwnerRecord:
        """Record this node as its segments' owner (``node/shmowner.py``; released on
        failure, which removes the record if it holds nothing else)."""
        record = OwnerRecord.claim(self.data_dir, lock_fd)
        self._undo.append(record.release)
        return record

    def placement(self, shards: int) -> Placement:
        """Open (or create: removed again on failure) the placement table."""
        path = os.path.join(self.data_dir, FILENAME)
        existed = os.path.lexists(path)
        table = Placement(self.data_dir, shards)
        self._undo.append(table.close)
        if not existed:
            self._undo.append(lambda: os.unlink(path))
        return table


def sweep_segments(data_dir: str, topics: list[TopicRecord], keep: set[str], owner: Callable[[str], int]) -> None:
    """Once per node, before any shard runs: remove the segments of stopped nodes whose data
    path is gone (``node/shmowner.py``), and this node's segments that belong to no queue of
    nsqd.dat and hold nothing worth recovering (deleted or ephemeral queues, empty logs).
    Segments with messages of a durable queue missing from nsqd.dat stay: the topic's
    ``owner`` recreates the queue when it boots. ``keep``: this run's rings and owner record,
    and leftover rings whose messages could not be stored yet."""
    for gone in reclaim(keep=data_dir):
        log.info("removed the shared memory of a stopped node on %s (%s): %d segments, %.1f MiB",
                 gone.data_path, gone.reason, gone.segments, gone.size / (1 << 20))
    queues = ([("topic", t.name) for t in topics]
              + [("channel", f"{t.name}:{c.name}") for t in topics for c in t.channels])
    claimed = store.claimed_names(data_dir, queues) | keep
    for shm_name, kind, name, records in store.leftovers(data_dir, claimed):
        if recoverable(kind, name, records):
            log.warning("%s %s: found in shared memory only; shard %d recovers it", kind.upper(), name,
                        owner(name.partition(":")[0]))
        else:
            store.unlink_segment(shm_name)

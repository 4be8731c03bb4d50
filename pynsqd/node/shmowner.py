"""Whose shared memory a segment is, and reclaiming the segments of nodes that are gone.

Theory of operation
-------------------
Segments outlive processes on purpose (a restart on the same data path recovers them), so
nothing removes those of a node that never restarts: after ``kill -9`` of a node whose data
path is then removed (a test suite on temporary directories), they stay until a reboot. A
node's segments share one prefix, a hash of its data path's real path
(``shm/segment.node_prefix``), which does not say where that path is. So each node keeps one
more file under its prefix, its *owner record* ``<prefix>owner`` (JSON: the data path and
the device and inode of the directory it locked), written at start (``OwnerRecord.claim``),
and its supervisor holds an exclusive ``flock`` on it while it runs.

A node's segments are garbage when nothing can need them again: no process holds the
record's lock (no node runs on them), and the data path is gone — it does not exist, or it
is another directory than the one the node locked (removed and made again: a restart there
is a new node with empty queues). Everything else is kept: a running node's, a stopped or
killed node's whose directory is still there (its restart recovers them), and segments of a
prefix without a readable record (whose they are cannot be told). ``reclaim`` removes
garbage while holding the record's lock, and the record last; a node starting on that data
path meanwhile waits for the lock, then finds no record (or a new file) and starts afresh.

Who reclaims: every node at start, for every other prefix on the host (``reclaim``), and for
its own prefix when the record names another directory at its path (``claim``: those
segments are a previous directory's, not this one's to recover); and the
``nsqd-reclaim-shm`` command on demand (``supervisor/cli.py``). A clean exit removes the
record when no other segment of the node is left (``release``); with ``#ephemeral``
queues' segments left, it stays for them.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import stat

import orjson

from pynsqd.shm.segment import SHM_DIR, list_segments, node_prefix, node_segments, unlink_segment

log = logging.getLogger("pynsqd.supervisor")

RECORD = "owner"  # the record's name after the node's prefix


@dataclasses.dataclass(frozen=True)
class Gone:
    """The segments of a node reclaimed by ``reclaim`` (``size``: bytes of memory they used)."""

    data_path: str
    reason: str
    segments: int
    size: int


def _record_file(prefix: str) -> str:
    return f"{SHM_DIR}/{prefix}{RECORD}"


def _lock(path: str, create: bool, wait: bool) -> int | None:
    """An fd of the record at ``path`` with its exclusive lock; None if it is missing (and
    not ``create``), or locked by another process (and not ``wait``). Retries when a
    reclaim removed the file while this waited for its lock."""
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    while True:
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            return None
        except OSError:
            if create:
                raise
            return None  # another user's record (EACCES): not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        held = os.fstat(fd)
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
            return fd
        os.close(fd)  # removed or replaced while we waited: take the file there now


def _read(fd: int) -> tuple[str, int, int] | None:
    """(data path, device, inode) of a record; None if it does not parse (torn, foreign)."""
    try:
        raw = orjson.loads(os.pread(fd, 65536, 0))
        return str(raw["data_path"]), int(raw["dev"]), int(raw["ino"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def why_gone(data_path: str, dev: int, ino: int) -> str | None:
    """Why the directory a node locked is gone from its path; None if it is there (or
    cannot be told)."""
    try:
        st = os.stat(data_path)
    except (FileNotFoundError, NotADirectoryError):
        return "data path removed"
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != (dev, ino):
        return "data path replaced"
    return None


def _used(name: str) -> int:
    try:
        return os.stat(SHM_DIR + name).st_blocks * 512
    except OSError:
        return 0


class OwnerRecord:
    """The running node's record, locked for its life (``claim`` … ``release``)."""

    def __init__(self, data_path: str, fd: int) -> None:
        self.data_path = data_path
        self.name = "/" + node_prefix(data_path) + RECORD
        self._fd: int | None = fd

    @classmethod
    def claim(cls, data_path: str, dir_fd: int) -> OwnerRecord:
        """Record the node on ``data_path`` (locked, as ``dir_fd``) as its segments' owner.
        Segments a node on a previous directory at that path left are removed first
        (logged). Raises ``OSError``."""
        prefix = node_prefix(data_path)
        fd = _lock(_record_file(prefix), create=True, wait=True)
        assert fd is not None  # created if missing, waited for if locked
        try:
            here = os.fstat(dir_fd)
            previous = _read(fd)
            if previous is not None and previous[1:] != (here.st_dev, here.st_ino):
                names = [n for n in list_segments(data_path) if n != "/" + prefix + RECORD]
                for name in names:
                    unlink_segment(name)
                if names:
                    log.warning("removed %d shared-memory segments left by a node on a previous directory "
                                "at %s", len(names), data_path)
            record = orjson.dumps({"data_path": os.path.realpath(data_path), "dev": here.st_dev,
                                   "ino": here.st_ino})
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(data_path, fd)

    @property
    def fd(self) -> int:
        """The locked record's descriptor (-1 once released): the supervisor's upgrade keeps
        it across its ``execve``, and the lock with it."""
        return -1 if self._fd is None else self._fd

    def release(self) -> None:
        """Unlock; the record goes too when the node has no other segment left. Harmless
        twice."""
        if self._fd is None:
            return
        try:
            if list_segments(self.data_path) == [self.name]:
                unlink_segment(self.name)
        finally:
            os.close(self._fd)
            self._fd = None


def reclaim(keep: str = "", dry_run: bool = False) -> list[Gone]:
    """Remove the segments of every node that is gone (see the module doc), except the
    node on ``keep`` (a data path); what was removed (with ``dry_run``: what would be), by
    node."""
    own = node_prefix(keep) if keep else ""
    out = []
    for prefix, names in node_segments().items():
        if prefix == own or "/" + prefix + RECORD not in names:
            continue  # no record: whose they are cannot be told
        try:
            gone = _reclaim_node(prefix, dry_run)
        except OSError as exc:  # e.g. another user's segments: left as they are
            log.debug("shared memory of %s left alone - %s", prefix, exc)
            continue
        if gone is not None:
            out.append(gone)
    return out


def _reclaim_node(prefix: str, dry_run: bool) -> Gone | None:
    record = _record_file(prefix)
    fd = _lock(record, create=False, wait=False)
    if fd is None:
        return None  # a node runs on them (or a reclaim beside this one does)
    try:
        owner = _read(fd)
        reason = None if owner is None else why_gone(*owner)
        if owner is None or reason is None:
            return None
        names = [n for n in node_segments().get(prefix, []) if n != "/" + prefix + RECORD]
        size = sum(map(_used, names))
        if not dry_run:
            for name in names:
                unlink_segment(name)
            os.unlink(record)  # last, still locked: a node starting there then makes a new one
    finally:
        os.close(fd)
    return Gone(owner[0], reason, len(names), size)

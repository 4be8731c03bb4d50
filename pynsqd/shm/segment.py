"""POSIX shared-memory segments named after a node's data path (posix_ipc + mmap).

A segment outlives the process that made it (until ``unlink`` or a reboot), which is what
lets a restarted or replaced process find the queues a dead one left. Names are
``/pynsqd-<16 hex of sha256(realpath(data path))>-<kind>-<name>``: two nodes never share a
prefix, and ``list_segments`` finds a node's own segments by scanning ``/dev/shm`` for it.
A kind or name with characters outside ``[A-Za-z0-9._#:-]``, or a name too long for the
250-byte limit, is replaced by a hash of it (names stay distinct; the caller maps names to
segments, never the other way round). Pages of a new segment are untouched until written
(tmpfs allocates lazily), so a large, mostly empty segment costs little memory.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re

import posix_ipc

SHM_DIR = "/dev/shm"
MAX_NAME = 250
_SAFE = re.compile(r"[A-Za-z0-9._#:-]+")


class SegmentError(Exception):
    """A segment could not be created, opened or sized."""


_PREFIX = re.compile(r"pynsqd-[0-9a-f]{16}-")


def node_prefix(data_path: str) -> str:
    """What the names of every segment of the node on ``data_path`` start with (no "/")."""
    digest = hashlib.sha256(os.path.realpath(data_path).encode()).hexdigest()[:16]
    return f"pynsqd-{digest}-"


def _part(text: str, room: int) -> str:
    if _SAFE.fullmatch(text) and len(text.encode()) <= room:
        return text
    return "h." + hashlib.sha256(text.encode()).hexdigest()[:32]


def segment_name(data_path: str, kind: str, name: str) -> str:
    """The POSIX shm name of ``kind``/``name`` for the node on ``data_path``."""
    prefix = "/" + node_prefix(data_path)
    kind_part = _part(kind, 32)
    room = MAX_NAME - len(prefix) - len(kind_part) - 1
    return f"{prefix}{kind_part}-{_part(name, room)}"


def _entries() -> list[str]:
    try:
        return os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []


def list_segments(data_path: str) -> list[str]:
    """Names of every segment that belongs to the node on ``data_path``, sorted."""
    prefix = node_prefix(data_path)
    return sorted("/" + entry for entry in _entries() if entry.startswith(prefix))


def node_segments() -> dict[str, list[str]]:
    """Every pynsqd segment on this host, by node prefix (``node_prefix``): sorted names."""
    out: dict[str, list[str]] = {}
    for entry in sorted(_entries()):
        match = _PREFIX.match(entry)
        if match is not None:
            out.setdefault(match[0], []).append("/" + entry)
    return out


def unlink_segment(name: str) -> bool:
    """Remove a segment by name; False if it did not exist."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    return True


class Segment:
    """One mapped shared-memory segment: ``buf`` (the mmap), ``size``, ``created``."""

    __slots__ = ("buf", "created", "name", "size")

    def __init__(self, name: str, buf: mmap.mmap, created: bool) -> None:
        self.name = name
        self.buf = buf
        self.size = len(buf)
        self.created = created

    @classmethod
    def open(cls, name: str, size: int, *, create: bool) -> Segment:
        """Map segment ``name``; with ``create`` make it (``size`` bytes) if it is missing.

        An existing segment keeps its own size (``.size``); one of size 0 (its creator died
        before sizing it) is sized now and counts as created. ``SegmentError`` if it is
        missing and ``create`` is false, or the system refuses.
        """
        created = False
        try:
            try:
                shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size) if create \
                    else posix_ipc.SharedMemory(name)
                created = create
            except posix_ipc.ExistentialError:
                if not create:
                    raise SegmentError(f"shared memory segment {name} does not exist") from None
                shm = posix_ipc.SharedMemory(name)
            try:
                if shm.size == 0:
                    os.ftruncate(shm.fd, size)
                    created = True
                buf = mmap.mmap(shm.fd, os.fstat(shm.fd).st_size)
            finally:
                shm.close_fd()
        except (OSError, ValueError, posix_ipc.Error) as exc:
            raise SegmentError(f"shared memory segment {name}: {exc}") from exc
        return cls(name, buf, created)

    def resize(self, size: int) -> None:
        """Make the segment ``size`` bytes, its file and its mapping (``mmap.resize``:
        ftruncate, then mremap; views of ``buf`` must be released first). New pages are
        untouched until written. ``SegmentError`` if the system refuses."""
        try:
            self.buf.resize(size)
        except (OSError, ValueError, BufferError) as exc:
            raise SegmentError(f"shared memory segment {self.name}: cannot make it {size} bytes: {exc}") from exc
        self.size = len(self.buf)

    def close(self) -> None:
        """Unmap (views of ``buf``, e.g. a ``ByteRing``, must be closed first)."""
        if not self.buf.closed:
            self.buf.close()

    def unlink(self) -> None:
        """Remove the name; the memory goes once every process has unmapped it."""
        unlink_segment(self.name)

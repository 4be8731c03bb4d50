"""A shard's heartbeat: one page of memory (memfd) the supervisor creates and the shard maps.

The shard's broker scan writes its ``CLOCK_MONOTONIC`` time into the page at the end of every
pass (every 0.1 s), so a beat proves that the scan makes progress, not only that the loop
turns; the supervisor writes it too when it spawns a shard, and reads it at each tick. Silent
for ``STALL_AFTER``: the shard gets no new HTTP connections until it beats again; silent for
``PYNSQD_SHARD_TIMEOUT``: it is killed (``supervisor/arbiter.py``). The page outlives the
shard's processes, so a restarted shard beats into the same page.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

STALL_AFTER = 1.5  # seconds without a beat before a shard gets no new HTTP connections
_LAYOUT = struct.Struct("d")  # the page: the monotonic time of the last beat, in seconds


class Heartbeat:
    """The heartbeat page behind descriptor ``fd``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._page = mmap.mmap(fd, mmap.PAGESIZE)

    @classmethod
    def create(cls, index: int) -> Heartbeat:
        """A new page for shard ``index`` (supervisor)."""
        fd = os.memfd_create(f"pynsqd-heartbeat-{index}", os.MFD_CLOEXEC)
        os.ftruncate(fd, mmap.PAGESIZE)
        return cls(fd)

    def beat(self) -> None:
        _LAYOUT.pack_into(self._page, 0, time.monotonic())

    def last(self) -> float:
        """When the shard last beat (``time.monotonic()`` seconds)."""
        return float(_LAYOUT.unpack_from(self._page, 0)[0])

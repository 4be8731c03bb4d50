"""How large a queue's shared-memory log may be: ``--mem-queue-size`` messages, within the host.

Theory of operation
-------------------
In NSQ, ``--mem-queue-size`` is a count: that many messages of a topic or channel wait in
memory before the rest go to disk. Here a queue's ready messages live in its log
(``shm/log.py``), so the log must hold that many, whatever their size. Reserving
``--mem-queue-size`` x ``--max-msg-size`` for every queue up front would be absurd (a
million 1 MiB messages per queue), so a log grows as messages arrive instead:

* every log starts at ``INITIAL`` bytes of area (pages are only used once written);
* when a message finds no room while the queue holds fewer than ``--mem-queue-size`` ready
  messages, the log doubles (at least to fit the message), up to the node's ``ceiling``
  (``MessageQueue.make_larger`` → ``Grower`` → ``store.grow_log``, which grows in place only while
  the records do not wrap around the log's end; until then they spill to disk, as before);
* ``ceiling`` is fixed at start and logged: ``--mem-queue-bytes`` when given (pynsqd's
  explicit bound; then the log is that large from the start, as before), otherwise half of
  the smaller of ``/dev/shm``'s size and the memory available (``plan``);
* each growth is also checked against the host at that moment (``HostRoom``): what
  ``/dev/shm`` and the memory available have left, less what this node's segments could
  still fill (their sparse pages, which a growth elsewhere must not promise twice), must
  exceed the growth by a reserve. A refused growth is retried at most every
  ``RETRY_AFTER`` seconds; messages spill to disk meanwhile.

So memory stays bounded under any backlog: by the count, by each log's ceiling and by the
host's free memory at every growth. A drained log gives its pages back (``discard``) but
keeps its size (its unused pages count as reserved above) until the queue is closed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable

from pynsqd.shm.log import MessageLog
from pynsqd.shm.segment import SHM_DIR, Segment, list_segments
from pynsqd.shm.store import PAGE, grow_log, log_capacity

log = logging.getLogger("pynsqd.shm")

INITIAL = 32 << 20  # bytes of area a log starts with (when --mem-queue-bytes is not given)
RETRY_AFTER = 5.0  # seconds before a growth the host refused is tried again
MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Host:
    """What the host has, in bytes: ``/dev/shm``'s size and free space, memory available."""

    shm_total: int
    shm_free: int
    mem_available: int

    @classmethod
    def now(cls) -> Host:
        try:
            st = os.statvfs(SHM_DIR)
            shm_total, shm_free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        except OSError:
            shm_total = shm_free = 0
        return cls(shm_total, shm_free, mem_available())


def mem_available() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (0 if unknown)."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclasses.dataclass(frozen=True)
class LogSizing:
    """The node's decision, made once at start: a log's first and largest size (area bytes)."""

    initial: int
    ceiling: int
    explicit: bool  # --mem-queue-bytes was given

    def describe(self, mem_queue_size: int, host: Host) -> str:
        if self.explicit:
            return (f"--mem-queue-bytes: each topic's and channel's shared-memory log holds {mib(self.ceiling)} "
                    f"(up to --mem-queue-size={mem_queue_size} ready messages; the rest go to disk)")
        return (f"--mem-queue-size={mem_queue_size}: each topic's and channel's shared-memory log starts at "
                f"{mib(self.initial)} and grows to hold that many messages, up to {mib(self.ceiling)} "
                f"(half of the smaller of /dev/shm's {mib(host.shm_total)} and the {mib(host.mem_available)} "
                "of memory available)")


def mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n < 1 << 30 else f"{n / (1 << 30):.1f} GiB"


def plan(mem_queue_bytes: int, max_msg_size: int, host: Host) -> LogSizing:
    """Sizes of every log of the node: ``--mem-queue-bytes`` (0: not given) and the host."""
    floor = log_capacity(0, max_msg_size)  # room for two of the largest messages
    if mem_queue_bytes:
        size = log_capacity(mem_queue_bytes, max_msg_size)
        return LogSizing(size, size, True)
    initial = log_capacity(INITIAL, max_msg_size)
    known = [n for n in (host.shm_total, host.mem_available) if n > 0]
    share = min(known) // 2 // PAGE * PAGE if known else initial
    return LogSizing(initial, max(initial, share, floor), False)


class HostRoom:
    """Whether the host can take ``extra`` more bytes of this node's shared memory now."""

    def __init__(self, data_path: str, host: Callable[[], Host] = Host.now) -> None:
        self.data_path = data_path
        self.host = host

    def reserved(self) -> int:
        """Bytes this node's segments could still fill: their size beyond their used pages."""
        total = 0
        for name in list_segments(self.data_path):
            try:
                st = os.stat(SHM_DIR + name)
            except OSError:
                continue
            total += max(0, st.st_size - st.st_blocks * 512)
        return total

    def allows(self, extra: int) -> bool:
        host = self.host()
        keep = max(64 * MiB, host.shm_total // 10)  # never promise the last tenth
        left = min(host.shm_free, host.mem_available) - self.reserved() - keep
        return extra <= left


class Grower:
    """Grows one queue's log (``MessageQueue.grow``): doubling, at least to fit ``need``,
    never beyond the ceiling, only when the host has room (retried after ``RETRY_AFTER``)."""

    __slots__ = ("ceiling", "clock", "name", "retry_at", "room", "segment")

    def __init__(self, segment: Segment, ceiling: int, room: HostRoom, name: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.segment = segment
        self.ceiling = ceiling
        self.room = room
        self.name = name
        self.clock = clock
        self.retry_at = 0.0

    def __call__(self, log_: MessageLog, need: int) -> int | None:
        """Grow ``log_`` so that ``need`` more bytes may fit; the index shift (``grow_log``),
        or None when it may not grow now."""
        cap = log_.capacity
        if cap >= self.ceiling or self.clock() < self.retry_at or log_.unwrapped() is None:
            return None
        target = min(self.ceiling, max(2 * cap, cap + 2 * need))
        target = (target + PAGE - 1) // PAGE * PAGE
        if not self.room.allows(target - cap):
            self.retry_at = self.clock() + RETRY_AFTER
            log.warning("%s: shared memory log stays at %s: the host has no room for %s more now "
                        "(messages go to disk)", self.name, mib(cap), mib(target - cap))
            return None
        shift = grow_log(self.segment, log_, target)
        if shift is None:
            self.retry_at = self.clock() + RETRY_AFTER
            return None
        log.info("%s: shared memory log grown to %s", self.name, mib(target))
        return shift

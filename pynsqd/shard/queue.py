"""A topic's or channel's ready messages: memory up to ``--mem-queue-size``, then a backend.

Records are encoded messages (``pynsqd.wire.message``), shared between channels: a topic
hands the same ``bytes`` objects to every channel, so fan-out copies nothing.

The backend takes what memory cannot hold: a disk queue for durable names, or
``DropBackend`` for ``#ephemeral`` ones, which drops the overflow as NSQ does. As in nsqd,
order between memory and backend is not strict: consumers are served from memory first.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Protocol

log = logging.getLogger("pynsqd.shard")


class Backend(Protocol):
    """What a queue needs from the storage behind memory (see ``pynsqd.shm.diskqueue``)."""

    @property
    def depth(self) -> int: ...
    def put_many(self, records: Sequence[bytes]) -> None: ...
    def read_many(self, max_count: int) -> list[bytes]: ...
    def empty(self) -> None: ...
    def delete(self) -> None: ...
    def close(self) -> None: ...


class DropBackend:
    """The backend of ``#ephemeral`` topics and channels: overflow is dropped, never stored."""

    depth = 0

    def __init__(self) -> None:
        self.dropped = 0

    def put_many(self, records: Sequence[bytes]) -> None:
        self.dropped += len(records)

    def read_many(self, max_count: int) -> list[bytes]:
        return []

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass


class MessageQueue:
    """Ready messages, memory first. ``put_many`` may raise the backend's error."""

    __slots__ = ("backend", "limit", "memory")

    def __init__(self, limit: int, backend: Backend) -> None:
        self.memory: deque[bytes] = deque()
        self.limit = limit
        self.backend = backend

    def __len__(self) -> int:
        return len(self.memory) + self.backend.depth

    @property
    def backend_depth(self) -> int:
        return self.backend.depth

    def put_many(self, records: Sequence[bytes]) -> None:
        room = self.limit - len(self.memory)
        if room >= len(records):
            self.memory.extend(records)
            return
        if room > 0:
            self.backend.put_many(records[room:])  # the backend first: if it fails, store nothing
            self.memory.extend(records[:room])
        else:
            self.backend.put_many(records)

    def put(self, record: bytes) -> None:
        if len(self.memory) < self.limit:
            self.memory.append(record)
        else:
            self.backend.put_many((record,))

    def take(self, count: int) -> list[bytes]:
        """Remove and return up to ``count`` records, memory first."""
        memory = self.memory
        if len(memory) >= count:
            return [memory.popleft() for _ in range(count)]
        out = list(memory)
        memory.clear()
        if len(out) < count and self.backend.depth:
            try:
                out.extend(self.backend.read_many(count - len(out)))
            except Exception:  # a read error is the backend's to log; serve what we have
                log.exception("failed to read from %r", self.backend)
        return out

    def take_all_memory(self) -> list[bytes]:
        out = list(self.memory)
        self.memory.clear()
        return out

    def empty(self) -> None:
        self.memory.clear()
        self.backend.empty()

    def flush(self) -> None:
        """Move every record in memory to the backend (clean shutdown)."""
        if self.memory:
            self.backend.put_many(list(self.memory))
            self.memory.clear()

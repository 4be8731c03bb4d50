"""The storage behind a queue's shared-memory log: what ``MessageQueue`` needs from it.

A durable topic or channel spills to its disk queue (``pynsqd.shm.diskqueue.DiskQueue``);
an ``#ephemeral`` one to ``DropBackend``, which drops the overflow as NSQ does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pynsqd.shm.store import Position


class Backend(Protocol):
    """What a queue needs from the storage behind memory (see ``pynsqd.shm.diskqueue``)."""

    @property
    def depth(self) -> int: ...
    def put_many(self, records: Sequence[bytes]) -> None: ...
    def peek_many(self, max_count: int) -> list[bytes]: ...
    def commit(self, count: int | None = None) -> None: ...
    @property
    def read_position(self) -> Position | None: ...
    @property
    def committed_position(self) -> Position | None: ...
    def skip_to(self, position: Position) -> int: ...
    @property
    def write_position(self) -> Position: ...
    def records_after(self, position: Position) -> int: ...
    def empty(self) -> None: ...
    def delete(self) -> None: ...
    def close(self) -> None: ...
    def release(self) -> None: ...


class DropBackend:
    """The backend of ``#ephemeral`` topics and channels: overflow is dropped, never stored."""

    depth = 0

    def __init__(self) -> None:
        self.dropped = 0

    def put_many(self, records: Sequence[bytes]) -> None:
        self.dropped += len(records)

    def peek_many(self, max_count: int) -> list[bytes]:
        return []

    def commit(self, count: int | None = None) -> None:
        pass

    read_position = committed_position = None

    def skip_to(self, position: Position) -> int:
        return 0

    write_position = (0, 0)

    def records_after(self, position: Position) -> int:
        return 0

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass

    def release(self) -> None:
        pass

"""A topic: fans each published message out to every channel.

While a topic has no channel, or is paused, messages wait in the topic's own queue (its
shared-memory log, then its backend), as in nsqd; deferred messages wait in the log too,
with their wall-clock due time (counted from the DPUB, not from the channel's arrival). When the first
channel appears or the topic is unpaused, the owner's scheduler calls ``pump`` until the
waiting messages have moved to the channels, ``DRAIN_CHUNK`` at a time so a large backlog
never blocks the event loop.

Channels share the published ``bytes`` objects: fan-out to N channels copies nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pynsqd.shard.channel import Channel
from pynsqd.shard.queue import MessageQueue
from pynsqd.shm.log import DEFERRED
from pynsqd.wire.names import is_ephemeral

DRAIN_CHUNK = 2048


class Topic:
    """One topic and its channels."""

    def __init__(self, name: str, queue: MessageQueue, schedule: Callable[[Any], None]) -> None:
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.channels: dict[str, Channel] = {}
        self.queue = queue
        # (record, due monotonic ns, log position or -1) waiting for a channel
        self.waiting_deferred: list[tuple[bytes, int, int]] = []
        self.paused = False
        self.deleted = False
        self.message_count = 0
        self.message_bytes = 0
        self._schedule = schedule

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"

    def recover(self) -> int:
        """Adopt the log a previous process left; returns the number of waiting messages."""
        now_mono, now_wall = time.monotonic_ns(), time.time_ns()
        for pos, due_wall, record in self.queue.recover():
            self.waiting_deferred.append((record, now_mono + max(0, due_wall - now_wall), pos))
        if len(self.queue) or self.waiting_deferred:
            self._schedule(self)
        return self.depth

    @property
    def flowing(self) -> bool:
        """True when published messages go straight to the channels."""
        return bool(self.channels) and not self.paused

    def put_many(self, records: list[bytes], body_bytes: int) -> None:
        """Publish. Raises the backend's error if the messages cannot be stored."""
        if self.flowing and not len(self.queue):
            for channel in self.channels.values():
                channel.put_many(records)
        else:
            self.queue.put_many(records)
            if self.flowing:
                self._schedule(self)
        self.message_count += len(records)
        self.message_bytes += body_bytes

    def put_deferred(self, record: bytes, delay: int, now: int, body_bytes: int) -> None:
        if self.flowing:
            for channel in self.channels.values():
                channel.put_deferred(record, now + delay)
        else:
            pos = self.queue.append(record, DEFERRED, time.time_ns() + delay)
            self.waiting_deferred.append((record, now + delay, -1 if pos is None else pos))
        self.message_count += 1
        self.message_bytes += body_bytes

    def pump(self, now: int) -> None:
        """Move waiting messages to the channels, one chunk per call."""
        if not self.flowing:
            return
        queue = self.queue
        if self.waiting_deferred:
            held = 0
            for record, due, pos in self.waiting_deferred:
                for channel in self.channels.values():
                    channel.put_deferred(record, due)
                if pos >= 0:
                    queue.finish(pos)
                else:
                    held += 1
            self.waiting_deferred.clear()
            queue.unjournal(held)
        positions, records = queue.take(DRAIN_CHUNK)
        if records:
            for channel in self.channels.values():
                channel.put_many(records)
            for pos in positions:
                queue.finish(pos)
            if len(queue):
                self._schedule(self)

    # --- channels -------------------------------------------------------------------------
    def add_channel(self, channel: Channel) -> None:
        self.channels[channel.name] = channel
        if len(self.queue) or self.waiting_deferred:
            self._schedule(self)

    def remove_channel(self, name: str) -> Channel | None:
        return self.channels.pop(name, None)

    # --- admin ----------------------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        if len(self.queue) or self.waiting_deferred:
            self._schedule(self)

    def empty(self) -> None:
        """Drop the messages waiting at the topic (channels keep theirs)."""
        self.queue.empty()
        self.waiting_deferred.clear()

    def close(self, delete: bool = False) -> None:
        """Shut down; ``delete`` also removes every channel's and the topic's data."""
        self.deleted = delete
        for channel in list(self.channels.values()):
            channel.close(delete=delete)
        if delete:
            self.queue.close(delete=True)
            return
        offset = time.time_ns() - time.monotonic_ns()
        memory_only = [(due + offset, record) for record, due, pos in self.waiting_deferred if pos < 0]
        self.waiting_deferred.clear()
        self.queue.close(deferred=memory_only)

    @property
    def depth(self) -> int:
        return len(self.queue) + len(self.waiting_deferred)

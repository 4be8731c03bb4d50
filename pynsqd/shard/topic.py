"""A topic: fans each published message out to every channel.

While a topic has no channel, or is paused, messages wait in the topic's own queue (its
shared-memory log, then its backend), as in nsqd; deferred messages wait in the log too,
with their wall-clock due time (counted from the DPUB, not from the channel's arrival). When the first
channel appears or the topic is unpaused, the owner's scheduler calls ``pump`` until the
waiting messages have moved to the channels, ``DRAIN_CHUNK`` at a time so a large backlog
never blocks the event loop.

Channels share the published ``bytes`` objects: fan-out to N channels copies nothing.

A channel may fail to take a message (its disk queue or its deferred journal refuses the
write). Then nothing is lost and nothing is handed on twice: a message stays in the topic's
queue (a ready one is made ready again in place, a deferred one stays waiting) until every
channel holds it; ``handed`` remembers, per message id, which channels already took it, so
a retry skips them. After a restart ``handed`` is rebuilt from the channels' logs
(``recovered_channel``, then ``shard/recovery.match_channels``; the pump waits for it:
``matching``), which also covers a kill -9 between a channel's append and the topic's finish
of the same messages. The pump logs the failure once, stops, and the owner's scan calls it
again ``RETRY_NS`` later (``retry_due``) until the disk takes writes again. A publish that
goes straight to the channels and fails at one of them is queued at the topic the same way
(the channels before it keep their copy), so the publish still succeeds when the topic's
own queue can store it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from pynsqd.shard.channel import Channel
from pynsqd.shard.queue import MessageQueue
from pynsqd.shard.unit import Unit
from pynsqd.shm.log import DEFERRED
from pynsqd.wire.message import ID_OFFSET
from pynsqd.wire.names import is_ephemeral

log = logging.getLogger("pynsqd.shard")

DRAIN_CHUNK = 2048
RETRY_NS = 1_000_000_000  # a hand-on that failed (a channel's disk) is tried again after this
Put = Callable[[Channel, list[bytes]], None]


class Topic:
    """One topic and its channels."""

    def __init__(self, name: str, queue: MessageQueue, schedule: Callable[[Any], None],
                 on_retry: Callable[[Topic], None] | None = None) -> None:
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
        # after a failed hand-on: message id -> names of the channels that already hold it
        self.handed: dict[bytes, set[str]] = {}
        self.retry_at = 0  # monotonic ns of the next try after a failed hand-on (0: none)
        self._failures = 0
        # recovered channels whose copies of this topic's waiting messages are not known yet;
        # while ``matching``, the pump hands nothing on (``shard/recovery.match_channels``)
        self.unmatched: list[Channel] = []
        self.matching = False
        self._schedule = schedule
        self.on_retry = on_retry  # told when a retry is set: the owner's scan asks ``retry_due``

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"

    def start_recovery(self) -> None:
        """Adopt the log a previous process left (``MessageQueue.start_recovery``); then
        ``recover_step`` until ``queue.scanning`` is false (``shard/recovery.py``)."""
        self._recovered_deferred(self.queue.start_recovery())

    def recover_step(self, max_count: int) -> int:
        """Recover up to ``max_count`` more records of the log; the records walked."""
        queue = self.queue
        scan = queue.scan
        walked = scan.walked if scan is not None else 0
        self._recovered_deferred(queue.recover_step(max_count))
        if len(queue) or self.waiting_deferred:
            self._schedule(self)
        return (scan.walked - walked) if scan is not None else 0

    def _recovered_deferred(self, found: list[tuple[int, int, bytes]]) -> None:
        now_mono, now_wall = time.monotonic_ns(), time.time_ns()
        for pos, due_wall, record in found:
            self.waiting_deferred.append((record, now_mono + max(0, due_wall - now_wall), pos))

    def recovered_channel(self, channel: Channel) -> None:
        """``channel`` was recovered: the messages it already holds that this topic still has
        waiting were being handed on when the previous process died (between a channel's
        append and the topic's finish) or kept for channels that had refused them. Until
        ``shard/recovery.match_channels`` has noted them in ``handed`` (then ``matched``),
        the pump hands nothing on, so ``channel`` gets none twice."""
        self.unmatched.append(channel)
        self.matching = True

    def matched(self) -> None:
        """The recovered channels' copies are noted in ``handed``: the pump may run."""
        self.matching = False
        if len(self.queue) or self.waiting_deferred:
            self._schedule(self)

    @property
    def flowing(self) -> bool:
        """True when published messages go straight to the channels."""
        return bool(self.channels) and not self.paused

    def put_many(self, records: Sequence[bytes], body_bytes: int, unit: Unit | None = None) -> None:
        """Publish. Raises the backend's error if the messages cannot be stored. ``records``
        may be a run of READY log frames (a cross-shard batch, ``shm/frames.Frames``): each
        queue that can take it whole appends it as it is (``MessageQueue.put_many``).
        ``unit``: they are a cross-shard batch's; a queue skips what it holds of it."""
        queue = self.queue
        if (self.channels and not self.paused and not queue.ready and not queue.backend.depth
                and not self.retry_at):  # flowing, nothing waiting here, no retry pending
            took = 0
            try:
                for channel in self.channels.values():
                    channel.put_many(records, unit)
                    took += 1
            except Exception as exc:
                if not took:
                    raise  # no channel took them: the publish fails as a whole
                self._keep_refused(records, took, exc, unit)
        else:
            self.queue.put_many(records, unit)
            if self.flowing:
                self._schedule(self)
        self.message_count += len(records)
        self.message_bytes += body_bytes

    def _keep_refused(self, records: Sequence[bytes], took: int, exc: Exception, unit: Unit | None) -> None:
        """The first ``took`` channels took ``records``, the next one refused them: queue
        them here for the pump to hand to the others (raises if the topic cannot either)."""
        names = set(list(self.channels)[:took])
        self.queue.put_many(records, unit)
        for record in records:
            self.handed[record[ID_OFFSET:ID_OFFSET + 16]] = set(names)
        self._failed(time.monotonic_ns(), exc)

    def put_deferred(self, record: bytes, delay: int, now: int, body_bytes: int, unit: Unit | None = None) -> None:
        """DPUB: ``record`` is due ``delay`` ns after ``now`` (monotonic). ``unit``: it is a
        cross-shard batch's; a channel, or this topic while it keeps it, that holds it
        already does not store it again."""
        if self.flowing:
            for channel in self.channels.values():
                channel.put_deferred(record, now + delay, unit)
        elif unit is None or not self.queue.tally.skip(unit, 1):
            pos = self.queue.append(record, DEFERRED, time.time_ns() + delay, unit)
            self.waiting_deferred.append((record, now + delay, -1 if pos is None else pos))
        self.message_count += 1
        self.message_bytes += body_bytes

    def pump(self, now: int) -> None:
        """Move waiting messages to the channels, one chunk per call."""
        if not self.flowing or self.matching or (self.retry_at and now < self.retry_at):
            return
        queue = self.queue
        records: list[bytes] = []
        try:
            if self.waiting_deferred:
                self._pump_deferred()
            positions, records = queue.take(DRAIN_CHUNK)
            if records:
                try:
                    self._hand_on(records, Channel.put_many)
                except Exception:
                    for pos in positions:  # ready again, in place: taken again next time
                        queue.requeue(pos)
                    raise
                for pos in positions:
                    queue.finish(pos)
        except Exception as exc:
            self._failed(now, exc)
            return
        if self.retry_at:
            log.info("TOPIC(%s): channels take messages again (after %d failed tries)", self.name,
                     self._failures)
            self.retry_at = self._failures = 0
        if records and len(queue):
            self._schedule(self)

    def _pump_deferred(self) -> None:
        """Hand every waiting deferred message on, in order; on a failure the ones handed
        on so far are released and the rest keep waiting."""
        queue = self.queue
        waiting = self.waiting_deferred
        done = 0
        held: list[bytes] = []
        try:
            for record, due, pos in waiting:
                self._hand_on([record], _deferred_until(due))
                if pos >= 0:
                    queue.finish(pos)
                else:
                    held.append(record)
                done += 1
        finally:
            del waiting[:done]
            queue.unjournal(held)

    def _hand_on(self, records: list[bytes], put: Put) -> None:
        """``put`` ``records`` into every channel that does not hold them yet. On a failure
        the channels that took them are noted in ``handed`` and the error is raised."""
        handed = self.handed
        took: list[str] = []
        for name, channel in self.channels.items():
            batch = records if not handed else [
                r for r in records if name not in handed.get(r[ID_OFFSET:ID_OFFSET + 16], ())]
            try:
                if batch:
                    put(channel, batch)
            except Exception:
                if took:
                    for record in records:
                        handed.setdefault(record[ID_OFFSET:ID_OFFSET + 16], set()).update(took)
                raise
            took.append(name)
        if handed:
            for record in records:
                handed.pop(record[ID_OFFSET:ID_OFFSET + 16], None)

    def _failed(self, now: int, exc: object) -> None:
        """A channel could not take a message: try again ``RETRY_NS`` from ``now``; one log
        line per run of failures."""
        if not self._failures:
            log.error("TOPIC(%s): could not hand messages on to its channels, keeping them and "
                      "retrying every %.0fs - %s", self.name, RETRY_NS / 1e9, exc)
        self._failures += 1
        self.retry_at = now + RETRY_NS
        if self.on_retry is not None:
            self.on_retry(self)

    def retry_due(self, now: int) -> bool:
        """True when a failed hand-on should be tried again (the owner's scan asks)."""
        return 0 < self.retry_at <= now

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
        self.handed.clear()

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


def _deferred_until(due: int) -> Put:
    def put(channel: Channel, records: list[bytes]) -> None:
        channel.put_deferred(records[0], due)
    return put

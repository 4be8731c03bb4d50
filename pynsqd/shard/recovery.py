"""A shard's recovery after a restart: what a previous process left in shared memory is
adopted in bounded steps while the shard serves.

Theory of operation
-------------------
Every topic and channel whose segment outlived its process (kill -9 of a shard or of the
tree) must have its log walked once (``pynsqd.shm.logrecovery``): in-flight records become
ready, deferred ones go back to their timers. A shard that walked every log before saying
``ready`` answered nothing for 12-15 s with 5,000,000 messages in one log. Here each queue's
walk is a task (a generator that does one step of at most ``STEP`` records per ``next`` and
yields how many it walked), and ``Recovery`` runs the tasks round-robin: ``BOOT`` records'
worth before the shard says ``ready`` (so a log of up to that size is whole at once, as
before), then ``TURN`` records per event-loop turn, so clients, FINs, ``/stats`` and the
heartbeat never wait longer than one turn's worth behind it. A channel delivers what its
walk has passed at once (``MessageQueue`` stops delivery at the walk's cursor).

A topic hands its waiting messages to its channels only once it knows which of them each
recovered channel already holds (a kill -9 between a channel's append and the topic's
finish; or messages a channel had refused, ``Topic.handed``): its ``match_channels`` task
waits for the walks of the topic and of those channels, then collects the topic's live ids
and looks them up in each such channel's log, in steps as well, and only then lets the
topic's pump run (``Topic.matching``).

A step that raises (a corrupt log: ``RingError``) is reported to ``on_error`` (the worker
exits with the boot error status, as a shard that found a corrupt log at boot always did).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Container, Generator, Iterator

from pynsqd.shard.channel import Channel
from pynsqd.shard.topic import Topic
from pynsqd.shm import kernels
from pynsqd.wire.message import ID_OFFSET

log = logging.getLogger("pynsqd.shard")

STEP = 16384 if kernels.COMPILED else 2048  # records one step of one queue walks
TURN = 4 * STEP  # records walked per event-loop turn, all queues together
BOOT = 16 * STEP  # records walked before the shard says ready
IDLE_WAIT = 0.01  # seconds before another turn when every task only waits for others

Task = Iterator[int]  # each ``next`` is one step; yields the records it walked (0: waited)


class Recovery:
    """Runs the recovery tasks of one shard (see the module doc)."""

    def __init__(self, on_error: Callable[[Exception], None]) -> None:
        self._tasks: deque[Task] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.Handle | asyncio.TimerHandle | None = None
        self.on_error = on_error  # a step raised: the shard must go

    @property
    def active(self) -> bool:
        """True while some queue is still being recovered."""
        return bool(self._tasks)

    def add(self, task: Task) -> None:
        self._tasks.append(task)
        self._wake(0)

    def run(self, budget: int) -> bool:
        """Run steps round-robin until about ``budget`` records are walked, every task is
        done, or every task left only waits; True if any step walked something. A step's
        error is raised."""
        tasks = self._tasks
        idle = 0
        progress = False
        while tasks and budget > 0 and idle < len(tasks):
            task = tasks.popleft()
            try:
                walked = next(task)
            except StopIteration:
                idle = 0
                progress = True
                continue
            tasks.append(task)
            if walked:
                budget -= walked
                idle = 0
                progress = True
            else:
                idle += 1
        return progress

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Go on with the tasks left, ``TURN`` records per loop turn."""
        self._loop = loop
        self._wake(0)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._loop = None

    def _wake(self, delay: float) -> None:
        if self._handle is None and self._loop is not None and self._tasks:
            self._handle = (self._loop.call_soon(self._turn) if not delay
                            else self._loop.call_later(delay, self._turn))

    def _turn(self) -> None:
        self._handle = None
        try:
            progress = self.run(TURN)
        except Exception as exc:
            self._tasks.clear()
            log.exception("recovering shared memory failed")
            self.on_error(exc)
            return
        self._wake(0 if progress else IDLE_WAIT)


def recover_topic(topic: Topic) -> Task:
    """Walk the topic's log (``Topic.start_recovery`` was called)."""
    while topic.queue.scanning and not topic.deleted:
        yield max(1, topic.recover_step(STEP))
    if not topic.deleted and topic.depth:
        log.info("TOPIC(%s): recovered %d messages", topic.name, topic.depth)


def recover_channel(channel: Channel) -> Task:
    """Walk the channel's log (``Channel.start_recovery`` was called)."""
    while channel.queue.scanning and not channel.deleted:
        yield max(1, channel.recover_step(STEP))
    if not channel.deleted:
        log.info("CHANNEL(%s:%s): recovered %d messages", channel.topic_name, channel.name, channel.depth
                 + len(channel.deferred_at))


def match_channels(topic: Topic) -> Task:
    """Note in ``topic.handed`` which of its waiting messages each recovered channel holds
    already, then let the topic's pump run (``Topic.matched``)."""
    while True:
        while not topic.deleted and (topic.queue.scanning or any(
                c.queue.scanning for c in topic.unmatched if not c.deleted)):
            yield 0
        if topic.deleted:
            return
        channels = [c for c in topic.unmatched if not c.deleted]
        topic.unmatched = []
        if channels and (topic.queue.live or topic.waiting_deferred):
            waiting = yield from _live_ids(topic, None)
            waiting |= {record[ID_OFFSET:ID_OFFSET + 16] for record, _, _ in topic.waiting_deferred}
            for channel in channels:
                held = yield from _live_ids(channel, waiting)
                for msg_id in held:
                    topic.handed.setdefault(msg_id, set()).add(channel.name)
        if not topic.unmatched:
            break
    topic.matched()


def _live_ids(owner: Topic | Channel, among: Container[bytes] | None) -> Generator[int, None, set[bytes]]:
    """The ids of the live records of ``owner``'s log (only those in ``among``, if given),
    ``STEP`` records per step."""
    queue = owner.queue
    out: set[bytes] = set()
    cursor = queue.log.read_index
    shifted = queue.shifted
    while cursor >= 0 and not owner.deleted:
        cursor = queue.live_ids_run(cursor - (queue.shifted - shifted), STEP, among, out)
        shifted = queue.shifted
        yield STEP
    return out

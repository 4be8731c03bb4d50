"""The state of one shard: its topics and channels, publishing, and the timers that drive them.

Theory of operation
-------------------
Everything here runs on the shard's event loop, so there are no locks (disk-queue syncs run
on the ``Syncer``'s worker thread, which touches nothing but the queue). Work that may allow
delivery is not done inline: topics and channels call ``schedule(obj)``, which puts them in a
"dirty" set and arranges one ``call_soon`` for the whole set; the callback runs each dirty
object's ``pump`` once. A burst of 200 PUBs on 50 connections thus costs one pump per
channel per loop turn, not 10,000.

Timeouts and deferred messages are scanned every ``SCAN_INTERVAL`` (nsqd: 100 ms); the same
scan asks for the syncs due after ``--sync-timeout``, retries topics that could not hand
messages on, checks client deadlines and ends with ``on_scan`` (the shard's heartbeat). A
pass that raises stops the scan and calls ``on_fatal``: the process goes down and the
supervisor restarts it.

The scan's work follows what is active, not how many topics and channels there are: it
visits only the channels in ``_timed`` (added by ``Channel.on_timers`` when one gets
something in flight or deferred, dropped by the scan once ``has_timers`` is false), the
topics in ``_retrying`` (added by ``Topic.on_retry`` when a hand-on fails, dropped once the
retry succeeded) and the disk queues in ``Syncer.unsynced``; each scan checks the read
deadline of a tenth of the clients (``CLIENT_PARTS``, each once a second: the deadline is two
heartbeat intervals, 2 s at least), so 10,000 idle connections cost a thousand checks a scan,
not ten thousand, and the write deadline of every client whose writes are paused (``stuck``:
a pause shorter than the next check must not hide a longer one). A deleted topic or channel is
dropped when the scan next meets it. An idle node with thousands of topics thus scans
nothing but its clients.

A topic or channel whose shared-memory log a previous process left is adopted in steps while
the shard serves (``recovery.py``): ``restore`` recovers ``BOOT`` records' worth at once, the
loop the rest.

Publishing turns bodies into encoded messages (``pynsqd.wire.message``): one wall-clock
read and one batch of ids per PUB/MPUB.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from pynsqd.node.config import NsqdOptions
from pynsqd.node.metadata import ChannelRecord, TopicRecord
from pynsqd.options import MS
from pynsqd.shard.backend import Backend, DropBackend
from pynsqd.shard.channel import Channel
from pynsqd.shard.latency import LatencyWindow
from pynsqd.shard.queue import MessageQueue
from pynsqd.shard.recovery import BOOT, Recovery, match_channels, recover_channel, recover_topic
from pynsqd.shard.relay import Relayable
from pynsqd.shard.syncer import Syncer
from pynsqd.shard.topic import Topic
from pynsqd.shm.diskqueue import DiskQueue
from pynsqd.wire.message import TS_ATTEMPTS, IdFactory

log = logging.getLogger("pynsqd.shard")

SCAN_INTERVAL = 0.1  # seconds, nsqd's QueueScanInterval
CLIENT_PARTS = 10  # each scan checks the deadlines of one part of the clients: each once a second


class BrokerError(Exception):
    """A publish or admin action that failed; the text follows nsqd's."""


class Backpressure(Exception):
    """The owner shard's inbound ring is full: try again shortly. Nothing was stored, except
    for a batch larger than one ring record, stored in pieces: ``stored`` says how many of
    its messages (the first ones) went in before the ring filled up."""

    def __init__(self, text: str, stored: int = 0) -> None:
        super().__init__(text)
        self.stored = stored


RING_RETRY = 0.001  # seconds between tries of a publish that met ``Backpressure``
PARTIAL_KEPT = 256  # publishes stored in part (a split cross-shard batch) remembered for their retry


class Router(Protocol):
    """Where topics live on a node of several shards (``shard/router.py``)."""

    def owner(self, topic: str) -> int:
        """The shard that owns ``topic``."""

    def forward(self, topic: str, records: list[bytes], body_bytes: int, delay_ns: int) -> None:
        """Store a publish in the owner's inbound ring; raises ``Backpressure``."""

    def catch_up(self) -> None:
        """Store what the inbound rings hold that was sent before now: this shard is about to
        store a publish it received itself (``shard/inbound.py``)."""

    def relay(self, client: Relayable, owner: int, unread: bytes) -> None:
        """Serve ``client`` from the shard ``owner`` from here on."""


def _ignore(*args: object) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class BrokerHooks:
    """What the shard around a broker hears from it (nothing, by default)."""

    # ("created" | "deleted", topic, channel or None) for every topic/channel change
    on_change: Callable[[str, str, str | None], None] = _ignore
    on_scan: Callable[[], None] = _ignore  # after every scan: the shard's heartbeat
    on_fatal: Callable[[], None] = _ignore  # the scan failed: take the process down
    on_recovery_error: Callable[[Exception], None] = _ignore  # a log left by a previous process is corrupt


NO_HOOKS = BrokerHooks()

BackendFactory = Callable[[str], Backend]  # durable queue name → its backend
# (kind "topic" | "channel", queue name, backend) → the queue, recovering if it existed
QueueFactory = Callable[[str, str, Backend], MessageQueue]


class Broker:
    """Topics and channels owned by one shard."""

    def __init__(self, opts: NsqdOptions, queue_factory: QueueFactory, backend_factory: BackendFactory, *,
                 shard: int = 0, shards: int = 1, router: Router | None = None, hooks: BrokerHooks = NO_HOOKS,
                 start_ns: int | None = None) -> None:
        self.opts = opts
        self.topics: dict[str, Topic] = {}
        self.ids = IdFactory(opts.node_id, shard, shards)
        self.shard = shard
        self.router = router  # where other shards' topics live (None: every topic is this broker's)
        self.hooks = hooks
        self.clients: set[Any] = set()
        self.start_ns = time.time_ns() if start_ns is None else start_ns  # wall clock: /stats text's uptime
        self.start_time = self.start_ns // 1_000_000_000
        self.health = "OK"
        self.exiting = False
        self.frozen = False  # being handed over to a replacement: no pump runs (``hand_over``)
        self._restoring = False  # topics and channels of ``nsqd.dat`` are recreated: no ``on_change``
        self._backend_factory = backend_factory
        self._queue_factory = queue_factory
        self._dirty: dict[Any, None] = {}
        self._timed: dict[Channel, None] = {}  # channels with something in flight or deferred
        self._retrying: dict[Topic, None] = {}  # topics with a failed hand-on to retry
        # id(bodies) -> (bodies, how many of them are stored): a cross-shard batch stored in
        # part; its retry passes the same list and resumes after them (``_forward``)
        self._partial: dict[int, tuple[list[bytes], int]] = {}
        self._pump_handle: asyncio.Handle | None = None
        self._scan_turn = 0
        self.stuck: set[Any] = set()  # clients whose writes are paused: checked every scan
        self._checking: list[Any] = []  # the clients whose deadlines this second's scans check
        self._scan_handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.syncer: Syncer | None = None  # disk-queue syncs off the loop, once started
        self.recovery = Recovery(hooks.on_recovery_error)  # the logs a previous process left, adopted in steps
        # (kind, queue name) -> ``MessageQueue.export`` of a process this shard replaces: such a
        # queue is taken over as it was instead of recovered (``transfer.py``)
        self.adopted: dict[tuple[str, str], dict[str, Any]] = {}

    # --- the loop-driven machinery --------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the scan every ``SCAN_INTERVAL`` and every disk-queue sync on a worker thread."""
        self._loop = loop
        self.syncer = Syncer(loop)
        for topic in self.topics.values():
            self._attach(topic.queue.backend)
            for channel in topic.channels.values():
                self._attach(channel.queue.backend)
        self._scan_handle = loop.call_later(SCAN_INTERVAL, self._scan)
        self.recovery.start(loop)

    def _attach(self, backend: Backend) -> None:
        if self.syncer is not None and isinstance(backend, DiskQueue):
            self.syncer.attach(backend)

    def schedule(self, obj: Any) -> None:
        """Run ``obj.pump(now)`` soon (once, however often this is called before)."""
        self._dirty[obj] = None
        if self._pump_handle is None and self._loop is not None:
            self._pump_handle = self._loop.call_soon(self._run_pumps)

    def _run_pumps(self) -> None:
        self._pump_handle = None
        if self.frozen:
            return
        dirty = self._dirty
        self._dirty = {}
        now = time.monotonic_ns()
        for obj in dirty:
            if not obj.deleted:
                try:
                    obj.pump(now)
                except Exception:  # a bug: the other pumps of this turn still run
                    log.exception("%r: pump failed", obj)

    def _scan(self) -> None:
        """nsqd's queue scan: message timeouts, due deferred messages, topic retries, client
        deadlines, syncs after ``--sync-timeout``. Each pass ends with ``on_scan`` (the
        shard's heartbeat), so the supervisor sees this loop make progress. A pass that
        raises is a bug: it is logged, the scan stops (so does the heartbeat) and
        ``on_fatal`` takes the process down for the supervisor to restart."""
        assert self._loop is not None
        try:
            self._scan_once(time.monotonic_ns())
        except Exception:
            log.exception("the queue scan failed; stopping this process so that it is restarted")
            self.hooks.on_fatal()
            return
        self.hooks.on_scan()
        self._scan_handle = self._loop.call_later(SCAN_INTERVAL, self._scan)

    def _scan_once(self, now: int) -> None:
        """One pass over what is active (see the module doc): timers, retries, syncs (last,
        so a queue a timer wrote to is among them), client deadlines."""
        timed = self._timed
        for channel in list(timed):
            if not channel.deleted and channel.has_timers:
                channel.process_timers(now)
            if channel.deleted or not channel.has_timers:
                channel.timed = False
                del timed[channel]
        retrying = self._retrying
        for topic in list(retrying):
            if topic.deleted or not topic.retry_at:
                del retrying[topic]
            elif topic.retry_due(now):
                self.schedule(topic)
        if self.syncer is not None:
            self.syncer.scan(now)
        part = self._scan_turn % CLIENT_PARTS
        self._scan_turn += 1
        if not part:
            self._checking = list(self.clients)
        for client in self._checking[part::CLIENT_PARTS]:
            client.check_deadlines(now)
        for client in list(self.stuck):
            client.check_deadlines(now)

    def _watch_timers(self, channel: Channel) -> None:
        channel.timed = True
        self._timed[channel] = None

    def _watch_retry(self, topic: Topic) -> None:
        self._retrying[topic] = None

    # --- topics and channels --------------------------------------------------------------
    def _backend(self, queue_name: str, ephemeral: bool) -> Backend:
        backend = DropBackend() if ephemeral else self._backend_factory(queue_name)
        self._attach(backend)
        return backend

    def get_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            queue = self._queue_factory("topic", name, self._backend(name, name.endswith("#ephemeral")))
            topic = Topic(name, queue, self.schedule, self._watch_retry)
            self.topics[name] = topic
            log.info("TOPIC(%s): created", name)
            adopted = self.adopted.pop(("topic", name), None)
            if adopted is not None:
                queue.adopt(adopted)
            elif queue.recovering:
                topic.start_recovery()
                self.recovery.add(recover_topic(topic))
            self._changed("created", name, None)
        return topic

    def get_channel(self, topic: Topic, name: str) -> Channel:
        channel = topic.channels.get(name)
        if channel is None:
            ephemeral = topic.ephemeral or name.endswith("#ephemeral")
            queue_name = f"{topic.name}:{name}"
            queue = self._queue_factory("channel", queue_name, self._backend(queue_name, ephemeral))
            channel = Channel(topic.name, name, queue, self.schedule, self.opts.max_channel_consumers,
                              self._watch_timers)
            if self.opts.e2e_processing_latency_percentile:
                channel.e2e = LatencyWindow(self.opts.e2e_processing_latency_window_time,
                                            self.opts.e2e_processing_latency_percentile)
            topic.add_channel(channel)
            log.info("TOPIC(%s): new channel(%s)", topic.name, name)
            adopted = self.adopted.pop(("channel", queue_name), None)
            if adopted is not None:
                queue.adopt(adopted)
            elif queue.recovering:
                channel.start_recovery()
                self.recovery.add(recover_channel(channel))
                if not topic.matching:
                    self.recovery.add(match_channels(topic))
                topic.recovered_channel(channel)
            self._changed("created", topic.name, name)
        return channel

    def delete_topic(self, name: str) -> bool:
        topic = self.topics.pop(name, None)
        if topic is None:
            return False
        channels = list(topic.channels)
        topic.close(delete=True)
        log.info("TOPIC(%s): deleted", name)
        for channel in channels:
            self._changed("deleted", name, channel)
        self._changed("deleted", name, None)
        return True

    def delete_channel(self, topic: Topic, name: str) -> bool:
        channel = topic.remove_channel(name)
        if channel is None:
            return False
        channel.close(delete=True)
        log.info("CHANNEL(%s:%s): deleted", topic.name, name)
        self._changed("deleted", topic.name, name)
        return True

    def consumer_left(self, channel: Channel) -> None:
        """An ephemeral channel goes with its last consumer, an ephemeral topic with its last
        channel."""
        if channel.ephemeral and not channel.consumers and not channel.deleted:
            topic = self.topics.get(channel.topic_name)
            if topic is not None:
                self.delete_channel(topic, channel.name)
                if topic.ephemeral and not topic.channels:
                    self.delete_topic(topic.name)

    def _changed(self, event: str, topic: str, channel: str | None) -> None:
        if not self._restoring:
            self.hooks.on_change(event, topic, channel)

    def queue_names(self) -> list[tuple[str, str]]:
        """(kind, queue name) of every topic and channel (their shared-memory segments)."""
        out = []
        for topic in self.topics.values():
            out.append(("topic", topic.name))
            out.extend(("channel", f"{topic.name}:{name}") for name in topic.channels)
        return out

    def adopt(self, kind: str, name: str) -> None:
        """Recreate a queue found only in shared memory (made too late to reach nsqd.dat)."""
        topic_name, _, channel_name = name.partition(":")
        topic = self.get_topic(topic_name)
        if kind == "channel" and channel_name:
            self.get_channel(topic, channel_name)

    # --- publishing -----------------------------------------------------------------------
    def _remote(self, topic_name: str) -> Router | None:
        router = self.router
        if router is not None and router.owner(topic_name) != self.shard:
            return router
        return None

    def ensure_topic(self, name: str) -> None:
        """Create ``name`` where it lives (here, or at its owner through its inbound ring)."""
        router = self._remote(name)
        if router is None:
            self.get_topic(name)
        else:
            router.forward(name, [], 0, 0)

    def publish(self, topic_name: str, bodies: list[bytes]) -> None:
        """PUB/MPUB: store every body or none. Raises ``BrokerError``, or ``Backpressure``
        when the topic's owner is another shard whose inbound ring is full."""
        if self.exiting:
            raise BrokerError("exiting")
        if len(bodies) == 1:  # PUB and HTTP /pub: no comprehension for one message
            body = bodies[0]
            records = [self.ids.next_record(TS_ATTEMPTS.pack(time.time_ns(), 0), body)]
            size = len(body)
        else:
            records = self.ids.next_records(TS_ATTEMPTS.pack(time.time_ns(), 0), bodies)
            size = sum(map(len, bodies))
        topic = self.topics.get(topic_name)  # only this shard's own topics are in ``topics``
        router = self.router
        if router is not None:
            if topic is None and router.owner(topic_name) != self.shard:
                self._forward(router, topic_name, bodies, records, size)
                return
            router.catch_up()  # publishes acknowledged before this one was received go first
        try:
            (topic or self.get_topic(topic_name)).put_many(records, size)
        except Exception as exc:  # a disk error, a full log: the publisher gets E_PUB_FAILED / E_MPUB_FAILED
            self.health = f"NOK - {exc}"
            raise BrokerError(str(exc)) from exc
        self.health = "OK"

    def _forward(self, router: Router, topic_name: str, bodies: list[bytes], records: list[bytes],
                 size: int) -> None:
        """Publish ``records`` (of ``bodies``) into the owner's inbound ring. A batch too
        large for one ring record may be stored in part before the ring fills
        (``Backpressure.stored``); the caller's retry passes the same ``bodies`` list, and
        resumes after what is stored: never twice."""
        start = 0
        if self._partial:
            held = self._partial.pop(id(bodies), None)
            if held is not None and held[0] is bodies:
                start = held[1]
                records = records[start:]
                size = sum(map(len, bodies[start:]))
        try:
            router.forward(topic_name, records, size, 0)
        except Backpressure as exc:
            if start or exc.stored:
                self._partial[id(bodies)] = (bodies, start + exc.stored)
                if len(self._partial) > PARTIAL_KEPT:  # a client that never retried
                    del self._partial[next(iter(self._partial))]
            raise

    def stored_in_part(self, bodies: object) -> bool:
        """``bodies`` (a publish's list) is a cross-shard batch stored in part, whose retry
        must resume after what is stored (``_forward``)."""
        return id(bodies) in self._partial

    def publish_deferred(self, topic_name: str, body: bytes, delay_ms: int) -> None:
        """DPUB: deliver ``body`` after ``delay_ms``. Raises ``BrokerError``."""
        if self.exiting:
            raise BrokerError("exiting")
        record = self.ids.next_record(TS_ATTEMPTS.pack(time.time_ns(), 0), body)
        router = self.router
        if router is not None:
            if router.owner(topic_name) != self.shard:
                router.forward(topic_name, [record], len(body), delay_ms * MS)
                return
            router.catch_up()
        try:  # a full log journals the message on disk first (``MessageQueue.append``)
            self.get_topic(topic_name).put_deferred(record, delay_ms * MS, time.monotonic_ns(), len(body))
        except Exception as exc:  # as in ``publish``: the publisher gets E_DPUB_FAILED
            self.health = f"NOK - {exc}"
            raise BrokerError(str(exc)) from exc
        self.health = "OK"

    # --- metadata -------------------------------------------------------------------------
    def snapshot(self, names: Iterable[str] | None = None) -> list[TopicRecord]:
        """Topics (all, or those of ``names`` that exist) and their channels with their paused
        flags, for ``nsqd.dat``."""
        topics = self.topics.values() if names is None else filter(None, map(self.topics.get, names))
        return [TopicRecord(t.name, t.paused, [ChannelRecord(c.name, c.paused) for c in t.channels.values()])
                for t in topics]

    def restore(self, topics: list[TopicRecord]) -> None:
        """Recreate topics and channels from ``nsqd.dat`` (no change notifications), and
        recover up to ``BOOT`` records of the logs a previous process left (the rest while
        serving, once ``start`` ran)."""
        self._restoring = True
        try:
            for name, paused, channels in topics:
                topic = self.get_topic(name)
                for channel_name, channel_paused in channels:
                    channel = self.get_channel(topic, channel_name)
                    channel.paused = channel_paused
                topic.paused = paused
        finally:
            self._restoring = False
        self.recovery.run(BOOT)

    # --- a replacement process carries on (``transfer.py``) --------------------------------
    def hand_over(self) -> None:
        """Stop, and leave every queue for a replacement process of this host to carry on
        (``MessageQueue.hand_over``): no record moves, no segment is removed."""
        self.frozen = self.exiting = True
        if self._scan_handle is not None:
            self._scan_handle.cancel()
        if self._pump_handle is not None:
            self._pump_handle.cancel()
        if self.syncer is not None:
            self.syncer.close()  # waits for a sync running on the worker thread
        for topic in self.topics.values():
            for channel in topic.channels.values():
                channel.queue.hand_over()
            topic.queue.hand_over()

    def sync_all(self) -> None:
        """Ask for a sync of every disk queue now (on the syncer's worker thread)."""
        if self.syncer is None:
            return
        for topic in self.topics.values():
            for queue in (topic.queue, *(c.queue for c in topic.channels.values())):
                if isinstance(queue.backend, DiskQueue):
                    self.syncer.request(queue.backend)

    # --- shutdown -------------------------------------------------------------------------
    def close(self) -> None:
        """Persist every queue: in flight and deferred go back to the queue, memory to disk."""
        self.exiting = True
        if self._scan_handle is not None:
            self._scan_handle.cancel()
        if self._pump_handle is not None:
            self._pump_handle.cancel()
        self.recovery.stop()
        if self.syncer is not None:
            self.syncer.close()  # the queues below sync inline as they close
        for topic in list(self.topics.values()):
            try:
                topic.close()
            except Exception:
                log.exception("TOPIC(%s): failed to flush on exit", topic.name)

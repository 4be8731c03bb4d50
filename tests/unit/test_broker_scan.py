"""The broker's scan visits only what is active: channels with something in flight or
deferred, topics with a retry pending, disk queues with something to sync — and each of
these is watched from the moment it becomes active until the scan finds it idle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynsqd.node.config import NsqdOptions
from pynsqd.shard.broker import Broker
from pynsqd.shard.inflight import GRANULARITY
from pynsqd.shard.node import make_broker, queue_factory
from pynsqd.shard.syncer import Syncer
from pynsqd.shard.topic import RETRY_NS
from pynsqd.shm.diskqueue import DiskQueue
from pynsqd.wire.message import HEADER
from testbed.harness import wait_for
from tests.unit.test_channel_inflight import TIMEOUT, Consumer

MS = 1_000_000
SYNC_TIMEOUT = 50 * MS


def disk_queue(path: Path, name: str, max_msg_size: int = 1 << 20) -> DiskQueue:
    return DiskQueue(name, str(path), max_bytes_per_file=1 << 20, min_msg_size=HEADER.size,
                     max_msg_size=max_msg_size, sync_every=1_000_000, sync_timeout_ns=SYNC_TIMEOUT)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    broker = make_broker(NsqdOptions(data_path=str(tmp_path), mem_queue_bytes=1 << 16))
    yield broker
    for name in list(broker.topics):
        broker.delete_topic(name)


def test_only_channels_with_timers_are_scanned_until_their_timers_are_done(broker: Broker) -> None:
    topics = [broker.get_topic(f"t{i}") for i in range(20)]
    channels = [broker.get_channel(topic, "c") for topic in topics]
    assert not broker._timed
    now = time.monotonic_ns()
    broker.publish_deferred("t3", b"later", 50)
    deferred = channels[3]
    broker.publish("t7", [b"now"])
    consumer = Consumer(rdy=1)
    flying = channels[7]
    flying.add_consumer(consumer)
    flying.pump(now)
    assert consumer.received() and flying.in_flight
    assert list(broker._timed) == [deferred, flying] and deferred.timed and flying.timed

    broker._scan_once(now)  # nothing due yet: both stay watched
    assert list(broker._timed) == [deferred, flying]
    broker._scan_once(now + 60 * MS)  # the deferred message is ready: its channel is idle again
    assert (deferred.depth, len(deferred.deferred)) == (1, 0)
    assert list(broker._timed) == [flying] and not deferred.timed
    broker._scan_once(now + TIMEOUT + GRANULARITY)  # the in-flight message timed out
    assert (flying.timeout_count, flying.depth, flying.in_flight) == (1, 1, {})
    assert not broker._timed and not flying.timed

    broker.publish_deferred("t3", b"again", 50)  # idle, then deferred again: watched again
    assert list(broker._timed) == [deferred]
    broker.delete_topic("t3")  # a deleted channel forgets its timers and is dropped
    assert len(deferred.deferred) == 0
    broker._scan_once(now + TIMEOUT + GRANULARITY)
    assert not broker._timed
    flying.remove_consumer(consumer, now)


def test_a_topic_is_retried_from_its_failed_hand_on_until_it_succeeds(tmp_path: Path) -> None:
    """A channel whose disk queue refuses the message (too large for it) makes the topic
    keep it and retry every ``RETRY_NS``; once it goes through, the topic is not looked at."""
    def backend(name: str) -> DiskQueue:
        return disk_queue(tmp_path, name, max_msg_size=HEADER.size + 4 if name == "t:small" else 1 << 20)

    opts = NsqdOptions(data_path=str(tmp_path), mem_queue_size=0, mem_queue_bytes=1 << 16)
    broker = Broker(opts, queue_factory(opts), backend)
    try:
        for i in range(20):
            broker.get_topic(f"idle{i}")
        topic = broker.get_topic("t")
        for name in ("big", "small"):
            broker.get_channel(topic, name)
        broker.publish("t", [b"too large for t:small"])
        assert topic.retry_at and list(broker._retrying) == [topic]
        failed_at = topic.retry_at - RETRY_NS
        broker._scan_once(failed_at + RETRY_NS - 1)
        assert topic not in broker._dirty
        broker._scan_once(failed_at + RETRY_NS)
        assert topic in broker._dirty
        broker._dirty.clear()
        broker.delete_channel(topic, "small")
        topic.pump(failed_at + RETRY_NS)  # the retry goes through
        assert not topic.retry_at and topic.channels["big"].depth == 1
        broker._scan_once(failed_at + 2 * RETRY_NS)
        assert not broker._retrying and topic not in broker._dirty
    finally:
        for name in list(broker.topics):
            broker.delete_topic(name)


def test_the_syncer_scans_only_unsynced_queues_and_drops_them_once_synced(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    syncer = Syncer(loop)
    queues = [disk_queue(tmp_path, f"q{i}") for i in range(20)]
    try:
        for queue in queues:
            syncer.attach(queue)
        assert list(syncer.unsynced) == queues  # attached: it may hold unsynced writes
        syncer.scan(time.monotonic_ns())
        assert not syncer.unsynced  # none does

        written = queues[5]
        written.put(b"x" * HEADER.size)
        assert list(syncer.unsynced) == [written]
        syncer.scan(time.monotonic_ns())  # --sync-timeout has not passed
        meta = tmp_path / "q5.diskqueue.meta.dat"
        assert list(syncer.unsynced) == [written] and not meta.exists()
        syncer.scan(time.monotonic_ns() + SYNC_TIMEOUT)
        assert list(syncer.unsynced) == [written]  # a sync is running: kept

        def sync_ended() -> bool:  # the loop runs the sync's completion
            loop.run_until_complete(asyncio.sleep(0.001))
            return not syncer._states[written].running

        wait_for(sync_ended, what="the sync")
        assert meta.read_text().startswith("1\n")
        syncer.scan(time.monotonic_ns() + 2 * SYNC_TIMEOUT)
        assert not syncer.unsynced

        assert written.read() is not None  # a read is also something to sync
        assert list(syncer.unsynced) == [written]
    finally:
        syncer.close()
        for queue in queues:
            queue.close()
        loop.close()

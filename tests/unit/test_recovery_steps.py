"""A shard that restarts after a kill -9 serves while it recovers its logs in steps
(``pynsqd.shard.recovery``): the steps here are a few records, so every rule is met
mid-walk. The queues are real shared-memory segments; a crash drops the objects unclosed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynsqd.node.config import NsqdOptions
from pynsqd.shard import broker as broker_module
from pynsqd.shard import recovery
from pynsqd.shard.broker import Broker
from pynsqd.shard.node import make_broker
from pynsqd.shm.segment import list_segments, unlink_segment
from pynsqd.wire.message import HEADER
from tests.unit.test_channel_inflight import Consumer

HOUR = 3600 * 10**9


@pytest.fixture
def opts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NsqdOptions]:
    monkeypatch.setattr(recovery, "STEP", 50)
    monkeypatch.setattr(broker_module, "BOOT", 0)  # nothing before serving
    yield NsqdOptions(data_path=str(tmp_path), mem_queue_size=100_000)
    for name in list_segments(str(tmp_path)):
        unlink_segment(name)


def new_broker(opts: NsqdOptions) -> Broker:
    return make_broker(opts)


def numbered(i: int) -> bytes:
    return HEADER.pack(time.time_ns(), 0, b"%016d" % i) + b"m%d" % i


def test_a_channel_delivers_its_recovered_prefix_and_keeps_every_guarantee(opts: NsqdOptions) -> None:
    first = new_broker(opts)
    channel = first.get_channel(first.get_topic("t"), "c")
    channel.put_many([numbered(i) for i in range(1000)])
    consumer = Consumer(rdy=1000)
    channel.add_consumer(consumer)
    now = time.monotonic_ns()
    channel.pump(now)
    got = consumer.received()
    assert len(got) == 1000
    ids = [msg_id for msg_id, _ in got]
    fined = set(ids[100:400:2]) | set(ids[900:])  # FINed: must never come back
    deferred = ids[401:800:3]  # REQ'd for an hour: must wait
    channel.finish_many(consumer, sorted(fined, key=ids.index))
    for msg_id in deferred:
        channel.requeue(consumer, msg_id, HOUR, now)
    held = set(ids) - fined - set(deferred)  # in flight when the process dies: back once
    del first, channel  # kill -9

    again = new_broker(opts)
    again.restore([("t", False, [("c", False)])])
    channel = again.topics["t"].channels["c"]
    assert channel.queue.scanning and len(channel.queue) >= len(held)  # depth: an upper bound meanwhile
    consumer = Consumer(rdy=10_000)
    channel.add_consumer(consumer)
    channel.queue.put_many([numbered(5000)])  # a publish while recovering: after the backlog
    seen: list[tuple[bytes, int]] = []
    first_step = True
    while again.recovery.active:
        again.recovery.run(50)
        channel.pump(time.monotonic_ns())
        seen += consumer.received()
        if first_step:
            assert seen and channel.queue.scanning  # served before the walk is done
            first_step = False
    channel.pump(time.monotonic_ns())
    seen += consumer.received()
    delivered = [msg_id for msg_id, _ in seen]
    assert len(delivered) == len(set(delivered))  # no id twice
    assert set(delivered) == held | {b"%016d" % 5000} and delivered[-1] == b"%016d" % 5000
    assert all(attempts == 2 for msg_id, attempts in seen if msg_id in held)  # attempts kept, +1
    assert sorted(channel.deferred_at) == sorted(deferred)
    assert min(due for due, _ in channel.deferred.drain()) > time.monotonic_ns() + HOUR - 60 * 10**9
    assert (len(channel.queue), channel.queue.live) == (0, len(held) + 1 + len(deferred))
    channel.remove_consumer(consumer, time.monotonic_ns())
    again.delete_topic("t")


def test_a_topic_hands_on_only_once_it_knows_what_recovered_channels_hold(opts: NsqdOptions) -> None:
    first = new_broker(opts)
    topic = first.get_topic("t")
    a = first.get_channel(topic, "a")
    topic.pause()
    records = [numbered(i) for i in range(600)]
    topic.put_many(records, 0)
    a.put_many(records[:150])  # handed to ``a`` before the process died, not yet finished at the topic
    del first, topic, a  # kill -9

    again = new_broker(opts)
    again.restore([("t", False, [("a", False)])])
    topic = again.topics["t"]
    a = topic.channels["a"]
    assert topic.matching
    while again.recovery.active:
        again.recovery.run(50)
        topic.pump(time.monotonic_ns())
        if topic.matching:
            assert len(a.queue) <= 150  # nothing handed on meanwhile
    while topic.depth:
        topic.pump(time.monotonic_ns())
    assert a.queue.live == len(a.queue.live_ids()) == 600  # each message once
    again.delete_topic("t")

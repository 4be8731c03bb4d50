"""A cross-shard batch is stored exactly once, even when its owner dies after storing it and
before consuming it from its ring, or in the middle of storing it, or could not store it in
every queue the first time.

The owner here is shard 1 of 2 with its real queues (shared-memory logs, disk queues, the
sidecar and journal files) and its real inbound ring from shard 0. A kill -9 is an exception
no handler catches, raised at the chosen point (``Killed``), after which every object is
dropped unclosed — its shared memory and files stay exactly as the kill left them — and a
new owner on the same data path and rings starts as a restarted shard does: it restores the
topics, recovers each queue, and drains."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.node.config import NsqdOptions
from pynsqd.shard.broker import Broker
from pynsqd.shard.channel import Channel
from pynsqd.shard.queue import MessageQueue
from pynsqd.shard.topic import Topic
from pynsqd.shm import sidecar
from pynsqd.shm.ring import ByteRing
from pynsqd.wire.message import BODY_OFFSET, HEADER, ID_OFFSET
from tests.support.inbound import OwnerRig


class Killed(BaseException):
    """The owner is gone from this point on (nothing catches it, nothing after it runs)."""


def messages(count: int, first: int = 0) -> list[bytes]:
    return [HEADER.pack(1, 0, b"%016d" % (first + i)) + b"m%d" % (first + i) for i in range(count)]


def bodies(records: list[bytes]) -> list[bytes]:
    return [r[BODY_OFFSET:] for r in records]


class Rig(OwnerRig):
    """Shard 1 of 2, publishing from shard 0."""

    def publish(self, topic: str, records: list[bytes], due: int = 0) -> None:
        self.put(0, topic, records, due)

    @property
    def ring(self) -> ByteRing:
        return self.producers[0]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(**flags: Any) -> Rig:
        made.append(Rig(NsqdOptions(data_path=str(tmp_path), **flags), 2, 1))
        return made[-1]

    yield make
    for r in made:
        r.close()


def dying_after(real: Callable[..., Any]) -> Callable[..., None]:
    """``real``, after whose work the process is killed."""
    def dying(*args: Any) -> None:
        real(*args)
        raise Killed
    return dying


def kill_after(obj: Any, method: str) -> None:
    """``obj.method`` does its work, then the process is killed."""
    setattr(obj, method, dying_after(getattr(obj, method)))


def kill_before(obj: Any, method: str) -> None:
    def dying(*args: Any) -> None:
        raise Killed

    setattr(obj, method, dying)


def killed(drain: Callable[[], object]) -> None:
    with pytest.raises(Killed):
        drain()


def ready(queue: MessageQueue) -> list[bytes]:
    """Every ready message of ``queue``, its disk queue's too, in the order they come."""
    out: list[bytes] = []
    while True:
        positions, records = queue.take(1000)
        if not positions:
            return out
        queue.finish_many(positions)
        out += bodies(records)


def channels(broker: Broker, topic: str) -> dict[str, Channel]:
    return broker.topics[topic].channels


def make_topic(rig: Rig, name: str, *names: str) -> Topic:
    topic = rig.broker.get_topic(name)
    for channel in names:
        rig.broker.get_channel(topic, channel)
    return topic


def test_a_batch_stored_in_every_channel_and_not_consumed_is_not_stored_again(rig: Callable[..., Rig]) -> None:
    """A run of three records (one unit, one ``put_many``) reaches channels a, b and c, and
    the owner is killed before the consume: the restarted owner consumes it and stores
    nothing again."""
    r = rig()
    topic = make_topic(r, "t", "a", "b", "c")
    batch = messages(6)
    for i in range(0, 6, 2):
        r.publish("t", batch[i:i + 2])
    kill_after(topic, "put_many")
    killed(r.inbound.drain)
    assert len(r.ring) == 3
    r.restart()
    assert r.inbound.drain(None) == 3 and len(r.ring) == 0
    for channel in channels(r.broker, "t").values():
        assert ready(channel.queue) == bodies(batch)


def test_a_batch_stored_in_some_channels_when_the_owner_died_reaches_the_others_once(rig: Callable[..., Rig]) -> None:
    r = rig()
    topic = make_topic(r, "t", "a", "b", "c")
    batch = messages(5)
    r.publish("t", batch)
    kill_before(topic.channels["b"], "put_many")
    killed(r.inbound.drain)
    r.restart()
    r.inbound.drain(None)
    for channel in channels(r.broker, "t").values():
        assert ready(channel.queue) == bodies(batch), channel.name


def test_a_batch_kept_by_a_topic_without_channels_is_not_stored_again(rig: Callable[..., Rig]) -> None:
    r = rig()
    topic = make_topic(r, "t")
    batch = messages(4)
    r.publish("t", batch[:1])
    r.publish("t", batch[1:])
    kill_after(topic, "put_many")
    killed(r.inbound.drain)
    r.restart()
    r.inbound.drain(None)
    assert ready(r.broker.topics["t"].queue) == bodies(batch)


@pytest.mark.parametrize("when", ["after the disk write", "before the disk write"])
def test_a_batch_spilled_to_the_disk_queue_is_stored_once(rig: Callable[..., Rig], when: str) -> None:
    """``--mem-queue-size=4``: four messages go to the channel's log, six to its disk queue;
    the owner dies right after the disk write (both parts in), or in the moment between the
    log's append and the disk write (the log's part in)."""
    r = rig(mem_queue_size=4)
    make_topic(r, "t", "a")
    batch = messages(10)
    r.publish("t", batch)
    (kill_after if when == "after the disk write" else kill_before)(channels(r.broker, "t")["a"].queue.backend,
                                                                     "put_many")
    killed(r.inbound.drain)
    r.restart()
    r.inbound.drain(None)
    assert sorted(ready(channels(r.broker, "t")["a"].queue)) == sorted(bodies(batch))


def test_a_framed_batch_appended_whole_is_not_stored_again(rig: Callable[..., Rig]) -> None:
    """An MPUB of 100 (a framed record: each log appends the run with one copy)."""
    r = rig()
    topic = make_topic(r, "t", "a", "b")
    batch = messages(100)
    r.publish("t", batch)
    kill_after(topic, "put_many")
    killed(r.inbound.drain)
    r.restart()
    r.inbound.drain(None)
    for channel in channels(r.broker, "t").values():
        assert ready(channel.queue) == bodies(batch)


def test_a_deferred_batch_is_deferred_once(rig: Callable[..., Rig]) -> None:
    r = rig()
    topic = make_topic(r, "t", "a", "b")
    message = messages(1)
    r.publish("t", message, due=time.monotonic_ns() + 60 * 10**9)
    kill_after(topic, "put_deferred")
    killed(r.inbound.drain)
    r.restart()
    r.inbound.drain(None)
    for channel in channels(r.broker, "t").values():
        assert len(channel.deferred) == 1 and channel.queue.live == 1 and not ready(channel.queue)
        assert list(channel.deferred_at) == [message[0][ID_OFFSET:BODY_OFFSET]]


def test_a_deferred_batch_journaled_for_want_of_room_is_deferred_once(rig: Callable[..., Rig],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 KiB log (``--mem-queue-bytes``) full of deferred messages: the batch's message goes
    to the channel's journal on disk, and the owner dies as that write returns."""
    r = rig(mem_queue_bytes=4096, max_msg_size=100)
    topic = make_topic(r, "t", "a")
    channel = topic.channels["a"]
    files = channel.queue.files
    assert files is not None
    while files.journaled == 0:
        r.broker.publish_deferred("t", b"local", 60_000)
    kept = len(channel.deferred)
    r.publish("t", messages(1), due=time.monotonic_ns() + 60 * 10**9)
    monkeypatch.setattr(sidecar, "append_journal", dying_after(sidecar.append_journal))
    killed(r.inbound.drain)
    monkeypatch.undo()
    r.restart()
    r.inbound.drain(None)
    channel = channels(r.broker, "t")["a"]
    assert len(channel.deferred) == kept + 1 and len(channel.deferred_at) == kept + 1


@pytest.mark.parametrize("kill", [False, True], ids=["retried", "killed, then restarted"])
def test_a_batch_one_queue_refused_is_stored_again_in_that_one_only(rig: Callable[..., Rig], kill: bool) -> None:
    """Channel b refuses the batch, and so does the topic's own queue that would keep it for
    b (``--mem-queue-size=0``: every message goes to the disk queues): the batch stays in the
    ring while a holds it. A publish of the owner's own comes meanwhile. The retry stores
    the batch in b only; so does the owner restarted after a kill."""
    r = rig(mem_queue_size=0)
    topic = make_topic(r, "t", "a", "b")
    batch = messages(3)
    r.publish("t", batch)
    failing = [topic.channels["b"], topic.queue.backend]
    for obj in failing:
        obj.put_many = _refusing  # type: ignore[method-assign]
    r.inbound.drain()
    assert len(r.ring) == 1  # kept: acknowledged, never dropped
    for obj in failing:
        del obj.put_many  # type: ignore[attr-defined]
    r.broker.publish("t", [b"own"])
    if kill:
        r.restart()
    r.inbound.drain(None)
    assert len(r.ring) == 0
    for channel in channels(r.broker, "t").values():
        assert sorted(ready(channel.queue)) == sorted([*bodies(batch), b"own"]), channel.name


def _refusing(*args: Any) -> None:
    raise OSError(28, "No space left on device")

"""The owner of a topic stores what its inbound rings hold in the order it was sent: shard 0
of 3 with its real queues and its real rings from shards 1 and 2 (``shard/inbound.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.node.config import NsqdOptions
from pynsqd.shard.inbound import DRAIN_BATCH, FUTURE
from pynsqd.wire.message import BODY_OFFSET, HEADER
from tests.support.inbound import OwnerRig


class Owner(OwnerRig):
    """Shard 0 of 3; each record one message, its body naming it."""

    def publish(self, src: int, topic: str, body: bytes, sent: int) -> None:
        self.put(src, topic, [HEADER.pack(1, 0, b"%016d" % sent) + body], at=sent)

    def received(self, topic: str) -> list[bytes]:
        queue = self.broker.topics[topic].channels["c"].queue
        positions, records = queue.take(100_000)
        queue.finish_many(positions)
        return [r[BODY_OFFSET:] for r in records]


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[Owner]:
    made = Owner(NsqdOptions(data_path=str(tmp_path)), 3, 0)
    for name in ("t", "u"):
        made.broker.get_channel(made.broker.get_topic(name), "c")
    yield made
    made.close()


def test_two_rings_are_stored_merged_by_the_time_each_record_was_sent(owner: Owner) -> None:
    for sent in range(20):
        owner.publish(2 if sent % 3 else 1, "t", b"%d" % sent, sent)
    assert owner.inbound.drain() == 20
    assert owner.received("t") == [b"%d" % sent for sent in range(20)]


def test_a_ring_cut_short_by_the_turn_bound_holds_back_later_records_of_the_other(owner: Owner) -> None:
    """Ring 1 holds the even times, ring 2 the odd ones, 300 each: a turn takes 256 records
    of each, and stores those of ring 2 only up to the last one it took of ring 1 (ring 1's
    next record may be older than ring 2's others). The next turns store the rest, in order."""
    for k in range(300):
        owner.publish(1, "t", b"%d" % (2 * k), 2 * k)
        owner.publish(2, "t", b"%d" % (2 * k + 1), 2 * k + 1)
    last_of_ring_1 = 2 * (DRAIN_BATCH - 1)
    assert owner.inbound.drain() == last_of_ring_1 + 1
    assert owner.received("t") == [b"%d" % sent for sent in range(last_of_ring_1 + 1)]
    owner.inbound.drain(None)
    assert owner.received("t") == [b"%d" % sent for sent in range(last_of_ring_1 + 1, 600)]


def test_catch_up_stores_every_record_sent_before_it_however_many(owner: Owner) -> None:
    """The owner is about to store a publish of its own: everything sent before, past the
    per-turn bound; a record sent after the cutoff waits (its publish was not acknowledged
    before the owner's was received)."""
    for k in range(3 * DRAIN_BATCH):
        owner.publish(1 + k % 2, "t", b"%d" % k, k)
    later = time.monotonic_ns() + FUTURE // 2 - owner.base
    owner.publish(1, "t", b"later", later)
    owner.inbound.catch_up()
    assert owner.received("t") == [b"%d" % k for k in range(3 * DRAIN_BATCH)]
    assert len(owner.producers[1]) == 1


def test_a_record_with_a_time_far_in_the_future_is_taken_at_once(owner: Owner) -> None:
    """Its producer took the time before writing it: a later one is corrupt, and must not
    keep its ring waiting."""
    owner.publish(1, "t", b"odd", time.monotonic_ns() + 100 * FUTURE - owner.base)
    owner.publish(1, "t", b"next", 5)
    owner.inbound.drain()
    assert owner.received("t") == [b"odd", b"next"]


def test_a_batch_the_owner_cannot_store_holds_back_its_topic_in_every_ring(owner: Owner) -> None:
    """Topic t refuses ring 1's batch: ring 2's later batch for t waits behind it, its batch
    for u before it does not. Once t takes batches again, ring 1's goes first."""
    owner.publish(1, "t", b"first", 1)
    owner.publish(2, "u", b"other", 2)
    owner.publish(2, "t", b"second", 3)
    topic = owner.broker.topics["t"]
    topic.put_many = _refusing  # type: ignore[method-assign]
    assert owner.inbound.drain() == 1
    assert owner.received("u") == [b"other"] and owner.received("t") == []
    assert (len(owner.producers[1]), len(owner.producers[2])) == (1, 1)
    del topic.put_many  # type: ignore[attr-defined]
    owner.inbound.drain(None)
    assert owner.received("t") == [b"first", b"second"]


def _refusing(*args: Any) -> None:
    raise OSError(28, "No space left on device")

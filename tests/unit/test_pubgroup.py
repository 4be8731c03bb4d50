"""``PublishGroup`` on a real ``Broker`` with shared-memory queues: the ``/pub`` bodies joined
in one loop turn are stored as one batch per topic, at the end of the turn and before any
waiter hears ``OK``; a batch stops at its byte limit; a broker that is exiting fails the
whole batch with nsqd's ``503 EXITING``; requests that come alone are stored at once, with
a batch now and then to notice company."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynsqd.httpkit import HTTPError
from pynsqd.node.config import NsqdOptions
from pynsqd.shard.broker import Broker
from pynsqd.shard.node import make_broker
from pynsqd.shard.pubgroup import PROBE_EVERY, PublishGroup
from pynsqd.shm.segment import list_segments, unlink_segment
from tests.conftest import run_async


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    opts = NsqdOptions(data_path=str(tmp_path))
    broker = make_broker(opts)
    try:
        yield broker
    finally:
        for name in list(broker.topics):
            broker.delete_topic(name)
        for name in list_segments(str(tmp_path)):
            unlink_segment(name)


def test_the_bodies_of_one_turn_are_one_batch_per_topic_stored_before_the_answers(broker: Broker) -> None:
    group = PublishGroup(broker, limit=1000)
    answers: list[tuple[str, HTTPError | None, int]] = []

    def answered(name: str, topic: str, error: HTTPError | None) -> None:
        answers.append((name, error, broker.topics[topic].message_count))  # stored by now

    async def one_turn() -> None:
        for name, topic in (("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")):
            group.join(topic, name.encode()).add(answered, name, topic)
        assert not broker.topics  # nothing published inside the turn
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    run_async(one_turn())
    assert answers == [("a1", None, 3), ("a2", None, 3), ("a3", None, 3), ("b1", None, 1)]
    assert (group.published, group.batches) == (4, 2)


def test_a_batch_stops_at_its_limit(broker: Broker) -> None:
    group = PublishGroup(broker, limit=250)

    async def one_turn() -> None:
        for i in range(5):
            group.join("big", b"%d" % i + b"x" * 99)
        await asyncio.sleep(0)

    run_async(one_turn())
    assert (group.published, group.batches) == (5, 3)  # 2 + 2 + 1 bodies of 100 bytes
    assert broker.topics["big"].message_count == 5


def test_an_exiting_broker_fails_the_whole_batch(broker: Broker) -> None:
    group = PublishGroup(broker, limit=1000)
    errors: list[HTTPError | None] = []
    broker.exiting = True

    async def one_turn() -> None:
        for _ in range(2):
            group.join("gone", b"x").add(errors.append)
        await asyncio.sleep(0)

    run_async(one_turn())
    assert [(e.status, e.message) for e in errors if e is not None] == [(503, "EXITING")] * 2
    assert (group.published, group.batches) == (0, 0)


def test_requests_that_come_alone_are_stored_at_once_and_a_probe_notices_company(broker: Broker) -> None:
    group = PublishGroup(broker, limit=1000)

    async def turns() -> None:
        assert group.join("t", b"first") is not None
        await asyncio.sleep(0)  # a turn with one body: the next ones do not wait
        for i in range(PROBE_EVERY - 1):
            assert group.join("t", b"%d" % i) is None
            assert broker.topics["t"].message_count == i + 2  # stored before join returned
        probe = group.join("t", b"probe")
        assert probe is not None and group.join("t", b"company") is probe  # its turn joins it
        await asyncio.sleep(0)
        assert group.join("t", b"batched again") is not None
        await asyncio.sleep(0)

    run_async(turns())
    assert broker.topics["t"].message_count == PROBE_EVERY + 3
    assert (group.published, group.batches) == (PROBE_EVERY + 3, PROBE_EVERY + 2)


def test_a_batch_that_fails_unexpectedly_is_answered_500(broker: Broker) -> None:
    """A bug in the publish (here a body that is not bytes) is logged and answered as nsqd
    answers a failure inside, never left waiting."""
    group = PublishGroup(broker, limit=1000)
    errors: list[HTTPError | None] = []

    async def one_turn() -> None:
        group.join("t", "not bytes").add(errors.append)  # type: ignore[arg-type]
        await asyncio.sleep(0)

    run_async(one_turn())
    assert [(e.status, e.message) for e in errors if e is not None] == [(500, "INTERNAL_ERROR")]

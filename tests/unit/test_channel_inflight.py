"""A channel's delivery, FIN, TOUCH and timeouts over a real message log, without a server:
the consumer is the smallest object with ``ClientV2``'s channel-facing surface."""

from __future__ import annotations

import struct

from pynsqd.shard.backend import DropBackend
from pynsqd.shard.channel import PUMP_BUDGET, Channel, ChannelError
from pynsqd.shard.inflight import GRANULARITY
from pynsqd.shard.queue import MessageQueue
from pynsqd.shm.log import DONE, IN_FLIGHT, READY, MessageLog
from pynsqd.shm.ring import buffer_size
from pynsqd.wire.message import HEADER

TIMEOUT = 1_000_000_000


class Consumer:
    """What the channel uses of a consumer connection; frames land in ``out``."""

    def __init__(self, rdy: int) -> None:
        self.rdy = rdy
        self.in_flight_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.message_count = 0
        self.msg_timeout = TIMEOUT
        self.sample_rate = 0
        self.out = bytearray()

    def capacity(self) -> int:
        return self.rdy - self.in_flight_count

    def output(self) -> bytearray:
        return self.out

    def delivered(self, count: int) -> None:
        self.message_count += count

    def received(self) -> list[tuple[bytes, int]]:
        """(id, attempts) of each frame received since the last call."""
        got, pos = [], 0
        while pos < len(self.out):
            size, kind = struct.unpack_from(">ii", self.out, pos)
            assert kind == 2
            got.append((bytes(self.out[pos + 18:pos + 34]), struct.unpack_from(">H", self.out, pos + 16)[0]))
            pos += 4 + size
        self.out.clear()
        return got

    def received_ids(self) -> set[bytes]:
        return {msg_id for msg_id, _ in self.received()}


def channel_with(count: int) -> Channel:
    log = MessageLog(bytearray(buffer_size(1 << 20)), init=True)
    channel = Channel("t", "c", MessageQueue(log, 10_000, DropBackend()), lambda _: None)
    channel.put_many([HEADER.pack(i, 0, b"%016d" % i) + b"body" for i in range(count)])
    return channel


def test_deliver_then_fin_in_one_run_leaves_nothing_held() -> None:
    channel = channel_with(600)
    a = Consumer(rdy=600)
    channel.add_consumer(a)
    channel.pump(0)
    got = a.received()
    assert [attempts for _, attempts in got] == [1] * 600 and a.in_flight_count == 600
    assert len(channel.timeouts) == 600  # three deliveries of up to 256
    assert channel.finish_many(a, [msg_id for msg_id, _ in got]) == []
    assert a.in_flight_count == 0 and a.finish_count == 600 and not channel.in_flight
    assert len(channel.timeouts) == 0  # finished deliveries hold no ids
    assert channel.queue.live == 0 and channel.process_timers(10 * TIMEOUT) is False


def test_a_pump_yields_the_loop_after_its_budget_and_schedules_the_rest() -> None:
    """A consumer with room for everything gets ``PUMP_BUDGET`` messages per pump; the channel
    asks for another turn until all are out, each delivered once (one pump never hands out a
    whole large window, which would block the loop for as long)."""
    total = 2 * PUMP_BUDGET + 100
    scheduled: list[Channel] = []
    log = MessageLog(bytearray(buffer_size(8 << 20)), init=True)
    channel = Channel("t", "c", MessageQueue(log, 100_000, DropBackend()), scheduled.append)
    channel.put_many([HEADER.pack(i, 0, b"%016d" % i) + b"body" for i in range(total)])
    a = Consumer(rdy=10 * total)
    channel.add_consumer(a)
    scheduled.clear()
    turns = []
    while True:
        channel.pump(0)
        turns.append(len(a.received_ids()))
        if not scheduled:
            break
        assert scheduled == [channel]
        scheduled.clear()
    assert turns == [PUMP_BUDGET, PUMP_BUDGET, 100]
    assert a.in_flight_count == total and len(channel.in_flight) == total


def test_fin_errors_say_why_in_order() -> None:
    channel = channel_with(2)
    a, b = Consumer(rdy=1), Consumer(rdy=1)
    channel.add_consumer(a)
    channel.add_consumer(b)
    channel.pump(0)
    (mine, _), (theirs, _) = a.received() + b.received()
    failed = channel.finish_many(a, [b"x" * 16, theirs, mine, mine])
    assert failed == [(b"x" * 16, "ID not in flight"), (theirs, "client does not own message"),
                      (mine, "ID not in flight")]
    assert a.finish_count == 1 and b.in_flight_count == 1


def test_a_timeout_requeues_in_place_and_redelivers_with_attempts_counted() -> None:
    channel = channel_with(3)
    a = Consumer(rdy=3)
    channel.add_consumer(a)
    channel.pump(0)
    ids = [msg_id for msg_id, _ in a.received()]
    channel.finish_many(a, ids[:1])
    assert channel.process_timers(TIMEOUT - 1) is False  # not yet
    assert channel.process_timers(TIMEOUT + GRANULARITY) is True
    assert channel.timeout_count == 2 and a.in_flight_count == 0
    positions = [channel.queue.log.walk(0, 10, state)[0] for state in (READY, IN_FLIGHT, DONE)]
    assert [len(p) for p in positions] == [2, 0, 1]
    channel.pump(2 * TIMEOUT)
    assert sorted(a.received()) == [(ids[1], 2), (ids[2], 2)]


def test_touch_moves_the_deadline_and_a_stale_slot_skips_it() -> None:
    channel = channel_with(2)
    a = Consumer(rdy=2)
    channel.add_consumer(a)
    channel.pump(0)
    touched, other = (msg_id for msg_id, _ in a.received())
    channel.touch(a, touched, TIMEOUT // 2, max_msg_timeout=10 * TIMEOUT)
    assert channel.process_timers(TIMEOUT + GRANULARITY) is True
    assert set(channel.in_flight) == {touched}  # the other one timed out
    assert channel.process_timers(TIMEOUT // 2 + TIMEOUT + GRANULARITY) is True
    assert not channel.in_flight and channel.timeout_count == 2
    try:
        channel.touch(a, other, 0, TIMEOUT)
    except ChannelError as exc:
        assert str(exc) == "ID not in flight"
    else:
        raise AssertionError("TOUCH of a timed-out message must fail")


def test_a_consumer_that_leaves_gives_its_messages_back_at_once() -> None:
    channel = channel_with(4)
    a, b = Consumer(rdy=2), Consumer(rdy=2)
    channel.add_consumer(a)
    channel.add_consumer(b)
    channel.pump(0)
    assert len(a.received()) == 2 and len(b.received()) == 2
    channel.remove_consumer(a, 0)
    assert a.in_flight_count == 0 and len(channel.in_flight) == 2 and channel.queue.ready == 2

"""The in-flight timing structures alone (no I/O): ``TimeoutWheel`` and ``Delivery``."""

from __future__ import annotations

from pynsqd.shard.inflight import GRANULARITY, NO_IDS, DeferredQueue, Delivery, TimeoutWheel

MS = 1_000_000


def ids(*names: str) -> list[bytes]:
    return [name.encode().ljust(16, b"0") for name in names]


def test_a_slot_comes_due_never_early_and_at_most_one_slot_late() -> None:
    wheel = TimeoutWheel()
    deadline = 1_000 * MS + 3 * MS  # inside a slot
    wheel.add(Delivery(ids("a", "b"), "client", 0, deadline))
    assert wheel.pop_due(deadline - 1) == []
    late = -(-deadline // GRANULARITY) * GRANULARITY
    assert deadline <= late < deadline + GRANULARITY
    assert wheel.pop_due(late - 1) == []
    assert wheel.pop_due(late) == ids("a", "b")
    assert not wheel and wheel.pop_due(late + 10 * GRANULARITY) == []


def test_slots_come_out_oldest_first_whatever_the_order_they_went_in() -> None:
    wheel = TimeoutWheel()
    wheel.add(Delivery(ids("late"), None, 0, 300 * MS))
    wheel.add(Delivery(ids("early"), None, 0, 100 * MS))
    wheel.add(Delivery(ids("early2"), None, 0, 101 * MS))  # the next 10 ms slot
    wheel.add(Delivery(ids("mid"), None, 0, 200 * MS))
    assert wheel.next_due() == 100 * MS
    assert wheel.pop_due(250 * MS) == ids("early", "early2", "mid")
    assert wheel.pop_due(10_000 * MS) == ids("late")
    assert wheel.next_due() is None


def test_a_settled_delivery_frees_its_ids_before_its_slot_comes() -> None:
    wheel = TimeoutWheel()
    delivery = Delivery(ids("a", "b", "c"), None, 0, 100 * MS)
    wheel.add(delivery)
    assert len(wheel) == 3
    delivery.settle()
    delivery.settle()
    assert delivery.live == 1 and len(wheel) == 3  # one still in flight keeps them
    delivery.settle()
    assert delivery.ids is NO_IDS and len(wheel) == 0
    assert wheel and wheel.pop_due(200 * MS) == [] and not wheel


def test_clear_drops_everything() -> None:
    wheel = TimeoutWheel()
    wheel.add(Delivery(ids("a"), None, 0, 5 * MS))
    wheel.clear()
    assert not wheel and wheel.pop_due(10**12) == []


def test_deferred_queue_releases_in_due_order() -> None:
    q = DeferredQueue()
    q.push(30, b"c")
    q.push(10, b"a")
    q.push(10, b"b")  # same due time: first pushed first
    assert q.next_due() == 10
    assert q.pop_due(20) == [b"a", b"b"]
    assert q.drain() == [(30, b"c")] and len(q) == 0

"""``--mem-queue-size`` as NSQ means it: a queue's shared-memory log grows to hold that many
messages (``shm/sizing.py``, ``store.grow_log``), in place, within the node's ceiling and
what the host has left, and a kill -9 in the middle of a growth loses nothing."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from pynsqd.node.config import NsqdOptions
from pynsqd.shard.node import queue_factory
from pynsqd.shard.queue import MessageQueue, segment_queue
from pynsqd.shm import sizing, store
from pynsqd.shm.segment import Segment, list_segments, segment_name, unlink_segment
from pynsqd.shm.sizing import Grower, Host, HostRoom, LogSizing, plan
from pynsqd.wire.commands import encode_mpub
from pynsqd.wire.message import HEADER
from testbed.harness import Daemon, scaled, wait_for
from tests.support.queues import recover
from tests.support.rawclient import RawClient
from tests.test_durability_gaps import disk_queue

pytestmark = pytest.mark.slow

GiB = 1 << 30
MiB = 1 << 20
PLENTY = Host(shm_total=64 * GiB, shm_free=64 * GiB, mem_available=64 * GiB)


def message(i: int, size: int = 100) -> bytes:
    body = b"m%07d" % i
    return HEADER.pack(1_700_000_000_000_000_000, 0, b"%016d" % i) + body.ljust(size, b".")


@pytest.fixture
def data_path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path)
    for name in list_segments(str(tmp_path)):
        unlink_segment(name)


class Room(HostRoom):
    """A host with ``free`` bytes left (counted down by each growth)."""

    def __init__(self, data_path: str, free: int) -> None:
        super().__init__(data_path)
        self.free = free

    def allows(self, extra: int) -> bool:
        if extra > self.free:
            return False
        self.free -= extra
        return True


def growing_queue(data_path: str, limit: int, initial: int, ceiling: int, room: HostRoom,
                  clock: Callable[[], float] = lambda: 0.0) -> MessageQueue:
    q = segment_queue(data_path, limit, initial, "channel", "t:c", disk_queue(data_path, "t:c"))
    assert q.segment is not None
    q.grow = Grower(q.segment, ceiling, room, "CHANNEL(t:c)", clock=clock)
    return q


def drain(q: MessageQueue, count: int) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < count:
        positions, messages = q.take(min(500, count - len(out)))
        if not positions:
            break
        for pos in positions:
            q.finish(pos)
        out += messages
    return out


def test_a_log_grows_to_hold_mem_queue_size_messages_in_order(data_path: str) -> None:
    """1000 messages of 1 KiB in a 64 KiB log: it doubles until they all fit, none on disk."""
    q = growing_queue(data_path, 1000, 64 * 1024, 4 * MiB, Room(data_path, GiB))
    sent = [message(i, 1024) for i in range(1000)]
    for start in range(0, 1000, 100):
        q.put_many(sent[start:start + 100])
    assert q.backend_depth == 0 and q.ready == 1000 and q.log.capacity >= 1000 * 1024
    assert q.log.capacity <= 4 * MiB and drain(q, 1000) == sent
    # past --mem-queue-size, messages go to disk as before (no growth for them)
    cap = q.log.capacity
    q.put_many([message(i, 1024) for i in range(1500)])
    assert q.ready == 1000 and q.backend_depth == 500 and q.log.capacity == cap


def test_the_ceiling_and_the_host_bound_a_log(data_path: str) -> None:
    q = growing_queue(data_path, 100_000, 64 * 1024, 256 * 1024, Room(data_path, GiB))
    q.put_many([message(i, 1024) for i in range(1000)])
    assert q.log.capacity == 256 * 1024 and 0 < q.ready < 256 and q.ready + q.backend_depth == 1000
    now = [0.0]
    room = Room(data_path, 0)  # nothing left on the host
    r = segment_queue(data_path, 100_000, 64 * 1024, "topic", "t", disk_queue(data_path, "t"))
    assert r.segment is not None
    r.grow = Grower(r.segment, GiB, room, "TOPIC(t)", clock=lambda: now[0])
    r.put_many([message(i, 1024) for i in range(200)])
    assert r.log.capacity == 64 * 1024 and r.backend_depth > 0  # spilled, as before
    assert len(drain(r, 200)) == 200 and r.backend_depth == 0
    room.free = GiB
    r.put_many([message(i, 1024) for i in range(200)])
    assert r.log.capacity == 64 * 1024 and r.backend_depth > 0  # not asked again before RETRY_AFTER
    assert len(drain(r, 200)) == 200 and r.backend_depth == 0
    now[0] += sizing.RETRY_AFTER
    r.put_many([message(i, 1024) for i in range(200)])
    assert r.log.capacity > 64 * 1024


def test_a_wrapped_log_grows_once_its_records_no_longer_wrap(data_path: str) -> None:
    """Growing in place never moves a record: while they wrap around the end it waits."""
    q = growing_queue(data_path, 100_000, 64 * 1024, 16 * MiB, Room(data_path, GiB))
    q.put_many([message(i, 1000) for i in range(40)])
    assert drain(q, 30) == [message(i, 1000) for i in range(30)]
    q.log.release()
    q.put_many([message(i, 1000) for i in range(40, 70)])  # fits: wraps round the end
    assert q.log.unwrapped() is None and q.log.capacity == 64 * 1024
    q.put_many([message(i, 1000) for i in range(70, 100)])  # no room, and wrapped: to disk
    assert q.log.capacity == 64 * 1024 and q.backend_depth > 0
    assert drain(q, 70) == [message(i, 1000) for i in range(30, 100)]  # the log's, then the disk's
    q.log.release()
    q.put_many([message(i, 1000) for i in range(100, 300)])
    assert q.log.capacity > 64 * 1024  # unwrapped again: grown


def test_messages_published_while_some_wait_on_disk_go_behind_them(data_path: str) -> None:
    """A queue is one FIFO across its log and its disk queue: once messages spilled, later
    ones queue behind them even when the log has room again (it is served first)."""
    q = segment_queue(data_path, 100_000, 64 * 1024, "channel", "t:c", disk_queue(data_path, "t:c"))
    q.put_many([message(i, 1000) for i in range(100)])  # the log holds some, the rest spill
    spilled = q.backend_depth
    assert 0 < spilled < 100
    assert drain(q, 30) == [message(i, 1000) for i in range(30)]
    q.log.release()  # room in the log again, while messages still wait on disk
    q.put_many([message(i, 1000) for i in range(100, 110)])
    assert q.backend_depth == spilled + 10
    assert drain(q, 80) == [message(i, 1000) for i in range(30, 110)]


def test_positions_of_in_flight_and_deferred_records_survive_a_growth(data_path: str) -> None:
    q = growing_queue(data_path, 100_000, 64 * 1024, 16 * MiB, Room(data_path, GiB))
    q.put_many([message(i, 500) for i in range(50)])
    positions, messages = q.take(10)
    for pos in positions:
        q.log.deliver(pos, 1)
    q.put_many([message(i, 500) for i in range(50, 400)])
    assert q.log.capacity > 64 * 1024
    assert [q.log.message_at(p)[2][26:34] for p in positions] == [m[26:34] for m in messages]
    rest = drain(q, 390)
    assert rest == [message(i, 500) for i in range(10, 400)]


@pytest.mark.parametrize("crash_at", ["journaled", "resized", "capacity-stored"])
def test_a_kill_during_a_growth_loses_nothing(data_path: str, crash_at: str) -> None:
    """The three header words cannot be stored at once: the journal in the name page lets
    the next process finish (or drop) the growth; every record is found again."""
    q = segment_queue(data_path, 100_000, 64 * 1024, "channel", "t:c", disk_queue(data_path, "t:c"))
    assert q.segment is not None
    sent = [message(i, 300) for i in range(150)]
    q.put_many(sent)
    drain(q, 20)
    q.log.release()
    assert q.log.unwrapped() is not None
    segment, log_ = q.segment, q.log
    read, write, at = log_.unwrapped()  # type: ignore[misc]
    new = 256 * 1024
    store._GROWTH.pack_into(segment.buf, store._GROWTH_AT + 8, new, at, at + write - read)
    segment.buf[store._GROWTH_AT:store._GROWTH_AT + 8] = store._GROWTH_MAGIC
    if crash_at != "journaled":
        log_.detach()
        segment.resize(store.NAME_PAGE + store.buffer_size(new))
        if crash_at == "capacity-stored":
            words = memoryview(segment.buf)[store.NAME_PAGE:store.NAME_PAGE + 192].cast("Q")
            words[2] = new  # the capacity, not yet the indices: not a consistent ring on its own
            words.release()
    del q, log_, segment  # kill -9: nothing closed
    again = segment_queue(data_path, 100_000, 64 * 1024, "channel", "t:c", disk_queue(data_path, "t:c"))
    assert again.recovering
    recover(again)
    assert again.log.capacity == (64 * 1024 if crash_at == "journaled" else new)
    assert drain(again, 200) == sent[20:]
    assert bytes(again.segment.buf[store._GROWTH_AT:store._GROWTH_AT + 8]) == bytes(8)  # type: ignore[union-attr]


def test_the_plan_is_the_explicit_bound_or_half_of_what_the_host_has() -> None:
    explicit = plan(1 << 20, 1 << 20, PLENTY)
    assert explicit == LogSizing(explicit.initial, explicit.initial, True)
    assert explicit.initial >= 2 * (1 << 20)  # two of the largest messages always fit
    auto = plan(0, 1 << 20, Host(shm_total=8 * GiB, shm_free=8 * GiB, mem_available=6 * GiB))
    assert (auto.initial, auto.ceiling, auto.explicit) == (sizing.INITIAL, 3 * GiB, False)
    text = auto.describe(1_000_000, Host(8 * GiB, 8 * GiB, 6 * GiB))
    assert text == ("--mem-queue-size=1000000: each topic's and channel's shared-memory log starts at 32.0 MiB "
                    "and grows to hold that many messages, up to 3.0 GiB (half of the smaller of /dev/shm's "
                    "8.0 GiB and the 6.0 GiB of memory available)")
    tiny = plan(0, 1 << 20, Host(shm_total=16 * MiB, shm_free=16 * MiB, mem_available=GiB))
    assert tiny.ceiling == tiny.initial  # the ceiling never falls below the initial size


def test_host_room_counts_what_this_nodes_segments_could_still_fill(data_path: str) -> None:
    name = segment_name(data_path, "channel", "x:y")
    seg = Segment.open(name, 64 * MiB, create=True)
    try:
        seg.buf[:MiB] = b"x" * MiB  # one MiB of pages used, 63 still promised
        room = HostRoom(data_path, lambda: Host(shm_total=GiB, shm_free=512 * MiB, mem_available=GiB))
        assert 63 * MiB <= room.reserved() <= 64 * MiB
        keep = max(64 * MiB, GiB // 10)  # never the last tenth of /dev/shm (at least 64 MiB)
        left = 512 * MiB - room.reserved() - keep
        assert room.allows(left) and not room.allows(left + MiB)
    finally:
        seg.close()
        seg.unlink()


def test_queue_factory_grows_logs_only_without_an_explicit_bound(data_path: str) -> None:
    auto = queue_factory(NsqdOptions(data_path=data_path), LogSizing(64 * 1024, 8 * MiB, False))
    q = auto("topic", "a", disk_queue(data_path, "a"))
    assert q.grow is not None and q.log.capacity == 64 * 1024
    bound = queue_factory(NsqdOptions(data_path=data_path, mem_queue_bytes=1 << 20))
    assert bound("topic", "b", disk_queue(data_path, "b")).grow is None


# --- the node ----------------------------------------------------------------------------------

def _topic(nsqd: Daemon, topic: str) -> dict[str, int]:
    data = httpx.get(f"{nsqd.http_url}/stats", params={"format": "json", "topic": topic}, timeout=30).json()
    return dict(data["topics"][0]) if data["topics"] else {}


def _publish(nsqd: Daemon, topic: str, count: int, size: int) -> None:
    with RawClient(nsqd.tcp) as c:
        for start in range(0, count, 1000):
            bodies = [b"%08d" % i + b"." * (size - 8) for i in range(start, min(count, start + 1000))]
            c.send(encode_mpub(topic, bodies))
            c.expect_ok()


def test_a_node_keeps_mem_queue_size_messages_in_memory_and_after_kill_9(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """60000 messages of 1000 bytes (over 60 MB, twice the 32 MiB a log starts with) all stay
    in shared memory with --mem-queue-size=60000, and all are there after a kill -9; with
    --mem-queue-bytes as well, that bound holds and the rest goes to disk."""
    nsqd = nsqd_factory("--mem-queue-size=60000", "--shards=1", data_path=tmp_path / "a")
    assert "--mem-queue-size=60000: each topic's and channel's shared-memory log starts at 32.0 MiB" in nsqd.output
    _publish(nsqd, "big", 60000, 1000)
    t = _topic(nsqd, "big")
    assert (t["depth"], t["backend_depth"]) == (60000, 0)
    nsqd.wait_for_log(r"TOPIC\(big\): shared memory log grown to 64.0 MiB")
    nsqd.kill()
    again = nsqd_factory("--mem-queue-size=60000", "--shards=1", data_path=tmp_path / "a")
    t = _topic(again, "big")
    assert (t["depth"], t["backend_depth"]) == (60000, 0)
    with RawClient(again.tcp) as c:  # every one is there, in order
        c.subscribe("big", "ch", rdy=2500)
        seen = 0
        while seen < 60000:
            m = c.read_message(timeout=scaled(30))
            assert m.body[:8] == b"%08d" % seen
            seen += 1
            c.send(b"FIN " + m.id + b"\n")
    bounded = nsqd_factory("--mem-queue-size=60000", "--mem-queue-bytes=4194304", "--shards=1",
                           data_path=tmp_path / "b")
    assert "--mem-queue-bytes: each topic's and channel's shared-memory log holds 4.0 MiB" in bounded.output
    _publish(bounded, "big", 20000, 1000)
    wait_for(lambda: _topic(bounded, "big").get("backend_depth", 0) > 15000, what="the rest on disk")
    assert os.path.getsize(f"/dev/shm{segment_name(str(tmp_path / 'b'), 'topic', 'big')}") < 5 * MiB

"""Kill -9 at the two places where a message lives outside the shared-memory log: a deferred
message that finds no room in a full log (journaled on disk before it is acknowledged), and
a batch read back from the disk queue (peeked, stored, then committed). A crash is
simulated by dropping the objects without closing them and reopening the same shared-memory
segment and data path, as a restarted process would."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.node.config import NsqdOptions
from pynsqd.shard.broker import Broker
from pynsqd.shard.channel import Channel
from pynsqd.shard.node import make_broker
from pynsqd.shard.queue import segment_queue
from pynsqd.shard.refill import Refill
from pynsqd.shm import sidecar
from pynsqd.shm.diskqueue import DiskQueue
from pynsqd.shm.log import DEFERRED, MessageLog
from pynsqd.shm.segment import list_segments, unlink_segment
from pynsqd.wire.commands import encode_dpub, encode_fin
from pynsqd.wire.message import HEADER
from testbed.harness import Daemon, scaled, wait_for
from tests.support.queues import recover
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.slow

log = logging.getLogger("test.gaps")


def message(body: bytes) -> bytes:
    return HEADER.pack(1_700_000_000_000_000_000, 0, b"%016d" % len(body)) + body


def disk_queue(path: str, name: str, max_bytes: int = 1 << 20) -> DiskQueue:
    return DiskQueue(name, path, max_bytes_per_file=max_bytes, min_msg_size=0, max_msg_size=1 << 16,
                     sync_every=2500, sync_timeout_ns=2_000_000_000, logger=log)


@pytest.fixture
def data_path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path)
    for name in list_segments(str(tmp_path)):
        unlink_segment(name)


def _crash(q: object) -> None:
    """What kill -9 leaves: nothing closed (the segment and the files stay as they are)."""
    del q


def test_deferred_messages_without_room_survive_a_crash(data_path: str) -> None:
    q = segment_queue(data_path, 1000, 4096, "channel", "t:c", disk_queue(data_path, "t:c"))
    sent = {}
    held = []
    for i in range(200):
        record, due = message(b"dpub %03d" % i), 1_000_000 + i
        pos = q.append(record, DEFERRED, due)
        sent[record[26:]] = due
        if pos is None:
            held.append(record)
    assert len(held) > 50 and q.files.journaled == len(held)  # the log filled up
    assert Path(q.files.journal).exists()
    _crash(q)

    again = segment_queue(data_path, 1000, 4096, "channel", "t:c", disk_queue(data_path, "t:c"))
    assert again.recovering
    deferred = recover(again)
    assert {m[26:]: due for _, due, m in deferred} == sent  # every one, with its due time
    unplaced = [m for pos, _, m in deferred if pos < 0]
    assert unplaced and again.files.journaled == len(unplaced)
    assert sorted(m for _, m in sidecar.read_journal(again.files.journal, log)) == sorted(unplaced)
    again.unjournal(unplaced)  # the owner stored them elsewhere
    assert not Path(again.files.journal).exists()
    again.close(delete=True)


def test_journaled_messages_stored_elsewhere_are_not_loaded_again_after_a_crash(data_path: str) -> None:
    """Deferred messages journaled for want of room; ten come due and are stored (the log is
    full: on disk) while the others still wait. After a kill -9 each message is there once."""
    q = segment_queue(data_path, 1000, 4096, "channel", "t:c", disk_queue(data_path, "t:c"))
    held = []
    for i in range(200):
        record = HEADER.pack(1_700_000_000_000_000_000, 0, b"%016x" % i) + b"dpub %03d" % i
        if q.append(record, DEFERRED, 1_000_000 + i) is None:
            held.append(record)
    assert len(held) > 20
    q.put_many(held[:10])  # what the channel does with them once due
    q.unjournal(held[:10])
    assert q.backend_depth == 10 and Path(q.files.journal).exists()
    _crash(q)
    again = segment_queue(data_path, 1000, 1 << 16, "channel", "t:c", disk_queue(data_path, "t:c"))
    bodies = [m[26:] for _, _, m in recover(again)]  # the log's and the journal's
    bodies += [m[26:] for m in again.backend.peek_many(100)]  # and the disk queue's
    assert sorted(bodies) == [b"dpub %03d" % i for i in range(200)]
    again.close(delete=True)


def test_journal_goes_once_drained_and_a_torn_tail_loses_only_that_append(data_path: str) -> None:
    q = segment_queue(data_path, 1000, 4096, "topic", "t", disk_queue(data_path, "t"))
    while q.append(message(b"fill"), DEFERRED, 1) is not None:
        pass
    q.append(message(b"second"), DEFERRED, 2)
    assert q.files.journaled == 2
    q.unjournal([message(b"fill")])
    assert Path(q.files.journal).exists()
    with open(q.files.journal, "ab") as out:  # an append torn by the crash
        out.write(b"\0" * 11)
    _crash(q)
    again = segment_queue(data_path, 1000, 4096, "topic", "t", disk_queue(data_path, "t"))
    bodies = sorted(m[26:] for _, _, m in recover(again))
    assert bodies.count(b"second") == 1 and b"fill" in bodies
    # the journal was rewritten without the torn bytes, so later appends are readable
    assert all(len(m) > 26 for _, m in sidecar.read_journal(again.files.journal, log))
    again.close(delete=True)


def test_clean_close_writes_held_messages_to_the_sidecar_and_drops_the_journal(data_path: str) -> None:
    q = segment_queue(data_path, 1000, 4096, "channel", "t:c", disk_queue(data_path, "t:c"))
    held = []
    for i in range(100):
        record = message(b"d%03d" % i)
        if q.append(record, DEFERRED, 5 + i) is None:
            held.append((5 + i, record))
    assert held
    q.close(deferred=held)
    assert not Path(q.files.journal).exists() and not list_segments(data_path)
    again = segment_queue(data_path, 1000, 1 << 16, "channel", "t:c", disk_queue(data_path, "t:c"))
    assert len(recover(again)) == 100
    again.close(delete=True)


def test_a_close_whose_disk_fails_keeps_the_segment_and_says_why(data_path: str, caplog: pytest.LogCaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fails as a durable queue moves its messages there on exit, and again as the
    queue closes its files: both failures are logged, and the segment keeps every message
    for the next process."""
    dq = disk_queue(data_path, "t:c")
    q = segment_queue(data_path, 1000, 1 << 16, "channel", "t:c", dq)
    q.put_many([message(b"m%03d" % i) for i in range(10)])

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(dq, "put_many", full)
        patch.setattr(dq, "close", full)
        with caplog.at_level(logging.ERROR, logger="pynsqd.shard"):
            q.close()
    assert "failed to move" in caplog.text and "failed to close" in caplog.text, caplog.text
    dq.close()
    again = segment_queue(data_path, 1000, 1 << 16, "channel", "t:c", disk_queue(data_path, "t:c"))
    recover(again)
    assert len(again) == 10
    again.close(delete=True)


def test_peek_is_not_consumed_until_commit_across_a_crash(tmp_path: Path) -> None:
    path = str(tmp_path)
    dq = disk_queue(path, "q", max_bytes=64)  # a few records per file
    dq.put_many([b"r%02d" % i for i in range(20)])
    dq.sync()
    first = dq.peek_many(12)  # finishes files: a sync now would have deleted them before
    assert first == [b"r%02d" % i for i in range(12)] and dq.depth == 8
    dq.sync()                 # e.g. the timer's sync, between the read and the copy
    files = sorted(os.listdir(path))
    _crash(dq)                # died before the caller stored them

    again = disk_queue(path, "q", max_bytes=64)
    assert sorted(os.listdir(path)) == files
    assert again.depth == 20 and again.read_many(20) == [b"r%02d" % i for i in range(20)]
    again.close()

    dq = disk_queue(path, "q2", max_bytes=64)
    dq.put_many([b"s%02d" % i for i in range(20)])
    assert dq.peek_many(5) == [b"s%02d" % i for i in range(5)]
    assert dq.peek_many(5) == [b"s%02d" % i for i in range(5, 10)]  # peeks continue
    dq.commit()
    dq.sync()
    _crash(dq)
    again = disk_queue(path, "q2", max_bytes=64)
    assert again.depth == 10 and again.read_many(20) == [b"s%02d" % i for i in range(10, 20)]
    again.close()


def test_refill_commits_only_after_the_copy_into_the_log(data_path: str) -> None:
    dq = disk_queue(data_path, "t:c")
    q = segment_queue(data_path, 0, 1 << 16, "channel", "t:c", dq)  # mem-queue-size 0: all to disk
    q.put_many([message(b"m%d" % i) for i in range(30)])
    q.limit = 1000
    _, records = q.take(10)
    assert len(records) == 10 and dq.depth == 20
    dq.sync()
    _crash(q)
    # the ten moved into the log are there, and the disk queue gives the rest: none lost
    again_dq = disk_queue(data_path, "t:c")
    again = segment_queue(data_path, 1000, 1 << 16, "channel", "t:c", again_dq)
    recover(again)
    got = []
    while len(again):
        got += [r[26:] for r in again.take(50)[1]]
    assert set(got) == {b"m%d" % i for i in range(30)}
    again.close(delete=True)


class _Killed(BaseException):
    """kill -9 at a chosen instruction: nothing after it runs."""


@pytest.mark.parametrize("killed_in", [None, (Refill, "commit"), (MessageLog, "append_ready")],
                         ids=["after", "before-commit", "before-append"])
def test_a_refill_is_read_exactly_once_after_a_crash_at_any_point(
        data_path: str, killed_in: tuple[type, str] | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk queue's metadata is stale (no sync since the messages were spilled); a kill -9
    after a refill, between its append to the log and its commit, or before the append: the
    restarted queue holds every message exactly once, in the log or on disk."""
    dq = disk_queue(data_path, "t:c")
    q = segment_queue(data_path, 0, 1 << 16, "channel", "t:c", dq)  # mem-queue-size 0: all to disk
    q.put_many([message(b"m%d" % i) for i in range(30)])
    dq.sync()
    q.limit = 1000
    assert len(q.take(5)[1]) == 5  # a refill, committed: only in shared memory, not in the metadata
    if killed_in is not None:
        def killed(*args: object) -> None:
            raise _Killed
        monkeypatch.setattr(*killed_in, killed)
        with pytest.raises(_Killed):
            q.take(10)
        monkeypatch.undo()
    _crash(q)
    again = segment_queue(data_path, 1000, 1 << 16, "channel", "t:c", disk_queue(data_path, "t:c"))
    recover(again)
    got = []
    while len(again):
        got += [r[26:] for r in again.take(50)[1]]
    assert sorted(got) == sorted(b"m%d" % i for i in range(30))
    again.close(delete=True)


@pytest.mark.parametrize("handing", ["put_many", "put_deferred"])
def test_a_topic_killed_while_handing_messages_on_gives_no_channel_one_twice(
        data_path: str, handing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages wait at a paused topic (40 ready, one deferred); on unpause the topic hands
    them to channel a, and the process dies before channel b has them and before the topic
    marks them done. After the restart each channel holds each message once."""
    opts = NsqdOptions(data_path=data_path, mem_queue_size=1000)

    def broker() -> Broker:
        return make_broker(opts)

    first = broker()
    topic = first.get_topic("t")
    first.get_channel(topic, "a")
    b = first.get_channel(topic, "b")
    topic.pause()
    def numbered(i: int) -> bytes:  # a message with its own id
        return HEADER.pack(time.time_ns(), 0, b"%016x" % i) + b"m%d" % i
    topic.put_many([numbered(i) for i in range(40)], 80)
    topic.put_deferred(numbered(40), 60 * 10**9, time.monotonic_ns(), 5)
    topic.unpause()
    real = getattr(Channel, handing)

    def dies_at_b(channel: Channel, *args: Any) -> None:
        if channel is b:
            raise _Killed
        real(channel, *args)
    monkeypatch.setattr(Channel, handing, dies_at_b)
    with pytest.raises(_Killed):
        topic.pump(time.monotonic_ns())
    monkeypatch.undo()
    _crash(first)
    again = broker()
    again.restore([("t", False, [("a", False), ("b", False)])])
    topic = again.topics["t"]
    while topic.depth:
        topic.pump(time.monotonic_ns())
    for channel in topic.channels.values():
        assert channel.queue.live == len(channel.queue.live_ids()) == 41, channel
    again.delete_topic("t")


def test_dpub_into_a_full_log_survives_kill_9_of_the_tree(nsqd_factory: Callable[..., Daemon],
                                                          tmp_path: Path) -> None:
    """The real server: a 64 KiB log per queue, 300 DPUBs of 1 KB (most find no room),
    kill -9 of the whole tree, restart: every one arrives, none before its due time."""
    args = ("--mem-queue-bytes=65536", "--max-msg-size=16384", "--shards=1")
    nsqd = nsqd_factory(*args, data_path=tmp_path)
    with RawClient(nsqd.tcp) as c:  # the channel exists, so the topic hands DPUBs to it
        c.subscribe("gap", "ch", rdy=0)
        due: dict[bytes, float] = {}
        for i in range(300):
            body = b"%04d" % i + b"x" * 1000
            sent = time.time()
            c.send(encode_dpub("gap", 3000 + 10 * i, body))
            c.expect_ok()
            due[body] = sent + (3000 + 10 * i) / 1000
    assert (tmp_path / "gap:ch.diskqueue.deferred.jnl").exists()  # the log was full
    nsqd.kill()
    again = nsqd_factory(*args, data_path=tmp_path)
    got: dict[bytes, float] = {}
    with RawClient(again.tcp) as c:
        c.subscribe("gap", "ch", rdy=300)
        while len(got) < len(due):
            m = c.read_message(timeout=scaled(15))
            got.setdefault(m.body, time.time())
            c.send(encode_fin(m.id))
    assert set(got) == set(due)
    early = [body[:4] for body, at in got.items() if at < due[body] - 0.05]  # clock granularity
    assert not early
    wait_for(lambda: not (tmp_path / "gap:ch.diskqueue.deferred.jnl").exists(), scaled(10))

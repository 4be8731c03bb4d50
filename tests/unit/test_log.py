"""The message log (states in place, release, relocation, recovery) and MessageQueue's
spill/refill over a real disk queue, without a server."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from pynsqd.shard.backend import DropBackend
from pynsqd.shard.queue import MessageQueue
from pynsqd.shm.diskqueue import DiskQueue, DiskQueueError
from pynsqd.shm.log import DEFERRED, DONE, IN_FLIGHT, READY, READY_HEADER, MessageLog
from pynsqd.shm.logrecovery import LogScan
from pynsqd.shm.ring import buffer_size
from pynsqd.wire.message import ATTEMPTS, ATTEMPTS_OFFSET, HEADER


def msg(i: int, size: int = 40) -> bytes:
    return HEADER.pack(i, 0, b"%016d" % i) + b"b" * size


def new_log(capacity: int = 4096) -> tuple[bytearray, MessageLog]:
    buf = bytearray(buffer_size(capacity))
    return buf, MessageLog(buf, init=True)


def test_walk_skips_records_in_other_states_and_release_passes_done() -> None:
    _, log = new_log()
    assert log.append_ready([msg(i) for i in range(6)]) == 6
    positions, messages, cursor = log.walk(0, 3)
    assert messages == [msg(0), msg(1), msg(2)]
    log.deliver(positions[0], 1)
    log.set_deferred(positions[1], 123)
    log.set_state(positions[2], DONE)
    assert log.message_at(positions[0])[:2] == (IN_FLIGHT, 0)
    assert ATTEMPTS.unpack_from(log.message_at(positions[0])[2], ATTEMPTS_OFFSET)[0] == 1
    assert log.message_at(positions[1])[:2] == (DEFERRED, 123)
    rest = log.walk(cursor, 10)
    assert rest[1] == [msg(3), msg(4), msg(5)]
    assert log.release() == 0  # an in-flight record at the front blocks release
    log.set_state(positions[0], DONE)
    assert log.release() > 0 and log.front() is not None and log.front()[1] == DEFERRED  # type: ignore[index]
    pos = log.append(msg(9), DEFERRED, 77)
    assert pos is not None and log.message_at(pos) == (DEFERRED, 77, msg(9))


def test_recovery_in_steps_after_a_restart() -> None:
    buf, log = new_log()
    log.append_ready([msg(i) for i in range(5)])
    positions, _, _ = log.walk(0, 5)
    log.deliver(positions[0], 3)
    log.set_deferred(positions[1], 999)
    log.set_state(positions[2], DONE)
    log.close()
    again = MessageLog(buf, init=False)  # what the next process sees
    scan = LogScan(again)
    found = []
    while not scan.done:  # one record a step
        found.append(scan.step(1))
    assert len(found) == 5 and (scan.ready, scan.live, scan.walked) == (3, 4, 5)
    assert found[1] == (0, 1, [(positions[1], 999, msg(1))])
    _, messages, _ = again.walk(0, 10)
    assert [m[10:] for m in messages] == [msg(i)[10:] for i in (0, 3, 4)]  # in flight → ready
    assert ATTEMPTS.unpack_from(messages[0], ATTEMPTS_OFFSET)[0] == 3  # attempts kept


def test_rollback_and_discard_of_drained_pages() -> None:
    discarded: list[tuple[int, int]] = []
    buf = bytearray(buffer_size(4 << 20))
    log = MessageLog(buf, init=True, discard=lambda off, n: discarded.append((off, n)))
    mark = log.mark()
    log.append_ready([msg(1)])
    log.rollback(mark)
    assert len(log) == 0 and log.walk(0, 5)[1] == []
    for _ in range(3):  # 3 MiB through the log, drained as it goes
        n = log.append_ready([msg(i, 4000) for i in range(256)])
        positions, _, _ = log.walk(0, n)
        for pos in positions:
            log.set_state(pos, DONE)
        log.release()
    assert discarded and sum(n for _, n in discarded) >= 1 << 20  # given back in >= 1 MiB steps


def make_queue(tmp_path: Path, limit: int, capacity: int = 8192) -> MessageQueue:
    disk = DiskQueue("q", str(tmp_path), max_bytes_per_file=1 << 20, min_msg_size=26, max_msg_size=1 << 16,
                     sync_every=1 << 30, sync_timeout_ns=1 << 62)
    return MessageQueue(MessageLog(bytearray(buffer_size(capacity)), init=True), limit, disk)


def drain(queue: MessageQueue) -> list[bytes]:
    out = []
    while True:
        positions, messages = queue.take(7)
        if not messages:
            return out
        for pos in positions:
            queue.finish(pos)
        out += messages


@pytest.mark.parametrize("limit", [0, 10, 1000])
def test_spill_to_disk_and_refill_keeps_every_message(tmp_path: Path, limit: int) -> None:
    queue = make_queue(tmp_path, limit)
    sent = [msg(i, i % 300) for i in range(500)]
    for i in range(0, 500, 50):
        queue.put_many(sent[i:i + 50])
    assert len(queue) == 500 and queue.backend_depth == 500 - min(queue.ready, limit)
    assert sorted(drain(queue)) == sorted(sent)
    assert len(queue) == 0 and queue.backend_depth == 0
    queue.close()


def test_a_failed_backend_write_stores_nothing(tmp_path: Path) -> None:
    queue = make_queue(tmp_path, 10)
    queue.put_many([msg(i) for i in range(5)])

    class Full(DropBackend):
        def put_many(self, records: object) -> None:
            raise DiskQueueError("disk full")

    queue.backend.close()
    queue.backend = Full()
    with pytest.raises(DiskQueueError):
        queue.put_many([msg(i) for i in range(100, 120)])  # 5 fit in the log, 15 do not
    assert queue.ready == 5 and len(queue.log) == 5
    assert drain(queue) == [msg(i) for i in range(5)]


def test_requeue_in_place_and_relocation_of_a_long_lived_front(tmp_path: Path) -> None:
    queue = make_queue(tmp_path, 1000, capacity=4096)
    moved: list[tuple[int, int, int]] = []
    queue.on_move = lambda old, new, state, record: moved.append((old, new, state))
    queue.put_many([msg(i) for i in range(20)])
    positions, messages = queue.take(1)
    queue.log.deliver(positions[0], 1)  # held in flight for ever
    rest = drain(queue)
    assert len(rest) == 19
    # the log is now mostly DONE behind the in-flight front: publishing more moves it
    for i in range(100, 400, 10):
        queue.put_many([msg(j) for j in range(i, i + 10)])
        drain(queue)
    assert moved and moved[0][0] == positions[0] and moved[0][2] == IN_FLIGHT
    new_pos = moved[-1][1]
    assert queue.log.message_at(new_pos)[0] == IN_FLIGHT
    queue.requeue(new_pos)
    assert queue.log.message_at(new_pos)[0] == READY
    assert queue.take(5)[1] == [messages[0][:8] + b"\x00\x01" + messages[0][10:]]


def _frames(out: bytes) -> list[tuple[int, bytes]]:
    """(frame type, body) of each NSQ frame in ``out``."""
    frames = []
    pos = 0
    while pos < len(out):
        size, kind = struct.unpack_from(">ii", out, pos)
        frames.append((kind, out[pos + 8:pos + 4 + size]))
        pos += 4 + size
    return frames


def _with_attempts(message: bytes, attempts: int) -> bytes:
    return message[:ATTEMPTS_OFFSET] + ATTEMPTS.pack(attempts) + message[ATTEMPTS_OFFSET + 2:]


def test_deliver_ready_marks_counts_attempts_and_writes_frames_in_one_pass() -> None:
    _, log = new_log()
    log.append_ready([msg(i, size=10 + i) for i in range(5)])
    skipped, _, _ = log.walk(0, 2)
    log.set_state(skipped[1], DONE)  # not ready: skipped
    out = bytearray(b"kept")
    ids: list[bytes] = []
    positions, cursor = log.deliver_ready(0, 3, out, ids)
    assert len(positions) == 3 and ids == [b"%016d" % i for i in (0, 2, 3)]
    assert out[:4] == b"kept"
    assert _frames(bytes(out[4:])) == [(2, _with_attempts(msg(i, size=10 + i), 1)) for i in (0, 2, 3)]
    for pos, i in zip(positions, (0, 2, 3)):  # the log holds the same, in flight
        assert log.message_at(pos) == (IN_FLIGHT, 0, _with_attempts(msg(i, size=10 + i), 1))
    rest, _ = log.deliver_ready(cursor, 10, bytearray(), [])
    assert len(rest) == 1 and log.deliver_ready(cursor, 10, bytearray(), [])[0] == []


def test_deliver_at_requeued_records_carries_attempts_past_255() -> None:
    _, log = new_log()
    log.append_ready([_with_attempts(msg(1), 255), msg(2)])
    positions, _, _ = log.walk(0, 2)
    out = bytearray()
    ids: list[bytes] = []
    log.deliver_at(positions[::-1], out, ids)
    assert ids == [b"%016d" % 2, b"%016d" % 1]
    assert _frames(bytes(out)) == [(2, _with_attempts(msg(2), 1)), (2, _with_attempts(msg(1), 256))]
    assert log.message_at(positions[0])[:2] == (IN_FLIGHT, 0)


def test_deliver_ready_across_the_wrap() -> None:
    _, log = new_log(capacity=1024)
    log.append_ready([msg(i, size=100) for i in range(6)])  # 6 x 160-byte frames
    positions, _, _ = log.walk(0, 6)
    for pos in positions[:5]:
        log.set_state(pos, DONE)
    log.release()
    assert log.append_ready([msg(i, size=100) for i in range(6, 9)]) == 3  # wraps to the start
    out = bytearray()
    ids: list[bytes] = []
    delivered, _ = log.deliver_ready(0, 10, out, ids)
    assert ids == [b"%016d" % i for i in (5, 6, 7, 8)]
    assert delivered[0] > delivered[1]  # the second run starts at the front of the area
    assert [body for _, body in _frames(bytes(out))] == [_with_attempts(msg(i, size=100), 1) for i in (5, 6, 7, 8)]


def test_appending_one_message_at_a_time_stores_what_a_batch_stores() -> None:
    """``append_ready`` of one message takes the ring's single-record path: the same bytes and
    indices as the batch path, and the same "does not fit" answer (0, nothing written)."""
    one_buf, batch_buf = bytearray(buffer_size(64 << 10)), bytearray(buffer_size(64 << 10))
    one, batch = MessageLog(one_buf, init=True), MessageLog(batch_buf, init=True)
    messages = [msg(i, size=100 + i * 37) for i in range(200)]
    stored = 0
    for m in messages:
        n = one.append_ready([m])
        assert n == batch.put_many([m], READY_HEADER)
        if not n:
            break
        stored += 1
    assert 0 < stored < len(messages)  # it filled up, and both refused the same message
    assert one_buf == batch_buf
    assert one.walk(0, stored)[1] == batch.walk(0, stored)[1]

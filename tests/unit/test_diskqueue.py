"""The disk queue against real files: go-diskqueue's test behaviours, crash repair, corruption,
a full disk (RLIMIT_FSIZE in a child process) and a model-based hypothesis test.

A crash is simulated by copying the data directory while the queue is still open: the copy
holds exactly what the kernel had when the process died (writes done, metadata as of the
last sync).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pynsqd.shm.diskqueue import DiskQueue, DiskQueueError
from pynsqd.shm.diskqueue_format import Meta, Stop, frame, parse_records, plan_segments

SECOND = 1_000_000_000
OPTS: dict[str, Any] = dict(max_bytes_per_file=1 << 20, min_msg_size=4, max_msg_size=1 << 16,
                            sync_every=1 << 30, sync_timeout_ns=2 * SECOND)
Opener = Callable[..., DiskQueue]


@pytest.fixture
def open_queue(tmp_path: Path) -> Iterator[Opener]:
    """``open_queue(name="t", path=tmp_path, **options)``; every queue is closed at teardown."""
    opened: list[DiskQueue] = []

    def make(name: str = "t", path: Path = tmp_path, **options: Any) -> DiskQueue:
        queue = DiskQueue(name, str(path), **{**OPTS, **options})
        opened.append(queue)
        return queue

    yield make
    for queue in opened:
        queue.close()


def msg(i: int, size: int = 16) -> bytes:
    return (b"%08d" % i).ljust(size, b".")


def files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def meta_text(path: Path, name: str = "t") -> str:
    return (path / f"{name}.diskqueue.meta.dat").read_text()


def crash_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def drain(queue: DiskQueue) -> list[bytes]:
    out: list[bytes] = []
    while batch := queue.read_many(7):
        out += batch
    return out


# ------------------------------------------------------------------ the format, alone

def test_meta_round_trip_and_exact_text() -> None:
    meta = Meta(3, 1, 46, 2, 4096)
    assert meta.encode() == b"3\n1,46\n2,4096\n"
    assert Meta.decode(meta.encode()) == meta
    with pytest.raises(ValueError):
        Meta.decode(b"3\n1,46\n")
    assert not Meta(0, 2, 0, 1, 0).is_sane()


def test_plan_segments_rolls_before_a_write_that_would_overflow() -> None:
    assert plan_segments(0, [10] * 3, 50) == [(0, 3, False)]
    assert plan_segments(0, [10] * 3, 20) == [(0, 1, False), (1, 2, True), (2, 3, True)]
    assert plan_segments(0, [100], 20) == [(0, 1, False)]               # writePos 0 never rolls
    assert plan_segments(14, [10], 28) == [(0, 1, False)]               # exactly full is fine
    assert plan_segments(14, [10, 10], 28) == [(0, 1, False), (1, 2, True)]
    assert plan_segments(5, [100, 1], 50) == [(0, 1, True), (1, 2, True)]  # oversize record alone


def test_parse_records_stops_on_partial_and_corrupt() -> None:
    data = frame([b"abcd", b"efgh"], [4, 4])
    out: list[bytes] = []
    assert parse_records(data, 0, len(data), 1, 10, 10, out) == (16, Stop.END)
    assert out == [b"abcd", b"efgh"]
    assert parse_records(data, 0, len(data) - 1, 1, 10, 10, []) == (8, Stop.PARTIAL)
    assert parse_records(data, 0, len(data), 1, 10, 1, []) == (8, Stop.COUNT)
    assert parse_records(data, 0, len(data), 5, 10, 10, []) == (0, Stop.CORRUPT)


# ------------------------------------------------------------------ go-diskqueue behaviours

def test_put_and_read_one(open_queue: Opener) -> None:
    queue = open_queue()
    queue.put(b"test")
    assert queue.depth == 1
    assert queue.read() == b"test"
    assert queue.depth == 0
    assert queue.read() is None


def test_roll_to_second_file_keeps_order(open_queue: Opener, tmp_path: Path) -> None:
    one = msg(0)
    queue = open_queue(max_bytes_per_file=10 * (len(one) + 4))
    for i in range(11):
        queue.put(msg(i))
    assert files(tmp_path) == ["t.diskqueue.000000.dat", "t.diskqueue.000001.dat", "t.diskqueue.meta.dat"]
    queue.sync()
    assert meta_text(tmp_path) == f"11\n0,0\n1,{len(one) + 4}\n"
    for i in range(11):
        assert queue.read() == msg(i)
        assert queue.depth == 10 - i
    assert "t.diskqueue.000000.dat" not in files(tmp_path)   # read past, deleted


def test_empty_removes_files_and_queue_is_reusable(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue(max_bytes_per_file=100)
    queue.put_many([msg(i) for i in range(20)])
    queue.read_many(3)
    queue.sync()
    queue.empty()
    assert files(tmp_path) == []
    assert queue.depth == 0
    assert queue.read() is None
    queue.put_many([b"again", b"more!"])
    queue.close()
    reopened = open_queue()
    assert reopened.depth == 2
    assert drain(reopened) == [b"again", b"more!"]


def test_reopen_after_close_keeps_depth_and_order(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue(max_bytes_per_file=200)
    queue.put_many([msg(i) for i in range(50)])
    assert queue.read_many(12) == [msg(i) for i in range(12)]
    queue.close()
    queue.close()                               # idempotent
    assert queue.depth == 38                    # cached after close
    with pytest.raises(DiskQueueError):
        queue.put(b"late")
    reopened = open_queue(max_bytes_per_file=200)
    assert reopened.depth == 38
    assert drain(reopened) == [msg(i) for i in range(12, 50)]


def test_sync_after_read_metadata_as_go_diskqueue(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue(max_msg_size=1 << 20)

    def maybe_sync(now_ns: int) -> bool:  # what the shard's syncer does every scan
        if not queue.sync_wanted(now_ns):
            return False
        queue.sync()
        return True

    now = time.monotonic_ns()
    body = bytes(1000)
    queue.put(body)
    assert not maybe_sync(now)            # sync_timeout not reached
    assert maybe_sync(now + 3 * SECOND)
    assert meta_text(tmp_path) == "1\n0,0\n0,1004\n"
    assert queue.read() == body
    assert maybe_sync(now + 6 * SECOND)
    assert meta_text(tmp_path) == "0\n0,1004\n0,1004\n"
    assert not maybe_sync(now + 9 * SECOND)   # nothing happened since
    queue.put(body)
    assert maybe_sync(now + 12 * SECOND)
    assert meta_text(tmp_path) == "1\n0,1004\n0,2008\n"


def test_sync_every_counts_writes_and_reads(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue(sync_every=4)
    queue.put_many([msg(1), msg(2), msg(3)])
    assert not (tmp_path / "t.diskqueue.meta.dat").exists()
    queue.read()                                # 4th operation
    assert meta_text(tmp_path) == "2\n0,20\n0,60\n"


def test_put_many_is_all_or_nothing_on_a_bad_size(open_queue: Opener) -> None:
    queue = open_queue(max_msg_size=100)
    with pytest.raises(DiskQueueError, match="invalid message write size"):
        queue.put_many([msg(1), bytes(101), msg(2)])
    assert queue.depth == 0
    assert queue.read() is None


def test_zero_length_records(open_queue: Opener, tmp_path: Path) -> None:
    allowed = open_queue("zero", min_msg_size=0)
    allowed.put_many([b"", b"x", b""])
    assert drain(allowed) == [b"", b"x", b""]
    strict = open_queue("strict")
    with pytest.raises(DiskQueueError):
        strict.put(b"")
    # a zero-length record on disk where min_msg_size > 0 is corruption: the file goes .bad
    strict.put_many([msg(1), msg(2)])
    strict.close()
    with open(tmp_path / "strict.diskqueue.000000.dat", "r+b") as f:
        f.seek(20)
        f.write(struct.pack(">i", 0))
    reopened = open_queue("strict")
    assert drain(reopened) == [msg(1)]
    assert reopened.depth == 0
    assert "strict.diskqueue.000000.dat.bad" in files(tmp_path)


def test_resize_between_restarts(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue(max_bytes_per_file=60 * 9)
    queue.put_many([msg(i, 56) for i in range(9)])
    queue.close()
    queue = open_queue(max_bytes_per_file=60 * 2)
    queue.put_many([msg(i, 56) for i in range(9, 19)])
    queue.close()
    queue = open_queue(max_bytes_per_file=60 * 5)
    assert queue.depth == 19
    assert drain(queue) == [msg(i, 56) for i in range(19)]
    assert not [f for f in files(tmp_path) if f.endswith(".bad")]


def test_delete_removes_every_file(open_queue: Opener, tmp_path: Path) -> None:
    other = open_queue("t:c")
    other.put(b"keep")
    queue = open_queue(max_bytes_per_file=50)
    queue.put_many([msg(i) for i in range(10)])
    queue.sync()
    (tmp_path / "t.diskqueue.000000.dat.bad").write_bytes(b"junk")
    queue.delete()
    other.sync()
    assert files(tmp_path) == ["t:c.diskqueue.000000.dat", "t:c.diskqueue.meta.dat"]


# ------------------------------------------------------------------ crash repair

def test_torn_tail_is_cut_off(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue()
    queue.put_many([msg(i) for i in range(5)])
    queue.close()
    with open(tmp_path / "t.diskqueue.000000.dat", "ab") as f:
        f.write(struct.pack(">i", 100) + b"only-part-of-it")
    queue = open_queue()
    assert (tmp_path / "t.diskqueue.000000.dat").stat().st_size == 100
    assert queue.depth == 5
    queue.put(msg(5))                           # appends right after the last whole record
    assert drain(queue) == [msg(i) for i in range(6)]


def test_stale_metadata_keeps_unsynced_records_and_never_overwrites(
        open_queue: Opener, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    queue = open_queue(path=live)
    queue.put_many([msg(i) for i in range(5)])
    queue.sync()
    queue.put_many([msg(i) for i in range(5, 8)])   # written, not synced
    crashed = crash_copy(live, tmp_path / "crashed")
    with open(crashed / "t.diskqueue.000000.dat", "ab") as f:
        f.write(struct.pack(">i", 16) + b"torn")   # and a record cut short by the crash
    assert meta_text(crashed) == "5\n0,0\n0,100\n"
    recovered = open_queue(path=crashed)
    assert recovered.depth == 8
    recovered.put_many([msg(8), msg(9)])
    assert "t.diskqueue.000001.dat" in files(crashed)   # writes moved to the next file
    assert (crashed / "t.diskqueue.000000.dat").stat().st_size == 160
    assert drain(recovered) == [msg(i) for i in range(10)]
    assert recovered.depth == 0


def test_stale_read_position_redelivers(open_queue: Opener, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    queue = open_queue(path=live)
    queue.put_many([msg(i) for i in range(6)])
    queue.sync()
    queue.read_many(4)                          # consumed, not synced
    recovered = open_queue(path=crash_copy(live, tmp_path / "crashed"))
    assert recovered.depth == 6                 # at least once: nothing is lost
    assert drain(recovered) == [msg(i) for i in range(6)]


def test_skip_to_resumes_at_a_committed_position_the_metadata_never_saw(
        open_queue: Opener, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    queue = open_queue(path=live, max_bytes_per_file=100)  # 5 records of 20 bytes a file
    queue.put_many([msg(i) for i in range(10)])
    queue.sync()
    queue.read_many(3)                          # consumed, not synced
    assert queue.peek_many(1) == [msg(3)]
    assert queue.committed_position == (0, 60) and queue.read_position == (0, 80)
    queue.commit(0)
    recovered = open_queue(path=crash_copy(live, tmp_path / "crashed"))
    assert recovered.depth == 10
    assert recovered.skip_to((0, 59)) == 0 and recovered.depth == 10  # not a record boundary
    assert recovered.skip_to((9, 0)) == 0 and recovered.depth == 10   # past the write position
    assert recovered.skip_to((0, 60)) == 3 and recovered.depth == 7
    assert recovered.skip_to((0, 20)) == 0                            # behind it now
    recovered.sync()                            # persists the new position
    assert meta_text(tmp_path / "crashed") == "7\n0,60\n1,100\n"
    assert drain(recovered) == [msg(i) for i in range(3, 10)]


def test_missing_metadata_recovers_by_scanning(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue(max_bytes_per_file=100)
    queue.put_many([msg(i) for i in range(12)])
    assert queue.read_many(6)[-1] == msg(5)     # finishes file 0, which is deleted
    queue.close()
    (tmp_path / "t.diskqueue.meta.dat").unlink()
    with open(tmp_path / "t.diskqueue.000002.dat", "ab") as f:
        f.write(b"\x00\x00")                    # torn header at the tail
    queue = open_queue(max_bytes_per_file=100)
    # without metadata the read position in file 1 is unknown: record 5 comes again
    assert queue.depth == 7
    queue.put(msg(12))
    assert drain(queue) == [msg(i) for i in range(5, 13)]
    assert not [f for f in files(tmp_path) if f.endswith(".bad")]


def test_files_written_after_the_last_sync_are_found(open_queue: Opener, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    queue = open_queue(path=live, max_bytes_per_file=100)
    queue.put_many([msg(i) for i in range(3)])
    queue.sync()
    crashed = crash_copy(live, tmp_path / "crashed")
    queue.put_many([msg(i) for i in range(3, 14)])  # rolls twice
    for name in files(live):
        if name.endswith(".dat") and "meta" not in name:
            shutil.copy(live / name, crashed / name)   # data reached disk, the roll's metadata did not
    recovered = open_queue(path=crashed)
    assert recovered.depth == 14
    assert drain(recovered) == [msg(i) for i in range(14)]


def test_write_file_shorter_than_metadata_is_rescanned(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue()
    queue.put_many([msg(i) for i in range(10)])
    queue.close()
    os.truncate(tmp_path / "t.diskqueue.000000.dat", 70)   # lost 6.5 records the metadata counts
    queue = open_queue()
    assert queue.depth == 3
    assert (tmp_path / "t.diskqueue.000000.dat").stat().st_size == 60   # torn record cut
    queue.put(msg(10))
    assert drain(queue) == [msg(0), msg(1), msg(2), msg(10)]
    assert queue.depth == 0


# ------------------------------------------------------------------ corruption while reading

def test_corrupt_file_in_the_middle_is_skipped(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue(max_bytes_per_file=100)      # 5 records of 20 bytes per file
    queue.put_many([msg(i) for i in range(20)])
    queue.close()
    with open(tmp_path / "t.diskqueue.000001.dat", "r+b") as f:
        f.seek(40)
        f.write(struct.pack(">i", 1 << 30))         # record 7: impossible size
    with open(tmp_path / "t.diskqueue.000002.dat", "r+b") as f:
        f.truncate(50)                              # records 10 and 11 whole, 12 torn, 13..14 gone
    queue = open_queue(max_bytes_per_file=100)
    assert queue.read_many(7) == [msg(i) for i in range(7)]
    assert queue.depth == 13
    assert queue.read_many(2) == [msg(10), msg(11)]   # record 7 is corrupt: file 1 skipped
    assert queue.depth == 5                     # recounted from the files that remain
    assert drain(queue) == [msg(i) for i in range(15, 20)]
    assert queue.depth == 0
    assert {"t.diskqueue.000001.dat.bad", "t.diskqueue.000002.dat.bad"} <= set(files(tmp_path))
    queue.put(msg(20))
    assert queue.read() == msg(20)


def test_corrupt_write_file_moves_writing_on(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue()
    queue.put_many([msg(i) for i in range(3)])
    queue.close()
    with open(tmp_path / "t.diskqueue.000000.dat", "r+b") as f:
        f.seek(20)
        f.write(struct.pack(">i", -5))
    queue = open_queue()
    assert drain(queue) == [msg(0)]
    queue.put(msg(3))                           # goes to a new file, after the bad one
    assert queue.read() == msg(3)
    assert "t.diskqueue.000000.dat.bad" in files(tmp_path)


def test_missing_file_in_the_middle_is_skipped(open_queue: Opener, tmp_path: Path) -> None:
    queue = open_queue(max_bytes_per_file=100)
    queue.put_many([msg(i) for i in range(15)])
    queue.close()
    (tmp_path / "t.diskqueue.000001.dat").unlink()
    queue = open_queue(max_bytes_per_file=100)
    assert drain(queue) == [msg(i) for i in (*range(5), *range(10, 15))]
    assert queue.depth == 0


# ------------------------------------------------------------------ a full disk, for real

_FULL_DISK_CHILD = r"""
import json, resource, signal, sys
from pynsqd.shm.diskqueue import DiskQueue, DiskQueueError

path, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
q = DiskQueue("t", path, max_bytes_per_file=8000, min_msg_size=1, max_msg_size=20000,
              sync_every=10**9, sync_timeout_ns=10**9)
errors, stored = [], []
def attempt(records):
    depth = q.depth
    try:
        q.put_many(records)
        stored.extend(r.decode() for r in records)
    except DiskQueueError as exc:
        errors.append(str(exc))
        assert q.depth == depth, (q.depth, depth)
for i in range(76):                        # 76 x 104 = 7904 bytes in file 0
    attempt([b"%0100d" % i])
attempt([b"%0100d" % 76, b"x" * 12000])    # rolls twice; the third file hits EFBIG
attempt([b"y" * 9997])                     # 10001 bytes: one past the limit, alone in file 1
attempt([b"z" * 9996])                     # exactly the limit: fits
print(json.dumps({"errors": errors, "stored": stored, "depth": q.depth}))
q.close()
"""


def test_write_failure_on_a_full_disk_keeps_everything_stored(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run([sys.executable, "-c", _FULL_DISK_CHILD, str(tmp_path), "10000"],
                           capture_output=True, text=True, env=env, timeout=60, check=False)
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout)
    assert len(report["errors"]) == 2
    assert all("File too large" in e for e in report["errors"]), report["errors"]
    assert report["depth"] == 77
    assert (tmp_path / "t.diskqueue.000000.dat").stat().st_size == 7904
    assert (tmp_path / "t.diskqueue.000001.dat").stat().st_size == 10000
    queue = DiskQueue("t", str(tmp_path), **{**OPTS, "max_bytes_per_file": 8000, "min_msg_size": 1})
    assert queue.depth == 77
    assert [r.decode() for r in drain(queue)] == report["stored"]
    assert report["stored"][-1] == "z" * 9996
    assert not [f for f in files(tmp_path) if f.endswith(".bad")]
    queue.close()


# ------------------------------------------------------------------ torture and model

def test_torture_puts_across_restarts(open_queue: Opener, tmp_path: Path) -> None:
    rng = random.Random(7)
    expected: deque[bytes] = deque()
    n = 0
    for _ in range(8):
        queue = open_queue(max_bytes_per_file=rng.choice([300, 2000, 1 << 16]),
                           sync_every=rng.choice([1, 50, 1 << 30]))
        assert queue.depth == len(expected)
        for _ in range(60):
            if rng.random() < 0.2:
                for record in queue.read_many(rng.randint(1, 30)):
                    assert record == expected.popleft()
            else:
                batch = [msg(n + i, rng.randint(8, 400)) for i in range(rng.randint(1, 40))]
                n += len(batch)
                if len(batch) > 1:
                    queue.put_many(batch)
                else:
                    queue.put(batch[0])
                expected.extend(batch)
        queue.close()
    queue = open_queue()
    assert queue.depth == len(expected) > 1000
    assert drain(queue) == list(expected)


def test_sync_in_a_thread_while_writing(open_queue: Opener, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor
    queue = open_queue(max_bytes_per_file=4000)
    with ThreadPoolExecutor(1) as pool:
        for i in range(50):
            pending = pool.submit(queue.sync)
            queue.put_many([msg(i * 10 + j) for j in range(10)])
            queue.read_many(3)
            pending.result()
    queue.close()
    reopened = open_queue(max_bytes_per_file=4000)
    assert reopened.depth == 350
    assert drain(reopened) == [msg(i) for i in range(150, 500)]


class QueueModel(RuleBasedStateMachine):
    """Random puts, reads, syncs, empties and reopens agree with a plain deque."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="dq-model-")
        self.model: deque[bytes] = deque()
        self.n = 0
        self.max_bytes = 120
        self.queue = self._open()

    def _open(self) -> DiskQueue:
        return DiskQueue("t:c", self.dir, max_bytes_per_file=self.max_bytes, min_msg_size=8,
                         max_msg_size=200, sync_every=5, sync_timeout_ns=SECOND)

    def _records(self, sizes: list[int]) -> list[bytes]:
        records = [msg(self.n + i, size) for i, size in enumerate(sizes)]
        self.n += len(sizes)
        return records

    @rule(size=st.integers(8, 200))
    def put(self, size: int) -> None:
        [record] = self._records([size])
        self.queue.put(record)
        self.model.append(record)

    @rule(sizes=st.lists(st.integers(8, 200), max_size=12))
    def put_many(self, sizes: list[int]) -> None:
        records = self._records(sizes)
        self.queue.put_many(records)
        self.model.extend(records)

    @rule(count=st.integers(1, 10))
    def read_many(self, count: int) -> None:
        expected = [self.model.popleft() for _ in range(min(count, len(self.model)))]
        assert self.queue.read_many(count) == expected

    @rule()
    def read(self) -> None:
        assert self.queue.read() == (self.model.popleft() if self.model else None)

    @rule()
    def sync(self) -> None:
        self.queue.sync()

    @precondition(lambda self: len(self.model) < 30)
    @rule()
    def empty(self) -> None:
        self.queue.empty()
        self.model.clear()

    @rule(max_bytes=st.sampled_from([60, 120, 500]))
    def reopen(self, max_bytes: int) -> None:
        self.queue.close()
        self.max_bytes = max_bytes
        self.queue = self._open()

    @invariant()
    def depth_matches(self) -> None:
        assert self.queue.depth == len(self.model)

    def teardown(self) -> None:
        self.queue.close()
        shutil.rmtree(self.dir)


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_records_after_counts_what_an_append_got_onto_disk_before_a_crash(
        open_queue: Opener, tmp_path: Path) -> None:
    """The owner of a queue keeps ``write_position`` before an append; after a crash the
    reopened queue says how many whole records of it reached the files: across a roll, with
    stale metadata (writing moves to a fresh file) and a torn last record cut off."""
    live = tmp_path / "live"
    live.mkdir()
    queue = open_queue(path=live, max_bytes_per_file=200)
    queue.put_many([msg(i) for i in range(3)])
    queue.sync()
    before = queue.write_position
    assert queue.records_after(before) == 0
    queue.put_many([msg(i) for i in range(3, 13)])  # 20-byte records: rolls at 200 bytes
    assert queue.write_position[0] > before[0] and queue.records_after(before) == 10
    crashed = crash_copy(live, tmp_path / "crashed")
    last = crashed / f"t.diskqueue.{queue.write_position[0]:06d}.dat"
    with open(last, "ab") as f:
        f.write(struct.pack(">i", 16) + b"torn")
    recovered = open_queue(path=crashed, max_bytes_per_file=200)
    assert recovered.records_after(before) == 10
    assert recovered.records_after(recovered.write_position) == 0

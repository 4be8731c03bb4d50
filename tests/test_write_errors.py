"""Disk write errors (RLIMIT_FSIZE: the kernel refuses to grow a file, EFBIG) on the paths
that used to lose or repeat messages: a refill from the disk queue whose leftovers could
not be written back, a deferred message a topic hands to a channel whose journal write
fails, and an oversize cross-shard batch split into several ring records.

The queue-level test runs in a child process (the limit applies to the whole process) and
ends it with ``os._exit`` after a sync, as a kill -9 would leave it; the others run real
nodes and set the limit on a shard with ``prlimit``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynsqd.shard.queue import segment_queue
from pynsqd.shm.diskqueue import DiskQueue
from pynsqd.shm.segment import list_segments, unlink_segment
from pynsqd.wire.message import HEADER


@pytest.fixture
def data_path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path)
    for name in list_segments(str(tmp_path)):
        unlink_segment(name)


def _child(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                           env=env, timeout=60, check=False)
    assert child.returncode == 0, child.stderr
    return child.stderr


def message(body: bytes) -> bytes:
    return HEADER.pack(1_700_000_000_000_000_000, 0, b"%016d" % len(body)) + body


def disk_queue(path: str, name: str) -> DiskQueue:
    return DiskQueue(name, path, max_bytes_per_file=1 << 20, min_msg_size=0, max_msg_size=1 << 16,
                     sync_every=2500, sync_timeout_ns=2_000_000_000)


# A queue whose log holds 16 KiB, 30 messages of 6 KB on disk; the file-size limit is the
# data file's size, so nothing more can be appended to it. A take reads a batch sized for
# messages of 4 KiB: the third 6 KB message does not fit the log.
_REFILL_CHILD = r"""
import os, resource, sys
from tests.test_write_errors import disk_queue, message
from pynsqd.shard.queue import segment_queue

path = sys.argv[1]
dq = disk_queue(path, "t:c")
q = segment_queue(path, 0, 16384, "channel", "t:c", dq)
q.put_many([message(b"%05d" % i + b"x" * 6000) for i in range(30)])
dq.sync()
size = os.path.getsize(os.path.join(path, "t:c.diskqueue.000000.dat"))
resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
q.limit = 1000
positions, records = q.take(10)
print("took", len(records), file=sys.stderr)
dq.sync()       # the committed read position is on disk, as the timer would have it
os._exit(0)     # then kill -9: nothing closed
"""


def test_a_refill_commits_only_what_reached_the_log(data_path: str) -> None:
    err = _child(_REFILL_CHILD, data_path)
    assert "took 2" in err, err
    again = segment_queue(data_path, 1000, 16384, "channel", "t:c", disk_queue(data_path, "t:c"))
    again.recover()
    got = []
    for _ in range(200):
        if not len(again):
            break
        positions, records = again.take(2)
        got += [r[26:31] for r in records]
        for pos in positions:
            again.finish(pos)
    assert sorted(set(got)) == [b"%05d" % i for i in range(30)]  # none lost
    assert got == sorted(got)  # and read in order: what did not fit stays at the front
    again.close(delete=True)


def test_a_partial_commit_reads_the_rest_again_across_files_and_a_crash(tmp_path: Path) -> None:
    path = str(tmp_path)
    dq = DiskQueue("q", path, max_bytes_per_file=64, min_msg_size=0, max_msg_size=1 << 16,
                   sync_every=2500, sync_timeout_ns=2_000_000_000)  # a few records per file
    dq.put_many([b"r%02d" % i for i in range(20)])
    assert dq.peek_many(12) == [b"r%02d" % i for i in range(12)]
    dq.commit(5)
    assert dq.depth == 15
    assert dq.peek_many(3) == [b"r05", b"r06", b"r07"]  # the reader moved back
    dq.commit(0)
    dq.sync()
    del dq  # a crash: nothing closed
    again = DiskQueue("q", path, max_bytes_per_file=64, min_msg_size=0, max_msg_size=1 << 16,
                      sync_every=2500, sync_timeout_ns=2_000_000_000)
    assert again.depth == 15 and again.read_many(20) == [b"r%02d" % i for i in range(5, 20)]
    again.close()

"""Shared-memory segments (real POSIX shm under /dev/shm) and a ByteRing shared by a
producer process and a consumer process."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from functools import reduce
from pathlib import Path

import pytest

from pynsqd.shm.ring import ByteRing, buffer_size
from pynsqd.shm.segment import MAX_NAME, Segment, SegmentError, list_segments, segment_name, unlink_segment
from testbed.harness import wait_for
from tests.support.shm_worker import payload

pytestmark = pytest.mark.fast


@pytest.fixture
def data_path(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "data")
    os.mkdir(path)
    yield path
    for name in list_segments(path):
        unlink_segment(name)


def test_names_are_per_node_valid_and_distinct(data_path: str, tmp_path: Path) -> None:
    a = segment_name(data_path, "channel", "orders:archive")
    assert a.startswith("/pynsqd-") and a.count("/") == 1 and a.endswith("-channel-orders:archive")
    assert segment_name(data_path + "/", "channel", "orders:archive") == a  # realpath
    os.symlink(data_path, tmp_path / "link")
    assert segment_name(str(tmp_path / "link"), "channel", "orders:archive") == a
    assert segment_name(str(tmp_path), "channel", "orders:archive") != a
    assert segment_name(data_path, "topic", "orders") != segment_name(data_path, "channel", "orders")
    names = {segment_name(data_path, "channel", n) for n in ["a" * 300, "a" * 301, "x/y", "x:y", "é"]}
    assert len(names) == 5
    for name in names:
        assert len(name.encode()) <= MAX_NAME and "/" not in name[1:]
    long = segment_name(data_path, "channel", "t" * 64 + ":" + "c" * 64 + "#ephemeral")
    assert long.endswith("c#ephemeral")  # NSQ's longest names still read as themselves


def test_create_open_list_unlink(data_path: str) -> None:
    name = segment_name(data_path, "topic", "t1")
    with pytest.raises(SegmentError):
        Segment.open(name, 4096, create=False)
    seg = Segment.open(name, 1 << 20, create=True)
    assert seg.created and seg.size == 1 << 20
    ring = ByteRing(seg.buf, init=True)
    ring.put_many([b"kept", b"across"])
    ring.close()
    seg.close()
    again = Segment.open(name, 4096, create=True)  # exists: keeps its size and contents
    assert not again.created and again.size == 1 << 20
    ring = ByteRing(again.buf, init=False)
    assert ring.take_many(5) == [b"kept", b"across"]
    ring.close()
    other = segment_name(data_path, "channel", "t1:c")
    Segment.open(other, 8192, create=True).close()
    assert list_segments(data_path) == sorted([name, other])
    again.unlink()
    again.close()
    assert list_segments(data_path) == [other]
    assert unlink_segment(other) and not unlink_segment(other)
    assert list_segments(data_path) == []


def test_a_segment_left_unsized_is_sized_and_counts_as_created(data_path: str) -> None:
    import posix_ipc
    name = segment_name(data_path, "topic", "torn")
    posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=0).close_fd()
    seg = Segment.open(name, 65536, create=True)
    assert seg.created and seg.size == 65536
    seg.close()


def test_producer_and_consumer_processes_move_200k_records(data_path: str) -> None:
    count = 200_000
    name = segment_name(data_path, "inbound", "test")
    seg = Segment.open(name, buffer_size(64 * 1024), create=True)
    ring = ByteRing(seg.buf, init=True)
    procs = []
    try:
        for role in ("consume", "produce"):
            procs.append(subprocess.Popen([sys.executable, "-m", "tests.support.shm_worker", role, name, str(count)],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        # done when both exit; a failed worker ends the wait at once
        wait_for(lambda: all(p.poll() is not None for p in procs) or any(p.poll() for p in procs),
                 timeout=120, interval=0.05, what="producer and consumer")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    outputs = [p.communicate()[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    expected = reduce(lambda acc, i: acc ^ zlib.crc32(payload(i)), range(count), 0)
    assert outputs[0].split() == ["ok", str(count), str(expected)]
    assert len(ring) == 0 and ring.used_bytes == 0
    ring.close()
    seg.close()

"""The deferred-messages sidecar (``pynsqd.shm.sidecar``) and a durable queue's clean close:
format round trip, corrupt files renamed ``.bad``, and a shared-memory queue that moves to
disk on close and comes back (ready, in flight with attempts, deferred with due times)."""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pynsqd.shard.backend import DropBackend
from pynsqd.shard.queue import segment_queue
from pynsqd.shm import sidecar
from pynsqd.shm.diskqueue import DiskQueue
from pynsqd.shm.log import DEFERRED
from pynsqd.shm.segment import list_segments, unlink_segment
from pynsqd.wire.message import ATTEMPTS, ATTEMPTS_OFFSET, HEADER
from tests.support.queues import recover

log = logging.getLogger("test.sidecar")


def message(body: bytes, attempts: int = 0) -> bytes:
    return HEADER.pack(1_700_000_000_000_000_000, attempts, b"%016d" % len(body)) + body


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=64)), max_size=20))
def test_encode_decode_round_trip(records: list[tuple[int, bytes]]) -> None:
    assert sidecar.decode(sidecar.encode(records)) == records


def test_layout_is_the_documented_one() -> None:
    data = sidecar.encode([(7, b"abc")])
    body = b"PYNSQDEF" + struct.pack(">II", 1, 1) + struct.pack(">QI", 7, 3) + b"abc"
    assert data == body + struct.pack(">I", zlib.crc32(body))


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "version", "empty", "extra"])
def test_corrupt_file_is_renamed_bad_and_logged(tmp_path: Path, damage: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    path = str(tmp_path / "t.diskqueue.deferred.dat")
    good = sidecar.encode([(1, b"one"), (2, b"two")])
    data = {"truncate": good[:-5], "flip": good[:20] + bytes([good[20] ^ 1]) + good[21:],
            "magic": b"X" + good[1:], "version": good[:8] + struct.pack(">I", 9) + good[12:],
            "empty": b"", "extra": good + b"\0"}[damage]
    Path(path).write_bytes(data)
    with caplog.at_level(logging.ERROR, logger="test.sidecar"):
        assert sidecar.read(path, log) == []
    assert not Path(path).exists() and Path(path + ".bad").read_bytes() == data
    assert "is corrupt" in caplog.text and ".bad" in caplog.text


def test_write_replaces_atomically_and_empty_removes(tmp_path: Path) -> None:
    path = str(tmp_path / "t.diskqueue.deferred.dat")
    assert sidecar.read(path, log) == []  # none: nothing, no error
    sidecar.write(path, [(5, b"x")])
    sidecar.write(path, [(6, b"y"), (7, b"z")])
    assert sidecar.read(path, log) == [(6, b"y"), (7, b"z")]
    assert [p.name for p in tmp_path.iterdir()] == ["t.diskqueue.deferred.dat"]  # no temp left
    sidecar.write(path, [])
    assert not list(tmp_path.iterdir())


@pytest.fixture
def data_path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path)
    for name in list_segments(str(tmp_path)):
        unlink_segment(name)


def disk_queue(path: str, name: str) -> DiskQueue:
    return DiskQueue(name, path, max_bytes_per_file=1 << 20, min_msg_size=26, max_msg_size=1 << 16,
                     sync_every=2500, sync_timeout_ns=2_000_000_000, logger=log)


def test_clean_close_moves_a_durable_queue_to_disk_and_back(data_path: str) -> None:
    q = segment_queue(data_path, 100, 1 << 16, "channel", "t:c", disk_queue(data_path, "t:c"))
    assert not q.recovering and q.files is not None and q.files.sidecar == sidecar.sidecar_path(data_path, "t:c")
    q.put_many([message(b"m%d" % i) for i in range(6)])
    positions, _ = q.take(3)
    q.log.deliver(positions[0], 1)                 # in flight, attempts 1
    q.log.deliver(positions[1], 2)
    q.finish(positions[1])                         # FINed: never again
    q.log.set_deferred(positions[2], 123_456_789)  # deferred with its due time
    pos = q.append(message(b"dpub"), DEFERRED, 987_654_321)
    assert pos is not None
    q.close(deferred=[(555, message(b"held in memory"))])
    assert not list_segments(data_path)  # nothing left in shared memory

    again = segment_queue(data_path, 100, 1 << 16, "channel", "t:c", disk_queue(data_path, "t:c"))
    assert again.recovering
    deferred = recover(again)
    assert sorted((due, m[26:]) for _, due, m in deferred) == [
        (555, b"held in memory"), (123_456_789, b"m2"), (987_654_321, b"dpub")]
    assert all(p >= 0 for p, _, _ in deferred) and again.live == 3
    assert not Path(again.files.sidecar if again.files else "").exists()  # loaded into the log, then removed
    got = []
    while len(again):
        _, records = again.take(10)
        got += [(r[26:], ATTEMPTS.unpack_from(r, ATTEMPTS_OFFSET)[0]) for r in records]
    assert sorted(got) == [(b"m0", 1), (b"m3", 0), (b"m4", 0), (b"m5", 0)]
    again.close(delete=True)
    assert not list(Path(data_path).iterdir()) and not list_segments(data_path)


def test_ephemeral_queue_has_no_sidecar_and_keeps_its_segment(data_path: str) -> None:
    q = segment_queue(data_path, 100, 1 << 16, "topic", "e#ephemeral", DropBackend())
    assert q.files is None
    q.append(message(b"d"), DEFERRED, 1)
    q.close()
    assert len(list_segments(data_path)) == 1 and not list(Path(data_path).iterdir())

"""Disk write errors (RLIMIT_FSIZE: the kernel refuses to grow a file, EFBIG) on the paths
where a failed write could lose or repeat messages: a refill from the disk queue whose leftovers could
not be written back, a deferred message a topic hands to a channel whose journal write
fails, a publish one channel takes and the next refuses, and an oversize cross-shard batch
split into several ring records.

The queue-level test runs in a child process (the limit applies to the whole process) and
ends it with ``os._exit`` after a sync, as a kill -9 would leave it; the others run real
nodes and set the limit on a shard with ``prlimit``."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.shard.queue import segment_queue
from pynsqd.shm.diskqueue import DiskQueue
from pynsqd.shm.segment import list_segments, unlink_segment
from pynsqd.wire.commands import encode_dpub, encode_fin, encode_mpub, encode_pub, encode_rdy
from pynsqd.wire.frames import FRAME_RESPONSE
from pynsqd.wire.message import HEADER
from testbed.harness import Daemon, scaled, wait_for
from tests.support.queues import recover
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.slow


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
    recover(again)
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


# Three files of records; the metadata cannot be written any more (RLIMIT_FSIZE of 1 byte,
# as a full disk refuses it); a read past the first file commits, and the sync that follows
# removes that file although it could not persist the new position; then kill -9.
_REMOVED_CHILD = r"""
import os, resource, sys
from pynsqd.shm.diskqueue import DiskQueue

dq = DiskQueue("q", sys.argv[1], max_bytes_per_file=64, min_msg_size=0, max_msg_size=1 << 16,
               sync_every=2500, sync_timeout_ns=2_000_000_000)
dq.put_many([b"r%02d" % i for i in range(20)])
dq.sync()
resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
dq.peek_many(12)
dq.commit()     # the read left file 0: a sync, which fails to write the metadata
print("committed %d %d" % dq.committed_position, file=sys.stderr)
os._exit(0)
"""


def test_a_file_read_past_is_removed_although_the_metadata_cannot_be_written(tmp_path: Path) -> None:
    err = _child(_REMOVED_CHILD, str(tmp_path))
    assert "failed to sync" in err
    assert not (tmp_path / "q.diskqueue.000000.dat").exists()  # its space is back
    committed = tuple(int(n) for n in err.split("committed ")[1].split()[:2])
    again = DiskQueue("q", str(tmp_path), max_bytes_per_file=64, min_msg_size=0, max_msg_size=1 << 16,
                      sync_every=2500, sync_timeout_ns=2_000_000_000)
    assert again.skip_to(committed) > 0  # the owner kept the position (shared memory)
    assert again.depth == 8
    assert again.read_many(20) == [b"r%02d" % i for i in range(12, 20)]
    assert again.depth == 0
    again.close()


def _get_json(nsqd: Daemon, path: str, method: str = "GET") -> Any:
    req = urllib.request.Request(nsqd.http_url + path, method=method)
    with urllib.request.urlopen(req, timeout=scaled(10)) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def _shard_pid(nsqd: Daemon, shard: int = 0) -> int:
    return int(_get_json(nsqd, "/stats?format=json&include_shards=true")["supervisor"]["shard_status"][shard]["pid"])


def _prlimit(pid: int, fsize: str) -> None:
    subprocess.run(["prlimit", f"--pid={pid}", f"--fsize={fsize}:unlimited"], check=True)


def _channel(nsqd: Daemon, topic: str, channel: str) -> Any:
    stats = _get_json(nsqd, f"/stats?format=json&topic={topic}")
    return next(c for t in stats["topics"] for c in t["channels"] if c["channel_name"] == channel)


def test_a_journal_write_error_in_the_topic_pump_keeps_the_messages_and_retries(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """The channel's log is full (its deferred messages overflow into the journal); the
    paused topic holds 20 DPUBs; the shard's disk refuses writes, the topic is unpaused:
    handing a message to the channel fails at the journal. The messages stay at the topic,
    the failure is one log line, and once the disk takes writes again every message reaches
    the channel exactly once."""
    nsqd = nsqd_factory("--mem-queue-bytes=65536", "--max-msg-size=16384", "--shards=1", data_path=tmp_path)
    with RawClient(nsqd.tcp) as c:
        c.subscribe("jt", "ch", rdy=0)
        for i in range(100):  # they fill the channel's log, then its journal
            c.send(encode_dpub("jt", 1000, b"fill-%03d-" % i + b"x" * 1000))
            c.expect_ok()
        assert (tmp_path / "jt:ch.diskqueue.deferred.jnl").exists()
        _get_json(nsqd, "/topic/pause?topic=jt", "POST")
        for i in range(20):
            c.send(encode_dpub("jt", 100, b"late-%02d-" % i + b"y" * 1000))
            c.expect_ok()
        pid = _shard_pid(nsqd)
        _prlimit(pid, "1")
        try:
            _get_json(nsqd, "/topic/unpause?topic=jt", "POST")
            wait_for(lambda: "could not hand" in nsqd.output, scaled(10), what="the failed hand-on logged")
            assert _get_json(nsqd, "/stats?format=json&topic=jt")["topics"][0]["depth"] == 20  # all still there
        finally:
            _prlimit(pid, "unlimited")
        c.send(encode_rdy(200))
        got = []
        for _ in range(120):
            m = c.read_message(timeout=scaled(15))
            got.append(m.body[:8])
            c.send(encode_fin(m.id))
        assert sorted(got) == sorted([b"fill-%03d" % i for i in range(100)] + [b"late-%02d-" % i for i in range(20)])
        # no copy left over: a message handed on twice would be delivered again (RDY 200)
        wait_for(lambda: _drained(nsqd), scaled(10), what="the channel empty")
    out = nsqd.output
    assert "Traceback" not in out and "Exception in callback" not in out, out[-3000:]
    assert out.count("could not hand") == 1, out[-3000:]
    assert "channels take messages again" in out


def _drained(nsqd: Daemon) -> bool:
    ch = _channel(nsqd, "jt", "ch")
    return (ch["depth"], ch["in_flight_count"], ch["deferred_count"], ch["message_count"]) == (0, 0, 0, 120)


def test_a_publish_one_channel_cannot_store_is_queued_at_the_topic_and_never_repeated(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Two channels; ``b`` has a backlog on disk and the disk refuses writes: a publish goes
    into ``a`` and fails at ``b``. It is kept at the topic (the publish is OK) and handed to
    ``b`` once the disk takes writes again, never to ``a`` a second time."""
    nsqd = nsqd_factory("--mem-queue-size=50", "--shards=1", data_path=tmp_path)
    with RawClient(nsqd.tcp) as p, RawClient(nsqd.tcp) as a:
        a.subscribe("ft", "a", rdy=500)
        _get_json(nsqd, "/channel/create?topic=ft&channel=b", "POST")
        p.send(encode_mpub("ft", [b"pre-%02d" % i for i in range(60)]))  # b: 50 in memory, 10 on disk
        p.expect_ok()
        for _ in range(60):
            a.send(encode_fin(a.read_message(timeout=scaled(10)).id))
        pid = _shard_pid(nsqd)
        _prlimit(pid, "1")
        try:
            p.send(encode_mpub("ft", [b"mid-%02d" % i for i in range(20)]))
            p.expect_ok()
            wait_for(lambda: "could not hand" in nsqd.output, scaled(5), what="the failed hand-on logged")
            got = sorted(a.read_message(timeout=scaled(10)).body for _ in range(20))
            assert got == [b"mid-%02d" % i for i in range(20)]
        finally:
            _prlimit(pid, "unlimited")
        wait_for(lambda: "channels take messages again" in nsqd.output, scaled(10), what="the retry")
        assert _channel(nsqd, "ft", "b")["depth"] == 80
        assert _channel(nsqd, "ft", "a")["message_count"] == 80  # the 20 went to a once
    assert nsqd.output.count("could not hand") == 1


def _owners(data: Path) -> dict[str, int]:
    table = {}
    for line in (data / "pynsqd.placement").read_text().splitlines():
        shard, _, topic = line.partition(" ")
        table[topic] = int(shard)
    return table


def test_a_split_cross_shard_batch_is_resumed_by_its_retry_never_stored_twice(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Rings of 64 KiB (the file-size limit shrinks them): an MPUB of ~110 KB for a topic of
    the other shard is split into four ring records; two fit, the ring is full, the
    connection retries. The retry stores only the rest: every message once, and the MPUB
    gets its OK."""
    nsqd = nsqd_factory("--shards=2", "--mem-queue-bytes=16384", "--max-msg-size=4096",
                        "--max-bytes-per-file=32768", data_path=tmp_path,
                        limits={resource.RLIMIT_FSIZE: (65536, 65536)})
    with RawClient(nsqd.tcp) as p:
        p.send(encode_pub("split_home", b"x"))
        p.expect_ok()
        home = _owners(tmp_path)["split_home"]
        away = ""
        for i in range(50):
            _get_json(nsqd, f"/topic/create?topic=split_away{i}", "POST")
            if _owners(tmp_path)[f"split_away{i}"] != home:
                away = f"split_away{i}"
                break
        with RawClient(nsqd.tcp) as c:
            c.subscribe(away, "ch", rdy=300)
            bodies = [b"%03d-" % i + b"z" * 500 for i in range(200)]
            p.send(encode_mpub(away, bodies))
            assert p.read_frame(timeout=scaled(10)) == (FRAME_RESPONSE, b"OK")
            got = []
            for _ in range(200):
                m = c.read_message(timeout=scaled(10))
                got.append(m.body)
                c.send(encode_fin(m.id))
            assert sorted(got) == bodies
            topic = _get_json(nsqd, f"/stats?format=json&topic={away}")["topics"][0]
            assert topic["message_count"] == 200 and topic["channels"][0]["message_count"] == 200
            assert topic["message_bytes"] == sum(map(len, bodies))
    assert "Traceback" not in nsqd.output

"""A disk that fails under a running node: syncs that raise, a file system that fills up,
fsyncs that must not stall the loop. Real processes on a real tmpfs (mounted for the test,
so it needs root) filled by a real file, and strace on the real shard."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.wire.commands import encode_dpub, encode_fin, encode_mpub, encode_pub
from pynsqd.wire.frames import FRAME_RESPONSE
from testbed.harness import Daemon, scaled, wait_for
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``small_disk("4m")`` → a directory on a tmpfs of that size, unmounted afterwards.
    Request it before ``nsqd_factory`` so the nodes stop before it is unmounted."""
    mounted: list[Path] = []

    def make(size: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root")
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk`` with one file (a real ENOSPC for whoever writes next)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (b"\0" * (1 << 20), b"\0" * 4096, b"\0"):
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


def get_json(nsqd: Daemon, path: str) -> Any:
    with urllib.request.urlopen(nsqd.http_url + path, timeout=scaled(10)) as resp:
        return json.loads(resp.read())


def supervisor_stats(nsqd: Daemon) -> dict[str, Any]:
    return dict(get_json(nsqd, "/stats?format=json&include_shards=true")["supervisor"])


def test_a_sync_that_fails_on_a_full_disk_is_retried_and_the_scan_goes_on(
        small_disk: Callable[[str], Path], nsqd_factory: Callable[..., Daemon]) -> None:
    disk = small_disk("2m")
    nsqd = nsqd_factory("--shards=1", "--mem-queue-size=0", "--sync-timeout=50ms", data_path=disk)
    consumer = RawClient(nsqd.tcp)
    consumer.subscribe("spilled", "c", rdy=0)
    with RawClient(nsqd.tcp) as p:
        p.send(encode_mpub("spilled", [b"m%d" % i for i in range(5)]))
        p.expect_ok()
    meta = disk / "spilled:c.diskqueue.meta.dat"
    wait_for(lambda: meta.exists() and meta.read_bytes().startswith(b"5\n"), 10, what="the first sync")
    filler = fill(disk)
    consumer.send(b"RDY 1\n")  # a read from disk: the next sync must write the metadata, and cannot
    first = consumer.read_message()
    consumer.send(b"RDY 0\n" + encode_fin(first.id))
    nsqd.wait_for_log(r"DISKQUEUE\(spilled:c\) failed to sync - .*No space left on device", 10)
    # the scan still runs: a deferred message comes when due, and nothing restarts the shard
    with RawClient(nsqd.tcp) as d:
        d.subscribe("later", "c", rdy=1)
        d.send(encode_dpub("later", 200, b"due"))
        frame_type, data = d.read_frame()
        assert (frame_type, data) == (FRAME_RESPONSE, b"OK")
        assert d.read_message(timeout=10).body == b"due"
    filler.unlink()
    nsqd.wait_for_log(r"DISKQUEUE\(spilled:c\) synced again after \d+ failed attempt", 20)
    assert meta.read_bytes().startswith(b"4\n")
    assert len(re.findall(r"DISKQUEUE\(spilled:c\) failed to sync", nsqd.output)) == 1  # once per spell
    assert supervisor_stats(nsqd)["shard_restarts"] == 0
    consumer.close()


def _publish_until_full(nsqd: Daemon, topic: str, body: bytes) -> int:
    """PUB ``body`` until the node answers E_PUB_FAILED; how many were stored."""
    stored = 0
    p = RawClient(nsqd.tcp)
    try:
        while True:
            p.send(encode_pub(topic, body))
            frame_type, data = p.read_frame()
            if frame_type != FRAME_RESPONSE:
                assert data.startswith(b"E_PUB_FAILED"), data
                return stored
            stored += 1
    finally:
        p.close()


def test_space_freed_by_consumption_takes_new_messages_at_once(
        small_disk: Callable[[str], Path], nsqd_factory: Callable[..., Daemon]) -> None:
    disk = small_disk("8m")
    nsqd = nsqd_factory("--shards=1", "--mem-queue-size=100", "--max-bytes-per-file=262144", data_path=disk)
    c = RawClient(nsqd.tcp)
    c.subscribe("full", "c", rdy=0)
    body = b"x" * 1000
    first = _publish_until_full(nsqd, "full", body)
    assert first > 4000
    consumed = first // 2
    c.send(b"RDY 100\n")
    for _ in range(consumed):
        c.send(encode_fin(c.read_message().id))
    c.send(b"RDY 0\n")
    # every file read past is gone once its records are in the log, although the metadata
    # cannot be written on the full disk (before: only the log's room, ~100, came in)
    again = _publish_until_full(nsqd, "full", body)
    assert again > consumed * 3 // 4, (first, consumed, again)
    c.close()


def test_fsync_runs_off_the_shards_event_loop(nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    nsqd = nsqd_factory("--shards=1", "--mem-queue-size=0", "--sync-every=1")
    shard = int(supervisor_stats(nsqd)["shard_status"][0]["pid"])
    trace = tmp_path / "fsync.trace"
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", str(trace),
                               "-p", str(shard)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with RawClient(nsqd.tcp) as p:
            def synced() -> bool:  # every PUB is a sync (--sync-every=1): publish until one is traced
                if tracer.poll() is not None:
                    pytest.skip("strace cannot attach to a process here (ptrace not permitted)")
                p.send(encode_pub("disk", b"x"))
                p.expect_ok()
                return trace.exists() and "fsync(" in trace.read_text()
            wait_for(synced, 20, interval=0.05, what="an fsync of the shard in the trace")
    finally:
        tracer.send_signal(signal.SIGINT)  # strace detaches and exits
        tracer.wait(scaled(10))
    calls = [line.split(None, 1) for line in trace.read_text().splitlines() if "fsync(" in line]
    assert calls
    on_loop = [call for tid, call in calls if int(tid) == shard]  # the main thread's id is the pid
    assert not on_loop, f"fsync on the shard's loop thread: {on_loop[:3]}"

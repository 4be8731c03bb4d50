"""Disk spill, clean shutdown and restart against the real server process."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from pynsqd.shm.segment import Segment, segment_name, unlink_segment
from pynsqd.shm.store import NAME_PAGE
from pynsqd.wire.commands import encode_dpub, encode_fin, encode_mpub, encode_pub, encode_req
from testbed.harness import Daemon, scaled, wait_for, without_file_permission_overrides
from tests.support.rawclient import RawClient
from tests.test_protocol import channel_stats, topic_stats

pytestmark = pytest.mark.slow


def test_backlog_beyond_mem_queue_size_spills_to_disk(nsqd_factory: Callable[..., Daemon],
                                                      tmp_path: Path) -> None:
    nsqd = nsqd_factory("--mem-queue-size=100", "--max-bytes-per-file=65536", data_path=tmp_path)
    with RawClient(nsqd.tcp) as p:
        p.send(encode_mpub("spill", [b"%05d" % i for i in range(2000)]))
        p.expect_ok()
    topic = topic_stats(nsqd, "spill")
    assert topic is not None and (topic["depth"], topic["backend_depth"]) == (2000, 1900)
    assert list(tmp_path.glob("spill.diskqueue.*.dat"))
    with RawClient(nsqd.tcp) as c:
        c.subscribe("spill", "ch", rdy=500)
        got = []
        for _ in range(2000):
            msg = c.read_message()
            got.append(msg.body)
            c.send(encode_fin(msg.id))
    assert sorted(got) == [b"%05d" % i for i in range(2000)]


def test_mem_queue_size_0_sends_everything_to_disk(nsqd_factory: Callable[..., Daemon]) -> None:
    nsqd = nsqd_factory("--mem-queue-size=0")
    with RawClient(nsqd.tcp) as c:
        c.subscribe("disk", "ch")
        with RawClient(nsqd.tcp) as p:
            p.send(encode_mpub("disk", [b"a", b"b", b"c"]))
            p.expect_ok()
        assert channel_stats(nsqd, "disk", "ch")["backend_depth"] == 3
        c.send(b"RDY 3\n")
        assert sorted(m.body for m in c.read_messages(3)) == [b"a", b"b", b"c"]


def test_clean_shutdown_keeps_queued_in_flight_and_deferred_with_due_time(nsqd_factory: Callable[..., Daemon],
                                                            tmp_path: Path) -> None:
    args = ("--mem-queue-size=50",)
    nsqd = nsqd_factory(*args, data_path=tmp_path)
    bodies = [b"m%03d" % i for i in range(300)]
    with RawClient(nsqd.tcp) as p:
        p.send(encode_mpub("keep", bodies))
        p.expect_ok()
    finished: set[bytes] = set()
    c = RawClient(nsqd.tcp)
    c.subscribe("keep", "ch", rdy=30)
    msgs = c.read_messages(30)
    c.send(b"RDY 0\n")
    for m in msgs[:10]:          # finished: must not come back
        c.send(encode_fin(m.id))
        finished.add(m.body)
    for m in msgs[10:15]:        # deferred for an hour: must come back (as queued)
        c.send(encode_req(m.id, 3_600_000))
    # msgs[15:30] stay in flight
    c.send(encode_pub("elsewhere#ephemeral", b"sync point"))
    c.expect_ok()
    stats = channel_stats(nsqd, "keep", "ch")
    assert (stats["in_flight_count"], stats["deferred_count"]) == (15, 5)
    assert nsqd.stop() == 0  # SIGTERM while the consumer is still connected
    c.close()
    assert "exited cleanly" in nsqd.output
    meta = json.loads((tmp_path / "nsqd.dat").read_bytes())
    assert meta == {"topics": [{"name": "keep", "paused": False,
                                "channels": [{"name": "ch", "paused": False}]}], "version": "1.3.0"}

    again = nsqd_factory(*args, data_path=tmp_path)
    stats = channel_stats(again, "keep", "ch")
    assert (stats["depth"], stats["deferred_count"], stats["in_flight_count"]) == (285, 5, 0)
    with RawClient(again.tcp) as c2:
        c2.subscribe("keep", "ch", rdy=100)
        got = {}
        for _ in range(285):
            m = c2.read_message()
            got[m.body] = m.attempts
            c2.send(encode_fin(m.id))
        c2.expect_nothing(0.3)
    assert set(got) == set(bodies) - finished - {m.body for m in msgs[10:15]}
    assert all(got[m.body] == 2 for m in msgs[15:30])  # delivered once before: attempts kept
    assert channel_stats(again, "keep", "ch")["deferred_count"] == 5  # due in an hour still


def test_paused_state_survives_restart(nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    (tmp_path / "nsqd.dat").write_text(json.dumps({"topics": [
        {"name": "p", "paused": True, "channels": [{"name": "c", "paused": True}, {"name": "bad name"}]},
    ], "version": "1.3.0"}))
    nsqd = nsqd_factory(data_path=tmp_path)
    topic = topic_stats(nsqd, "p")
    assert topic is not None and topic["paused"] and [c["channel_name"] for c in topic["channels"]] == ["c"]
    assert topic["channels"][0]["paused"]


def test_second_node_on_the_same_data_path_refuses(nsqd_factory: Callable[..., Daemon],
                                                   tmp_path: Path) -> None:
    nsqd_factory(data_path=tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pynsqd.supervisor", "--tcp-address=127.0.0.1:0",
                           "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"nsqd: error: --data-path={tmp_path} in use "
                                   "(possibly by another instance of nsqd)")


def test_corrupt_metadata_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "nsqd.dat").write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "pynsqd.supervisor", "--tcp-address=127.0.0.1:0",
                           "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "failed to load metadata" in proc.stderr


def test_topics_channels_and_pauses_set_over_http_survive_restart(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    nsqd = nsqd_factory(data_path=tmp_path)
    http = httpx.Client(base_url=nsqd.http_url, timeout=10)
    for call in ("/topic/create?topic=a", "/topic/create?topic=b", "/channel/create?topic=a&channel=x",
                 "/channel/create?topic=a&channel=y", "/topic/pause?topic=b",
                 "/channel/pause?topic=a&channel=y", "/topic/create?topic=gone%23ephemeral"):
        assert http.post(call).status_code == 200, call
    http.close()
    assert nsqd.stop() == 0
    again = nsqd_factory(data_path=tmp_path)
    with httpx.Client(base_url=again.http_url, timeout=10) as http2:
        topics = http2.get("/stats", params={"format": "json"}).json()["topics"]
    shape = [(t["topic_name"], t["paused"], [(c["channel_name"], c["paused"]) for c in t["channels"]])
             for t in topics]
    assert shape == [("a", False, [("x", False), ("y", True)]), ("b", True, [])]


def test_many_creates_pauses_and_deletes_reach_nsqd_dat_and_survive_kill_9(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Topics and channels made, paused and deleted over HTTP on both shards (one connection:
    half of the calls are proxied to the owner) reach ``nsqd.dat`` as each shard reports
    only what changed; a kill -9 of the whole tree then loses none of it."""
    nsqd = nsqd_factory("--shards=2", data_path=tmp_path)
    expected: dict[str, tuple[bool, dict[str, bool]]] = {}
    with httpx.Client(base_url=nsqd.http_url, timeout=scaled(10)) as http:
        def call(path: str, body: bytes = b"") -> None:
            assert http.post(path, content=body).status_code == 200, path
        for i in range(80):
            t = f"t{i:03d}"
            call(f"/mpub?topic={t}", b"a\nb") if i % 2 else call(f"/topic/create?topic={t}")
            call(f"/channel/create?topic={t}&channel=a")
            call(f"/channel/create?topic={t}&channel=b")
            call(f"/channel/create?topic={t}&channel=e%23ephemeral")
            expected[t] = (False, {"a": False, "b": False})
            if i % 7 == 0:
                call(f"/topic/pause?topic={t}")
                expected[t] = (True, expected[t][1])
            if i % 5 == 0:
                call(f"/channel/pause?topic={t}&channel=b")
                expected[t][1]["b"] = True
            if i % 3 == 0:
                call(f"/channel/delete?topic={t}&channel=a")
                del expected[t][1]["a"]
            if i % 11 == 0:
                call(f"/topic/delete?topic={t}")
                del expected[t]
            call(f"/topic/create?topic=eph{i}%23ephemeral")
        for t in ("t003", "t010"):
            call(f"/topic/unpause?topic={t}")
            expected[t] = (False, expected[t][1])

    def on_disk() -> dict[str, tuple[bool, dict[str, bool]]]:
        data = json.loads((tmp_path / "nsqd.dat").read_text())
        return {t["name"]: (t["paused"], {c["name"]: c["paused"] for c in t["channels"]}) for t in data["topics"]}
    wait_for(lambda: on_disk() == expected, 10, interval=0.05, what="nsqd.dat to hold every change")
    nsqd.kill()
    again = nsqd_factory("--shards=2", data_path=tmp_path)
    with httpx.Client(base_url=again.http_url, timeout=scaled(10)) as http:
        topics = http.get("/stats", params={"format": "json"}).json()["topics"]
    assert {t["topic_name"]: (t["paused"], {c["channel_name"]: c["paused"] for c in t["channels"]})
            for t in topics} == expected


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--msg-timeout=forever"], "invalid value 'forever' for flag --msg-timeout"),
    (["--node-id=2000"], "--node-id must be [0,1024) (got 2000)"),
    (["--tcp-address=nonsense"], "invalid value 'nonsense' for flag --tcp-address"),
    (["--tls-cert=c.pem", "--tls-key=k.pem"], "failed to load TLS certificate/key"),
    (["--enable-experiment=topology-aware-consumption"], "not supported by this build of pynsqd yet"),
])
def test_bad_flags_are_one_line_errors_with_exit_1(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pynsqd.supervisor", f"--data-path={tmp_path}", *args],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("nsqd: error: ")
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def _failed_start(args: list[str], cwd: Path, wrapper: list[str] | None = None) -> str:
    """Run nsqd expecting a failed start: exit status 1, one line, no traceback; its stderr."""
    proc = subprocess.run([*(wrapper or []), sys.executable, "-m", "pynsqd.supervisor",
                           "--http-address=127.0.0.1:0", *args],
                          capture_output=True, text=True, timeout=30, cwd=cwd)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("nsqd: error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc.stderr


def test_a_failed_start_says_one_line_and_leaves_nothing_behind(tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    # no --data-path: the working directory; a bad address fails before anything is written
    assert "invalid value 'nohost' for flag --tcp-address" in _failed_start(["--tcp-address=nohost"], cwd)
    assert list(cwd.iterdir()) == []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        fresh = tmp_path / "new" / "data"
        err = _failed_start([f"--data-path={fresh}", f"--tcp-address=127.0.0.1:{taken.getsockname()[1]}"], cwd)
        assert "Address already in use" in err
    assert not (tmp_path / "new").exists()  # not created: the port is checked first
    afile = tmp_path / "afile"
    afile.write_text("x")
    for path in (afile, afile / "below"):
        err = _failed_start([f"--data-path={path}", "--tcp-address=127.0.0.1:0"], cwd)
        assert err == f"nsqd: error: failed to open --data-path={path}: not a directory\n"
    assert list(cwd.iterdir()) == []


def test_a_read_only_data_path_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    data = tmp_path / "ro"
    data.mkdir()
    data.chmod(0o555)
    wrapper = without_file_permission_overrides()  # root writes anywhere
    err = _failed_start([f"--data-path={data}", "--tcp-address=127.0.0.1:0"], tmp_path, wrapper)
    assert err == f"nsqd: error: --data-path={data} is not writable - Permission denied\n"
    assert list(data.iterdir()) == []


def test_a_data_path_that_refuses_new_files_is_named_with_the_file_it_refused(tmp_path: Path) -> None:
    """/proc exists but makes no files (open with O_CREAT says ENOENT): the error says so,
    not that the data path is missing."""
    err = _failed_start(["--data-path=/proc", "--tcp-address=127.0.0.1:0"], tmp_path)
    assert err == ("nsqd: error: --data-path=/proc: cannot create files in it - "
                   "open /proc/.pynsqd-start.tmp: No such file or directory\n")


def test_full_disk_fails_the_publish_damages_nothing_and_a_stored_dpub_clears_health(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    # every file of the node may grow to 64 KiB; Python ignores SIGXFSZ, so writes get EFBIG
    # (shared-memory segments count too: small messages keep them at ~20 KiB)
    nsqd = nsqd_factory("--mem-queue-size=0", "--max-msg-size=4096", "--mem-queue-bytes=16384",
                        data_path=tmp_path,
                        limits={resource.RLIMIT_FSIZE: (65536, 65536)})
    stored: list[bytes] = []
    with RawClient(nsqd.tcp) as p:
        for i in range(200):
            body = b"%04d" % i + b"x" * 996
            p.send(encode_pub("full", body))
            frame_type, data = p.read_frame()
            if frame_type == 1:
                assert data.startswith(b"E_PUB_FAILED PUB failed ")
                break
            stored.append(body)
        else:
            raise AssertionError("the disk never filled")
        p.expect_closed()
    assert 50 <= len(stored) < 66
    ping = httpx.get(f"{nsqd.http_url}/ping", timeout=10)
    assert ping.status_code == 500 and ping.text.startswith("NOK - ")
    with RawClient(nsqd.tcp) as p:  # a DPUB stored in the log writes no file: health is OK again
        p.send(encode_dpub("full", 60_000, b"later"))
        p.expect_ok()
    ping = httpx.get(f"{nsqd.http_url}/ping", timeout=10)
    assert ping.status_code == 200 and ping.text == "OK"
    with RawClient(nsqd.tcp) as c:
        c.subscribe("full", "ch", rdy=100)
        got = []
        for _ in stored:  # FIN as we go: in-flight messages live in the 16 KiB log
            m = c.read_message()
            got.append(m.body)
            c.send(encode_fin(m.id))
        c.expect_nothing(0.3)
    assert got == stored
    assert not list(tmp_path.glob("*.bad"))


def test_corrupt_deferred_sidecar_is_set_aside_and_the_node_starts(nsqd_factory: Callable[..., Daemon],
                                                                    tmp_path: Path) -> None:
    nsqd = nsqd_factory(data_path=tmp_path)
    with httpx.Client(base_url=nsqd.http_url, timeout=10) as http:
        for topic in ("good", "bad"):
            assert http.post(f"/topic/create?topic={topic}").status_code == 200
            assert http.post(f"/channel/create?topic={topic}&channel=ch").status_code == 200
            assert http.post(f"/pub?topic={topic}", content=b"ready").status_code == 200
            assert http.post(f"/pub?topic={topic}&defer=3600000", content=b"later").status_code == 200
    assert nsqd.stop() == 0 and "exited cleanly" in nsqd.output
    sidecar = tmp_path / "bad:ch.diskqueue.deferred.dat"
    assert sidecar.exists() and (tmp_path / "good:ch.diskqueue.deferred.dat").exists()
    sidecar.write_bytes(sidecar.read_bytes()[:-7])  # torn
    again = nsqd_factory(data_path=tmp_path)
    again.wait_for_log(r"deferred messages file .*bad:ch\.diskqueue\.deferred\.dat is corrupt")
    assert not sidecar.exists() and (tmp_path / "bad:ch.diskqueue.deferred.dat.bad").exists()
    good, bad = channel_stats(again, "good", "ch"), channel_stats(again, "bad", "ch")
    assert (good["depth"], good["deferred_count"]) == (1, 1)
    assert (bad["depth"], bad["deferred_count"]) == (1, 0)
    for topic in ("good", "bad"):
        with RawClient(again.tcp) as c:
            c.subscribe(topic, "ch", rdy=10)
            m = c.read_message()
            assert m.body == b"ready"
            c.send(encode_fin(m.id))
            c.expect_nothing(0.3)


def test_the_scan_syncs_a_disk_queue_after_sync_timeout_with_no_further_writes(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Only ``--sync-timeout`` can sync here (``--sync-every`` is never reached, no file is
    rolled or read past): the metadata follows the writes, then a read, then a write, each
    made after a scan found the queue synced, with nothing after it."""
    nsqd = nsqd_factory("--shards=1", "--mem-queue-size=0", "--sync-every=1000000", "--sync-timeout=50ms",
                        data_path=tmp_path)
    meta = tmp_path / "synced:c.diskqueue.meta.dat"

    def depth_on_disk() -> int | None:
        return int(meta.read_text().split("\n")[0]) if meta.exists() else None

    c, ticks, p = RawClient(nsqd.tcp), RawClient(nsqd.tcp), RawClient(nsqd.tcp)
    try:
        ticks.subscribe("tick", "c", rdy=1)

        def after_a_scan() -> None:
            """A deferred message is released by the scan: once it arrives, a scan has
            run since now."""
            p.send(encode_dpub("tick", 1, b"tick"))
            p.expect_ok()
            ticks.send(encode_fin(ticks.read_message(timeout=10).id))

        c.subscribe("synced", "c", rdy=0)
        after_a_scan()
        p.send(encode_mpub("synced", [b"m%d" % i for i in range(5)]))
        p.expect_ok()
        wait_for(lambda: depth_on_disk() == 5, 10, what="a sync of the writes")
        after_a_scan()
        c.send(b"RDY 1\n")
        c.send(b"RDY 0\n" + encode_fin(c.read_message().id))
        wait_for(lambda: depth_on_disk() == 4, 10, what="a sync of the read position")
        after_a_scan()
        p.send(encode_pub("synced", b"again"))
        p.expect_ok()
        wait_for(lambda: depth_on_disk() == 5, 10, what="a sync of a later write")
    finally:
        for client in (c, ticks, p):
            client.close()


def test_a_corrupt_shared_memory_log_stops_the_node_and_is_left_as_it_is(nsqd_factory: Callable[..., Daemon],
                                                                          tmp_path: Path) -> None:
    """A queue's log that fails its checks at restart is neither walked nor written over:
    the node refuses to start, names the segment, and the segment keeps every byte."""
    nsqd = nsqd_factory("--shards=1", data_path=tmp_path)
    with RawClient(nsqd.tcp) as p:
        for i in range(3):
            p.send(encode_pub("kept", b"m%d" % i))
            p.expect_ok()
    dat = tmp_path / "nsqd.dat"
    wait_for(lambda: dat.exists() and b'"kept"' in dat.read_bytes(), 10, what="kept in nsqd.dat")
    nsqd.kill()
    name = segment_name(str(tmp_path), "topic", "kept")
    segment = Segment.open(name, 0, create=False)
    try:
        segment.buf[NAME_PAGE:NAME_PAGE + 8] = bytes(8)  # the log's magic
        left = bytes(segment.buf)
    finally:
        segment.close()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "pynsqd.supervisor", "--shards=1", f"--data-path={tmp_path}",
                                 "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=scaled(30))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        assert proc.returncode == 1, err
        assert f"topic kept: its shared-memory log is unusable (not a ring (bad magic)); it is left as it is: " \
               f"remove /dev/shm{name} to start the queue empty" in err
        assert "Traceback" not in out + err
        segment = Segment.open(name, 0, create=False)
        try:
            assert bytes(segment.buf) == left
        finally:
            segment.close()
    finally:
        unlink_segment(name)

"""Zero loss on a crash, against the real server: kill -9 (and SIGTERM, and SIGTERM followed
by a simulated reboot that clears /dev/shm) with messages queued in shared memory and on
disk, in flight, deferred, and waiting at a topic with no channel; then restart on the same
data path and consume the rest."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pynsqd.node.shmowner import RECORD
from pynsqd.shm.segment import list_segments, node_prefix, unlink_segment
from pynsqd.wire.commands import encode_dpub, encode_fin, encode_mpub, encode_pub, encode_req
from testbed.harness import Daemon, scaled, wait_for
from tests.support.rawclient import RawClient
from tests.test_protocol import channel_stats, topic_stats

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEFER_MS = 15000  # outlasts a SIGTERM (up to 5 s waiting for FINs) and a restart of the whole tree


def pynsq_publish(nsqd: Daemon, topic: str, count: int, prefix: str) -> None:
    """Publish ``count`` bodies ``<prefix><i>`` with pynsq (MPUB of 100) in its own process."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "support" / "clients" / "pynsq_app.py"), "pub", "--nsqd",
         "{}:{}".format(*nsqd.tcp), "--topic", topic, "--count", str(count), "--mpub", "100", "--prefix", prefix],
        capture_output=True, timeout=scaled(60), text=True)
    assert out.stdout.strip() == f"published {count}", out.stderr


def sync(c: RawClient) -> None:
    """Every command sent on ``c`` before this has been processed (PUB answers in order)."""
    c.send(encode_pub("sync#ephemeral", b"."))
    c.expect_ok()


class Scenario:
    """Publishes and consumes part; knows what must come back."""

    def __init__(self, nsqd: Daemon) -> None:
        self.nsqd = nsqd
        self.acked: set[bytes] = set()
        self.finished: set[bytes] = set()
        self.deferred: dict[bytes, float] = {}  # body → wall time before which it must not come
        self.in_flight: set[bytes] = set()
        self.orphans: set[bytes] = set()
        self.unanswered: set[bytes] = set()  # a PUB sent whose answer never came (stored or not)

    def run(self, crash: Callable[[], None]) -> None:
        nsqd = self.nsqd
        c = RawClient(nsqd.tcp)
        c.subscribe("crash", "ch", rdy=0)
        pynsq_publish(nsqd, "crash", 3000, "p")  # 500 in shared memory, the rest spills to disk
        self.acked |= {b"p%d" % i for i in range(3000)}
        with RawClient(nsqd.tcp) as p:  # a topic with no channel: its own log and disk queue
            for i in range(300):
                p.send(encode_pub("lonely", b"o%d" % i))
                p.expect_ok()
            p.send(encode_dpub("lonely", DEFER_MS, b"o-deferred"))
            p.expect_ok()
        self.orphans = {b"o%d" % i for i in range(300)} | {b"o-deferred"}
        dpub_due = time.time() + DEFER_MS / 1000
        c.send(b"RDY 400\n")
        msgs = c.read_messages(400)
        c.send(b"RDY 0\n")
        for m in msgs[:150]:
            c.send(encode_fin(m.id))
            self.finished.add(m.body)
        req_at = time.time()
        for m in msgs[150:250]:
            c.send(encode_req(m.id, DEFER_MS))
            self.deferred[m.body] = req_at + DEFER_MS / 1000
        self.in_flight = {m.body for m in msgs[250:]}
        sync(c)
        stats = channel_stats(nsqd, "crash", "ch")
        assert (stats["in_flight_count"], stats["deferred_count"]) == (150, 100)
        assert stats["depth"] == 3000 - 400 and stats["backend_depth"] > 0
        # keep publishing while the process dies: every body that got OK must survive
        stop = threading.Event()

        def publish() -> None:
            with RawClient(nsqd.tcp) as p:
                i = 0
                while not stop.is_set():
                    body = b"late%d" % i
                    try:
                        p.send(encode_pub("crash", body))
                        p.expect_ok()
                    except (OSError, TimeoutError, AssertionError):
                        self.unanswered.add(body)
                        return
                    self.acked.add(body)
                    i += 1

        publisher = threading.Thread(target=publish)
        publisher.start()
        try:
            deadline = time.monotonic() + scaled(10)
            while len(self.acked) < 3050 and time.monotonic() < deadline:
                time.sleep(0.005)
            crash()
        finally:
            stop.set()
            publisher.join(scaled(10))
            c.close()
        self.orphans.add(b"o-deferred")
        self.dpub_due = dpub_due

    def consume_rest(self, again: Daemon, exactly_once: bool,
                     finished_never: bool = False) -> dict[bytes, tuple[int, float]]:
        """Read until every expected body has arrived; {body: (attempts, arrival wall time)}.
        ``exactly_once``: nothing comes twice; ``finished_never``: nothing FINed comes back."""
        expected = (self.acked - self.finished)
        got: dict[bytes, tuple[int, float]] = {}
        redelivered: list[bytes] = []
        with RawClient(again.tcp) as c:
            c.subscribe("crash", "ch", rdy=500)
            deadline = time.monotonic() + scaled(30) + DEFER_MS / 1000
            while not expected <= set(got) and time.monotonic() < deadline:
                m = c.read_message(timeout=scaled(10) + DEFER_MS / 1000)
                if m.body in got:
                    redelivered.append(m.body)
                got[m.body] = (m.attempts, time.time())
                c.send(encode_fin(m.id))
            if exactly_once or finished_never:
                # Whatever else arrives: a repeat, a FINed message (both checked below), or
                # the late PUB the server stored but whose OK the publisher never read.
                while True:
                    try:
                        m = c.read_message(timeout=0.3)
                    except TimeoutError:
                        break
                    if m.body in got:
                        redelivered.append(m.body)
                    got[m.body] = (m.attempts, time.time())
                    c.send(encode_fin(m.id))
        missing = expected - set(got)
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
        if exactly_once:
            assert not redelivered, f"{len(redelivered)} repeats, e.g. {sorted(redelivered)[:5]}"
        if exactly_once or finished_never:
            assert not (set(got) & self.finished)
            unknown = set(got) - expected - self.finished - self.unanswered
            assert not unknown, f"never published: {sorted(unknown)[:5]}"
        return got

    def check(self, got: dict[bytes, tuple[int, float]], again: Daemon) -> None:
        for body in self.in_flight:
            assert got[body][0] >= 2, body  # delivered before the crash: attempts kept
        for body, due in self.deferred.items():
            assert got[body][1] >= due - 0.05, (body, got[body][1] - due)  # due time kept
            assert got[body][0] >= 2
        with RawClient(again.tcp) as c:
            c.subscribe("lonely", "ch", rdy=500)
            arrived: dict[bytes, float] = {}
            while len(arrived) < len(self.orphans):  # the DPUB may fall due while we restart
                m = c.read_message(timeout=scaled(10) + DEFER_MS / 1000)
                arrived.setdefault(m.body, time.time())
                c.send(encode_fin(m.id))
            assert set(arrived) == self.orphans
            assert arrived[b"o-deferred"] >= self.dpub_due - 0.05  # due time kept


def queue_segments(path: Path) -> list[str]:
    """The node's topic and channel segments (not the supervisor's cross-shard rings, nor
    the record of whose they are)."""
    record = "/" + node_prefix(str(path)) + RECORD
    return [n for n in list_segments(str(path)) if "-inbound-" not in n and n != record]


@pytest.mark.parametrize("how,shards", [(how, shards) for how in ("kill-9", "sigterm")
                                         for shards in ("--shards=1", "--shards=2")]
                         + [("sigterm+reboot", "--shards=2")])  # one reboot case: the test budget
def test_restart_after_a_crash_loses_nothing_acknowledged(nsqd_factory: Callable[..., Daemon],
                                                          tmp_path: Path, how: str, shards: str) -> None:
    """kill -9 of the whole process tree (or SIGTERM, or SIGTERM then a reboot), one shard
    or several (the topics may live on a shard other than the one the connections were
    handed to). kill -9 recovers from shared memory; a clean stop moves every queue to disk
    (ready and in flight to the disk queue, deferred to the sidecar) and removes its segment."""
    args = ("--mem-queue-size=500", "--max-bytes-per-file=65536", shards)
    nsqd = nsqd_factory(*args, data_path=tmp_path)
    scenario = Scenario(nsqd)
    def clean_stop() -> None:  # the whole shutdown, not a SIGKILL after a timeout
        assert nsqd.stop(timeout=scaled(30)) == 0 and "exited cleanly" in nsqd.output

    scenario.run(nsqd.kill if how == "kill-9" else clean_stop)
    if how == "kill-9":
        assert queue_segments(tmp_path)  # the queues outlived the process
    else:
        # all on disk: a reboot cannot lose them (ephemeral queues keep their segments)
        assert not [n for n in queue_segments(tmp_path) if "#ephemeral" not in n]
        assert (tmp_path / "crash:ch.diskqueue.deferred.dat").exists()
        assert (tmp_path / "lonely.diskqueue.deferred.dat").exists()
    if how == "sigterm+reboot":
        for name in list_segments(str(tmp_path)):  # what a reboot does to /dev/shm
            unlink_segment(name)
    again = nsqd_factory(*args, data_path=tmp_path)
    stats = channel_stats(again, "crash", "ch")
    assert stats["in_flight_count"] == 0
    if time.time() < min(scenario.deferred.values()) - 0.5:  # a clean stop waits out FIN_WAIT
        assert stats["deferred_count"] == 100
    assert stats["depth"] >= len(scenario.acked) - 400  # ready + spilled, plus the 150 in flight
    lonely = topic_stats(again, "lonely")
    assert lonely is not None and lonely["depth"] >= 301
    assert not list(tmp_path.glob("*.deferred.dat"))  # loaded into the logs, then removed
    # a clean stop: nothing comes twice, nothing FINed comes back (one or two shards)
    got = scenario.consume_rest(again, exactly_once=how != "kill-9", finished_never=how != "kill-9")
    scenario.check(got, again)


def test_deleted_and_leftover_segments_are_removed(nsqd_factory: Callable[..., Daemon],
                                                   tmp_path: Path) -> None:
    nsqd = nsqd_factory(data_path=tmp_path)
    with RawClient(nsqd.tcp) as c:
        c.subscribe("gone", "ch", rdy=0)
    with RawClient(nsqd.tcp) as p:
        p.send(encode_pub("gone", b"x"))
        p.expect_ok()
        p.send(encode_pub("kept", b"y"))
        p.expect_ok()
    # "kept" may live on another shard, which creates it when it drains its inbound ring
    wait_for(lambda: len(queue_segments(tmp_path)) == 3, what="three queue segments")
    assert any(n.endswith("-topic-gone") for n in queue_segments(tmp_path))
    import httpx
    assert httpx.post(f"{nsqd.http_url}/topic/delete?topic=gone", timeout=10).status_code == 200
    assert [n.rsplit("-", 1)[-1] for n in queue_segments(tmp_path)] == ["kept"]
    nsqd.kill()
    # a queue that never reached nsqd.dat still comes back from shared memory
    (tmp_path / "nsqd.dat").unlink(missing_ok=True)
    again = nsqd_factory(data_path=tmp_path)
    kept = topic_stats(again, "kept")
    assert kept is not None and kept["depth"] == 1


def remove_tree_in_use(path: Path) -> None:
    """Remove the data path of a running node, which may write its metadata file (a
    temporary file renamed over it) while the tree is walked: again until it is gone."""
    def removed() -> bool:
        shutil.rmtree(path, ignore_errors=True)
        return not path.exists()
    wait_for(removed, what=f"{path} removed")


def test_shared_memory_of_a_killed_node_goes_once_its_data_path_is_removed(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """kill -9 keeps a node's segments for its restart; once its data path is removed they
    are garbage: ``nsqd-reclaim-shm`` removes them, and so does any node's start. Those of
    a killed node whose data path is still there, and of a running one, stay."""
    def killed_with_messages(name: str) -> tuple[Path, int]:
        nsqd = nsqd_factory("--shards=2", data_path=tmp_path / name)
        with RawClient(nsqd.tcp) as c:
            for topic in ("a", "b"):  # a topic on each shard
                c.send(encode_mpub(topic, [b"m%d" % i for i in range(5)]))
                c.expect_ok()
        # the owner of a topic published across shards creates it when it drains its ring
        wait_for(lambda: len(queue_segments(tmp_path / name)) == 2, what="both topics' segments")
        nsqd.kill()
        return tmp_path / name, len(list_segments(str(tmp_path / name))) - 1  # all but the record

    (gone, count), (kept, _) = killed_with_messages("gone"), killed_with_messages("kept")
    running = tmp_path / "running"
    nsqd_factory(data_path=running)
    shutil.rmtree(gone)
    remove_tree_in_use(running)
    # Any node starting on this host reclaims too (other tests in parallel): what is checked
    # is that the segments go, and that what the command names is garbage.
    reclaim_shm = str(Path(sys.executable).parent / "nsqd-reclaim-shm")
    listed = subprocess.run([reclaim_shm, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert (listed.returncode, listed.stderr) == (0, "")
    assert str(kept) not in listed.stdout and str(running) not in listed.stdout
    if list_segments(str(gone)):  # still there: listed, and left alone by the dry run
        assert f"would remove {count} segments" in listed.stdout and f"on {gone} (data path removed)" in listed.stdout
        assert len(list_segments(str(gone))) == count + 1
    done = subprocess.run([reclaim_shm], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "") and str(kept) not in done.stdout
    assert list_segments(str(gone)) == []
    # another killed node whose data path goes: the next start of any node removes its segments
    again, _ = killed_with_messages("again")
    shutil.rmtree(again)
    nsqd_factory(data_path=tmp_path / "other")
    assert list_segments(str(again)) == []
    assert len(list_segments(str(running))) >= 3  # the running node's rings and record
    restarted = nsqd_factory("--shards=2", data_path=kept)  # the kept node's restart finds its messages
    assert [(topic_stats(restarted, t) or {}).get("depth") for t in ("a", "b")] == [5, 5]


def test_ephemeral_queues_keep_mem_queue_size_drop_the_rest_and_never_touch_disk(
        nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    nsqd = nsqd_factory("--mem-queue-size=10", data_path=tmp_path)
    c = RawClient(nsqd.tcp)
    c.subscribe("e#ephemeral", "ch#ephemeral", rdy=0)
    with RawClient(nsqd.tcp) as p:
        p.send(encode_mpub("e#ephemeral", [b"%d" % i for i in range(50)]))
        p.expect_ok()
    stats = channel_stats(nsqd, "e#ephemeral", "ch#ephemeral")
    assert (stats["depth"], stats["backend_depth"]) == (10, 0)
    assert not [f for f in tmp_path.iterdir() if "ephemeral" in f.name]
    c.send(b"RDY 50\n")
    assert [m.body for m in c.read_messages(10)] == [b"%d" % i for i in range(10)]
    c.expect_nothing(0.3)
    assert len(queue_segments(tmp_path)) == 2
    c.close()  # the last consumer goes: channel and topic go, and their segments with them
    wait_for(lambda: not queue_segments(tmp_path), what="ephemeral segments unlinked")

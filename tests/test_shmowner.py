"""Whose shared memory a segment is (``node/shmowner.py``): real records and segments under
/dev/shm, each node a real process that records itself as a supervisor does, then runs
(its record locked) or is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pynsqd.node.shmowner import OwnerRecord, reclaim, why_gone
from pynsqd.shm.segment import SHM_DIR, Segment, list_segments, segment_name, unlink_segment
from testbed.harness import scaled, without_file_permission_overrides

pytestmark = pytest.mark.fast

# a node: lock the data path, record itself, make two segments (a MiB written in each), run
NODE = """
import sys
from pynsqd.node.datapath import lock_data_path
from pynsqd.node.shmowner import OwnerRecord
from pynsqd.shm.segment import Segment, segment_name
path = sys.argv[1]
record = OwnerRecord.claim(path, lock_data_path(path))
for kind, queue in (("topic", "t"), ("channel", "t:c")):
    seg = Segment.open(segment_name(path, kind, queue), 4 << 20, create=True)
    seg.buf[:1 << 20] = b"m" * (1 << 20)
    seg.close()
print(record.name, flush=True)
sys.stdin.read()
"""


class Node:
    """A node process on ``data_path``; ``kill`` is kill -9."""

    def __init__(self, data_path: str) -> None:
        self.data_path = data_path
        self.proc = subprocess.Popen([sys.executable, "-c", NODE, data_path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.record = self.proc.stdout.readline().decode().strip()
        assert self.record, "the node did not start"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(scaled(10))
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


NodeFactory = Callable[[str], Node]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeFactory]:
    """``node("a")``: a running node on ``tmp_path/a``; killed and its segments removed after."""
    nodes: list[Node] = []

    def make(name: str) -> Node:
        path = tmp_path / name
        path.mkdir(exist_ok=True)
        nodes.append(Node(str(path)))
        return nodes[-1]

    yield make
    for n in nodes:
        if n.proc.poll() is None:
            n.kill()
        for name in list_segments(n.data_path):
            unlink_segment(name)


def _reclaimed(path: str, dry_run: bool = False) -> str | None:
    """``reclaim`` (every node on the host is looked at): why it gave the node on ``path``
    up, or None. Any node starting on this host reclaims too (tests in parallel), so a node
    whose segments are gone may have been reclaimed by another process: callers check the
    segments themselves."""
    return next((g.reason for g in reclaim(dry_run=dry_run) if g.data_path == path), None)


def _replace(path: str) -> None:
    """Another directory at ``path`` (made before the old one goes: never the same inode)."""
    os.mkdir(path + ".new")
    os.rename(path, path + ".old")
    os.rename(path + ".new", path)
    os.rmdir(path + ".old")


def test_why_a_nodes_directory_is_gone(tmp_path: Path) -> None:
    here = os.stat(tmp_path)
    assert why_gone(str(tmp_path), here.st_dev, here.st_ino) is None
    assert why_gone(str(tmp_path / "missing"), here.st_dev, here.st_ino) == "data path removed"
    assert why_gone(str(tmp_path), here.st_dev, here.st_ino + 1) == "data path replaced"
    (tmp_path / "file").write_text("")
    assert why_gone(str(tmp_path / "file" / "x"), here.st_dev, here.st_ino) == "data path removed"
    file = os.stat(tmp_path / "file")
    assert why_gone(str(tmp_path / "file"), file.st_dev, file.st_ino) == "data path replaced"  # not a directory


def test_a_killed_nodes_segments_go_once_its_data_path_is_removed_or_replaced(node: NodeFactory) -> None:
    removed, replaced, kept = node("removed"), node("replaced"), node("kept")
    for n in (removed, replaced, kept):
        n.kill()
    os.rmdir(removed.data_path)
    _replace(replaced.data_path)
    for n, reason in ((removed, "data path removed"), (replaced, "data path replaced")):
        listed = _reclaimed(n.data_path, dry_run=True)
        left = list_segments(n.data_path)
        assert left == [] or (listed, len(left)) == (reason, 3)  # listed, and a dry run removes nothing
    _reclaimed(removed.data_path)
    assert list_segments(removed.data_path) == [] and list_segments(replaced.data_path) == []
    assert len(list_segments(kept.data_path)) == 3  # its restart recovers them
    assert _reclaimed(kept.data_path) is None


def test_a_running_nodes_segments_stay_even_without_its_data_path(node: NodeFactory) -> None:
    live = node("live")
    os.rmdir(live.data_path)
    assert _reclaimed(live.data_path) is None
    assert len(list_segments(live.data_path)) == 3
    live.kill()
    _reclaimed(live.data_path)
    assert list_segments(live.data_path) == []


def test_segments_without_a_readable_record_are_never_removed(node: NodeFactory, tmp_path: Path) -> None:
    unknown = str(tmp_path / "unknown")  # no record at all (made by no node)
    Segment.open(segment_name(unknown, "topic", "t"), 1 << 16, create=True).close()
    torn = node("torn")
    torn.kill()
    with open(SHM_DIR + torn.record, "wb") as f:  # as if killed while writing its record
        f.write(b'{"data_path": "/x", "dev"')
    os.rmdir(torn.data_path)
    try:
        assert _reclaimed(unknown) is None and _reclaimed(torn.data_path) is None
        assert len(list_segments(unknown)) == 1 and len(list_segments(torn.data_path)) == 3
    finally:
        for name in list_segments(unknown):
            unlink_segment(name)


def test_a_node_on_a_replaced_directory_drops_what_the_previous_one_left(node: NodeFactory) -> None:
    old = node("data")
    old.kill()
    first = {name: os.stat(SHM_DIR + name).st_ino for name in list_segments(old.data_path)}
    node("data").kill()  # a restart on the same directory keeps them
    assert {name: os.stat(SHM_DIR + name).st_ino for name in list_segments(old.data_path)} == first
    _replace(old.data_path)
    node("data")  # another directory at the path: what the old node left is not its own
    now = {name: os.stat(SHM_DIR + name).st_ino for name in list_segments(old.data_path)}
    assert set(now) == set(first)
    assert all(now[name] != first[name] for name in now if name != old.record)  # its queues are new


def test_release_removes_the_record_only_when_nothing_else_is_left(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        record = OwnerRecord.claim(str(tmp_path), fd)
        seg = Segment.open(segment_name(str(tmp_path), "topic", "t#ephemeral"), 1 << 16, create=True)
        seg.close()
        record.release()  # an ephemeral queue's segment stays: so does the record, for it
        assert list_segments(str(tmp_path)) == sorted([record.name, seg.name])
        unlink_segment(seg.name)
        record = OwnerRecord.claim(str(tmp_path), fd)
        record.release()
        record.release()  # twice is harmless
        assert list_segments(str(tmp_path)) == []
    finally:
        os.close(fd)
        for name in list_segments(str(tmp_path)):
            unlink_segment(name)


def test_a_record_this_user_may_not_open_is_left_alone(node: NodeFactory) -> None:
    """Another user's node (its record mode 0600, not ours): reclaiming goes on without it."""
    other = node("other")
    other.kill()
    os.rmdir(other.data_path)
    os.chmod(SHM_DIR + other.record, 0)
    wrapper = without_file_permission_overrides()  # root opens anything
    code = "from pynsqd.node.shmowner import reclaim; print([g.data_path for g in reclaim()])"
    proc = subprocess.run([*wrapper, sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=scaled(30))
    assert proc.returncode == 0 and other.data_path not in proc.stdout, proc.stderr
    assert len(list_segments(other.data_path)) == 3

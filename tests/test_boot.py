"""A node's start: the first boot's shards are forks of the zygote, which imported their code
while the supervisor set up; a node answering its first ``/ping`` serves; later shards are
fresh interpreters of the code installed then; a run that stops early leaves nothing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pynsqd.wire.commands import encode_pub
from testbed.harness import Daemon, remove_segments, scaled, wait_for
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.slow


@pytest.fixture
def nsqd(tmp_path: Path) -> Iterator[Daemon]:
    (tmp_path / "data").mkdir()
    daemon = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                          f"--data-path={tmp_path / 'data'}", "--shards=2"])
    try:
        yield daemon.start()
    finally:
        daemon.stop()
        remove_segments([daemon])


def http(nsqd: Daemon, path: str, body: bytes | None = None) -> bytes:
    with urllib.request.urlopen(nsqd.http_url + path, data=body, timeout=scaled(10)) as resp:
        return bytes(resp.read())


def shards(nsqd: Daemon) -> list[psutil.Process]:
    assert nsqd.proc is not None
    return psutil.Process(nsqd.proc.pid).children()


def test_the_first_shards_are_forks_of_the_zygote_and_the_first_ping_means_serving(nsqd: Daemon) -> None:
    """No interpreter was started for them (their command line is the supervisor's: they
    are forks of the zygote, which had imported the shard's code), they are the supervisor's
    children, and right after the first ``/ping`` a TCP PUB and an HTTP ``/pub`` succeed."""
    assert http(nsqd, "/ping") == b"OK"
    with RawClient(nsqd.tcp) as c:
        c.send(encode_pub("first", b"tcp"))
        c.expect_ok()
    assert http(nsqd, "/pub?topic=first", b"http") == b"OK"
    assert nsqd.proc is not None
    supervisor = psutil.Process(nsqd.proc.pid)
    forked = shards(nsqd)
    assert len(forked) == 2
    for shard in forked:
        assert shard.cmdline() == supervisor.cmdline()
        assert shard.ppid() == supervisor.pid
    assert sorted(shard.name() for shard in forked) == ["nsqd-shard-0", "nsqd-shard-1"]  # for top and ps
    assert nsqd.output.count("forked by the zygote") == 2, nsqd.output


def test_a_restarted_shard_is_a_fresh_interpreter_of_the_installed_code(nsqd: Daemon) -> None:
    """The zygote served the first boot only: a shard restarted after a crash runs the code
    installed now (``pynsqd.shard.worker`` started anew), and serves."""
    victim = shards(nsqd)[0]
    name = victim.name()
    assert name.startswith("nsqd-shard-")
    victim.send_signal(signal.SIGKILL)
    nsqd.wait_for_log(r"shard \d: started \(pid \d+, spawned\)")

    def respawned() -> list[psutil.Process]:
        return [p for p in shards(nsqd) if "pynsqd.shard.worker" in p.cmdline()]
    [fresh] = wait_for(respawned, 20, what="the restarted shard")
    assert fresh.pid != victim.pid
    wait_for(lambda: http(nsqd, "/ping") == b"OK", 20, what="the node ready again")
    for topic in ("t0", "t1", "t2", "t3"):  # on both shards
        assert http(nsqd, f"/pub?topic={topic}", b"x") == b"OK"
    wait_for(lambda: fresh.name() == name, 20, what="its name, nsqd-shard-N, once it runs")


def test_without_its_zygote_a_node_spawns_its_shards_and_serves(tmp_path: Path) -> None:
    """The zygote killed while it imports (it is ``nsqd``'s first child, forked before
    anything else): the supervisor says so and spawns every shard as a fresh interpreter,
    and the node serves on both shards."""
    (tmp_path / "data").mkdir()
    daemon = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                          f"--data-path={tmp_path / 'data'}", "--shards=2"])
    killed: list[int] = []

    def kill_the_zygote() -> None:
        end = time.monotonic() + scaled(10)
        while time.monotonic() < end and not killed:
            if daemon.proc is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    for child in psutil.Process(daemon.proc.pid).children():
                        child.kill()
                        killed.append(child.pid)
            time.sleep(0.001)
    killer = threading.Thread(target=kill_the_zygote)
    killer.start()
    try:
        daemon.start()
        killer.join()
        assert killed
        assert "the zygote did not start: spawning the shards" in daemon.output, daemon.output
        assert daemon.output.count("spawned)") == 2, daemon.output
        assert "forked by the zygote" not in daemon.output
        workers = [p for p in shards(daemon) if "pynsqd.shard.worker" in p.cmdline()]
        assert len(workers) == 2
        wait_for(lambda: http(daemon, "/ping") == b"OK", 20, what="the node serving")
        for topic in ("t0", "t1", "t2", "t3"):  # on both shards
            assert http(daemon, f"/pub?topic={topic}", b"x") == b"OK"
    finally:
        killer.join()
        daemon.stop()
        remove_segments([daemon])


def test_forked_shards_collect_garbage(nsqd: Daemon) -> None:
    """The collector is off while ``nsqd`` imports and the zygote forks; a forked shard turns
    it back on: the shards' collections (``/stats``' memory, summed over shards) go up as
    they serve."""
    def collections() -> int:
        return int(json.loads(http(nsqd, "/stats?format=json"))["memory"]["gc_total_runs"])
    before = collections()
    sent = 0

    def collected() -> bool:
        nonlocal sent
        for _ in range(50):
            http(nsqd, f"/pub?topic=gc{sent % 4}", b"x" * 100)  # on both shards
            sent += 1
        return collections() > before
    wait_for(collected, 30, what="a collection in a shard")


@pytest.mark.parametrize("flag", ["--version", "--no-such-flag"])
def test_a_run_that_ends_before_its_shards_leaves_no_process(tmp_path: Path, flag: str) -> None:
    """The zygote forked at start is killed when ``nsqd`` ends without shards."""
    marker = str(tmp_path / "data")
    out = subprocess.run([sys.executable, "-m", "pynsqd.supervisor", f"--data-path={marker}", flag],
                         capture_output=True, text=True, timeout=scaled(30), check=False)
    assert out.returncode == (0 if flag == "--version" else 1), out
    assert "Traceback" not in out.stderr
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or ())]
    assert not left, left
    assert os.listdir(tmp_path) == []

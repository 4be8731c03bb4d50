"""After a kill -9 the node serves at once and recovers its backlog while serving: a node
holding millions of messages in shared memory answers ``/ping`` and delivers its first message
after its restart for little more work than a fresh start, and then every message arrives
exactly once.

"At once" is asserted on the CPU time the node's processes use from the restart (or the kill
of a shard) until they serve, read from ``/proc``, against the CPU time the same node used for
its own fresh start in the same test: the work recovery puts in front of serving is what the
product controls, and a loaded machine does not stretch it, where it stretches the seconds on
the wall clock many times over (a node that recovered its whole backlog first spends seconds
of CPU on it). Beside it, a wall-clock bound far above any load's stretch catches a node that
waits instead of working.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from pynsqd.wire.commands import encode_mpub, encode_pub, encode_rdy, encode_sub
from testbed.harness import Daemon, connect, scaled, wait_for
from tests.support.cputime import Snapshot, spent_since, tree_cpu

pytestmark = pytest.mark.slow

SIZE = 200
BATCH = 25_000  # messages per MPUB: 5.1 MB, under the default --max-body-size
SERVE_CPU = 0.75  # CPU seconds to serving after a crash, past those of the node's fresh start
SERVE_WALL = 20.0  # seconds (scaled) from the restart to serving, on the wall clock
_FRAME = struct.Struct(">ii")


def body(seq: int) -> bytes:
    return b"%09d" % seq + b"x" * (SIZE - 9)


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """The next frame that is not a heartbeat (answered)."""
    while True:
        size, kind = _FRAME.unpack(_recv(sock, 8))
        data = _recv(sock, size - 4)
        if (kind, data) != (0, b"_heartbeat_"):
            return kind, data
        sock.sendall(b"NOP\n")


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def fill(nsqd: Daemon, count: int) -> None:
    """``count`` numbered messages on topic ``t``, channel ``c`` (made first)."""
    sock = connect(nsqd.tcp, timeout=60)
    sock.sendall(b"  V2" + encode_sub("t", "c"))
    assert read_frame(sock) == (0, b"OK")
    sock.close()
    sock = connect(nsqd.tcp, timeout=60)
    sock.sendall(b"  V2")
    for start in range(0, count, BATCH):
        sock.sendall(encode_mpub("t", [body(i) for i in range(start, min(count, start + BATCH))]))
        assert read_frame(sock) == (0, b"OK")
    sock.close()
    assert channel_depth(nsqd) == count


def channel_depth(nsqd: Daemon) -> int:
    with urllib.request.urlopen(f"{nsqd.http_url}/stats?format=json&topic=t&channel=c", timeout=scaled(30)) as r:
        stats = json.loads(r.read())
    return int(stats["topics"][0]["channels"][0]["depth"])


def ping(nsqd: Daemon) -> bool:
    try:
        with urllib.request.urlopen(f"{nsqd.http_url}/ping", timeout=scaled(5)) as r:
            return r.read() == b"OK"
    except OSError:
        return False


def subscribe(nsqd: Daemon) -> socket.socket:
    sock = connect(nsqd.tcp, timeout=60)
    sock.sendall(b"  V2" + encode_sub("t", "c"))
    assert read_frame(sock) == (0, b"OK")
    sock.sendall(encode_rdy(2500))
    return sock


def drain(sock: socket.socket, expected: int, first: bytes) -> bytearray:
    """FIN every message until ``expected`` more arrived (``first``: one already read);
    returns how many times each sequence number came."""
    seen = bytearray(expected)
    buf = bytearray(first)
    got = 0
    sock.settimeout(scaled(60))
    while got < expected:
        pos = 0
        fins = []
        while len(buf) - pos >= 8:
            size, kind = _FRAME.unpack_from(buf, pos)
            if len(buf) - pos < 4 + size:
                break
            if kind == 2:
                msg_id = bytes(buf[pos + 18:pos + 34])
                seq = int(buf[pos + 34:pos + 43])
                seen[seq] += 1
                fins.append(b"FIN " + msg_id + b"\n")
                got += 1
            elif kind == 1:
                raise AssertionError(bytes(buf[pos + 8:pos + 4 + size]))
            elif buf[pos + 8:pos + 4 + size] == b"_heartbeat_":
                fins.append(b"NOP\n")
            pos += 4 + size
        del buf[:pos]
        if fins:
            sock.sendall(b"".join(fins))
        if got < expected:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
    return seen


def fresh_start_cpu(nsqd: Daemon) -> float:
    """The CPU seconds the node's processes used from their start until ``/ping`` answered."""
    wait_for(lambda: ping(nsqd), 30, what="/ping")
    return spent_since({}, tree_cpu(nsqd.pid))


def serves_at_once_and_delivers_all(nsqd: Daemon, restart: Callable[[], Daemon], count: int,
                                    fresh_cpu: float) -> None:
    """Kill and restart (``restart`` returns the node to talk to, once started), then: ``/ping``
    and the first delivery for at most ``SERVE_CPU`` more CPU than the fresh start's
    (``fresh_cpu``), within ``SERVE_WALL``; a PUB meanwhile; every message once."""
    before: Snapshot = tree_cpu(nsqd.pid) if nsqd.running else {}
    t0 = time.monotonic()
    node = restart()
    wait_for(lambda: ping(node), 30, what="/ping")
    pinged_cpu = spent_since(before, tree_cpu(node.pid))
    pinged = time.monotonic() - t0
    sock = subscribe(node)
    kind, frame = read_frame(sock)
    delivered_cpu = spent_since(before, tree_cpu(node.pid))
    delivered = time.monotonic() - t0
    assert kind == 2
    pub = connect(node.tcp)
    pub.sendall(b"  V2" + encode_pub("t", body(count)))
    assert read_frame(pub) == (0, b"OK")
    pub.close()
    figures = dict(fresh_cpu=fresh_cpu, pinged_cpu=pinged_cpu, delivered_cpu=delivered_cpu,
                   pinged=pinged, delivered=delivered)
    assert pinged_cpu <= fresh_cpu + SERVE_CPU and delivered_cpu <= fresh_cpu + SERVE_CPU, figures
    assert pinged <= scaled(SERVE_WALL) and delivered <= scaled(SERVE_WALL), figures
    seen = drain(sock, count + 1, _FRAME.pack(len(frame) + 4, kind) + frame)
    sock.close()
    assert seen.count(1) == count + 1, [i for i, n in enumerate(seen) if n != 1][:10]  # each once
    node.wait_for_log(r"CHANNEL\(t:c\): recovered", timeout=60)
    assert channel_depth(node) == 0


def test_kill_9_of_the_tree_with_5_million_messages_in_shared_memory(nsqd_factory: Callable[..., Daemon],
                                                                  tmp_path: Path) -> None:
    count = 5_000_000
    flags = ("--mem-queue-size=6000000", "--log-level=info")
    nsqd = nsqd_factory(*flags, data_path=tmp_path / "node")
    fresh_cpu = fresh_start_cpu(nsqd)
    fill(nsqd, count)
    nsqd.kill()

    def restart() -> Daemon:
        return nsqd_factory(*flags, data_path=tmp_path / "node")
    serves_at_once_and_delivers_all(nsqd, restart, count, fresh_cpu)


def test_kill_9_of_the_shard_that_holds_the_backlog(nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    count = 1_500_000
    nsqd = nsqd_factory("--mem-queue-size=2000000", "--log-level=info", "--shards=2", data_path=tmp_path / "node")
    fresh_cpu = fresh_start_cpu(nsqd)
    fill(nsqd, count)
    owner = int((tmp_path / "node" / "pynsqd.placement").read_text().split()[0])
    with urllib.request.urlopen(f"{nsqd.http_url}/stats?format=json&include_shards=true", timeout=30) as r:
        pid = json.loads(r.read())["supervisor"]["shard_status"][owner]["pid"]

    def restart() -> Daemon:  # the supervisor restarts the shard (a SUB sent before it noticed is lost)
        os.kill(pid, signal.SIGKILL)
        nsqd.wait_for_log(rf"shard {owner} \(pid {pid}\) was killed")
        return nsqd
    serves_at_once_and_delivers_all(nsqd, restart, count, fresh_cpu)

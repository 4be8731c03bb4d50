"""After a kill -9 the node serves at once and recovers its backlog while serving: a node
holding millions of messages in shared memory answers ``/ping`` and delivers within a second
of its restart (``PYNSQD_TEST_TIMEOUT_SCALE`` stretches the bound on a loaded machine), and
then every message arrives exactly once."""

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
from tests.support.harness import Daemon, connect, scaled, wait_for

pytestmark = pytest.mark.slow

SIZE = 200
BATCH = 25_000  # messages per MPUB: 5.1 MB, under the default --max-body-size
SERVE_WITHIN = 1.0  # seconds from the restart (or the kill of a shard) to serving
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


def serves_at_once_and_delivers_all(nsqd: Daemon, restart: Callable[[], Daemon], count: int) -> None:
    """Kill and restart (``restart`` returns the node to talk to, once started), then: the
    first delivery within ``SERVE_WITHIN``; a PUB meanwhile; every message once."""
    t0 = time.monotonic()
    node = restart()
    wait_for(lambda: ping(node), 30, what="/ping")
    pinged = time.monotonic() - t0
    sock = subscribe(node)
    kind, frame = read_frame(sock)
    delivered = time.monotonic() - t0
    assert kind == 2
    pub = connect(node.tcp)
    pub.sendall(b"  V2" + encode_pub("t", body(count)))
    assert read_frame(pub) == (0, b"OK")
    pub.close()
    assert pinged <= scaled(SERVE_WITHIN) and delivered <= scaled(SERVE_WITHIN), (pinged, delivered)
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
    fill(nsqd, count)
    nsqd.kill()

    def restart() -> Daemon:
        return nsqd_factory(*flags, data_path=tmp_path / "node")
    serves_at_once_and_delivers_all(nsqd, restart, count)


def test_kill_9_of_the_shard_that_holds_the_backlog(nsqd_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    count = 1_500_000
    nsqd = nsqd_factory("--mem-queue-size=2000000", "--log-level=info", "--shards=2", data_path=tmp_path / "node")
    fill(nsqd, count)
    owner = int((tmp_path / "node" / "pynsqd.placement").read_text().split()[0])
    with urllib.request.urlopen(f"{nsqd.http_url}/stats?format=json&include_shards=true", timeout=30) as r:
        pid = json.loads(r.read())["supervisor"]["shard_status"][owner]["pid"]

    def restart() -> Daemon:  # the supervisor restarts the shard (a SUB sent before it noticed is lost)
        os.kill(pid, signal.SIGKILL)
        nsqd.wait_for_log(rf"shard {owner} \(pid {pid}\) was killed")
        return nsqd
    serves_at_once_and_delivers_all(nsqd, restart, count)

"""Rolling restart (SIGHUP): every shard replaced by a new process while clients keep their
connections, and connections handed to a shard that dies before it took them."""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pynsqd
from pynsqd.shm.segment import node_prefix
from pynsqd.wire.commands import encode_fin, encode_pub, encode_rdy, encode_req, encode_sub
from pynsqd.wire.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE
from testbed.certs import Certs
from testbed.harness import Daemon, remove_segments, scaled, wait_for
from tests.support.rawclient import Message, RawClient

pytestmark = pytest.mark.slow

NodeFactory = Callable[..., Daemon]
SHARD_STATS = "/stats?format=json&include_shards=true"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeFactory]:
    """``node("--shards=2")`` → a started nsqd on ``tmp_path/data``."""
    started: list[Daemon] = []

    def make(*args: str, env: dict[str, str] | None = None) -> Daemon:
        path = tmp_path / "data"
        path.mkdir(exist_ok=True)
        daemon = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                              f"--data-path={path}", *args], env=env)
        started.append(daemon)
        return daemon.start()

    yield make
    for daemon in started:
        daemon.stop()
    remove_segments(started)


def get_json(nsqd: Daemon, path: str) -> Any:
    with urllib.request.urlopen(nsqd.http_url + path, timeout=scaled(10)) as resp:
        return json.loads(resp.read())


def supervisor(nsqd: Daemon) -> dict[str, Any]:
    return dict(get_json(nsqd, SHARD_STATS)["supervisor"])


def pids(nsqd: Daemon) -> list[int]:
    return [s["pid"] for s in supervisor(nsqd)["shard_status"]]


def reload(nsqd: Daemon, timeout: float = 60) -> None:
    """SIGHUP, then wait until that reload replaced every shard."""
    before = supervisor(nsqd)
    nsqd.signal(signal.SIGHUP)
    wait_for(lambda: supervisor(nsqd)["reloads"] > before["reloads"], timeout, what="the reload")
    after = supervisor(nsqd)
    assert after["shards_replaced"] - before["shards_replaced"] == after["shards"]
    assert not set(pids(nsqd)) & {s["pid"] for s in before["shard_status"]}


def client_stats(nsqd: Daemon, topic: str, channel: str) -> list[dict[str, Any]]:
    stats = get_json(nsqd, f"/stats?format=json&topic={topic}&channel={channel}")
    return [cl for t in stats["topics"] for c in t["channels"] if c["channel_name"] == channel for cl in c["clients"]]


def test_a_reload_replaces_every_shard_and_plain_connections_carry_on(node: NodeFactory) -> None:
    """Every shard process is replaced; a consumer holding messages, one waiting on a
    deferred REQ and a producer keep their connections: the held messages are FINed on the
    same connection as if nothing happened, nothing is delivered twice, the REQ'd message
    comes at its due time, the producer's next PUB is answered, and the clients' counters
    carry on."""
    nsqd = node("--shards=2", "--msg-timeout=60s")
    with RawClient(nsqd.tcp) as p, RawClient(nsqd.tcp) as holder, RawClient(nsqd.tcp) as deferrer:
        holder.identify(client_id="holder")
        holder.subscribe("r0", "c", rdy=0)
        deferrer.subscribe("r0", "d", rdy=0)  # a channel of its own: its REQ is for it alone
        for i in range(10):
            p.send(encode_pub("r0", b"m%d" % i))
            p.expect_ok()
        holder.send(encode_rdy(3))
        held = holder.read_messages(3)
        deferrer.send(encode_rdy(1))
        req = deferrer.read_message()
        deferrer.send(encode_req(req.id, 4000) + encode_rdy(0))
        req_at = time.monotonic()
        holder.expect_nothing(0.2)  # RDY 3, all 3 held: nothing more comes
        reload(nsqd)
        for msg in held:
            holder.send(encode_fin(msg.id))
        holder.send(encode_rdy(10))
        rest = holder.read_messages(7, timeout=10)
        holder.expect_nothing(0.2)
        bodies = {m.body for m in held} | {m.body for m in rest}
        assert len(bodies) == 10 and req.body == b"m0"  # none twice, none lost
        assert all(m.attempts == 1 for m in rest)
        for msg in rest:
            holder.send(encode_fin(msg.id))
        deferrer.send(encode_rdy(20))
        on_d: dict[bytes, Message] = {}
        arrived: dict[bytes, float] = {}
        while len(on_d) < 10:
            msg = deferrer.read_message(timeout=10)
            assert msg.body not in on_d
            on_d[msg.body] = msg
            arrived[msg.body] = time.monotonic()
            deferrer.send(encode_fin(msg.id))
        assert on_d[req.body].attempts == 2 and arrived[req.body] - req_at >= 3.9  # not before its due time
        p.send(encode_pub("r0", b"after"))
        p.expect_ok()
        assert holder.read_message(timeout=10).body == b"after"
        stats = {c["client_id"]: c for c in client_stats(nsqd, "r0", "c")}
        assert stats["holder"]["message_count"] == 11 and stats["holder"]["finish_count"] == 10
        for c in (p, holder, deferrer):  # no error frame anywhere, every connection open
            assert not any(kind == FRAME_ERROR for kind, _ in c.frames)


def test_a_message_in_flight_across_a_reload_keeps_its_deadline(node: NodeFactory) -> None:
    """A message held across a reload times out at the deadline it was given before,
    not at a new one counted from the replacement."""
    nsqd = node("--shards=1")
    with RawClient(nsqd.tcp) as p, RawClient(nsqd.tcp) as c:
        p.send(encode_pub("dl", b"x"))
        p.expect_ok()
        c.identify(msg_timeout=4000)
        c.subscribe("dl", "c", rdy=1)
        first = c.read_message()
        delivered = time.monotonic()
        reload(nsqd)
        again = c.read_message(timeout=15)
        assert again.id == first.id and again.attempts == 2
        assert 3.9 <= time.monotonic() - delivered < 4 + scaled(2.5)


def test_tls_and_compressed_connections_are_closed_and_their_messages_requeued_at_once(
        node: NodeFactory, certs: Certs) -> None:
    """TLS and snappy connections cannot move: each is closed cleanly, and the messages it
    held go back to the queue at once (not after --msg-timeout), to a plain consumer."""
    nsqd = node("--shards=1", "--msg-timeout=60s", *certs.server_args())
    with RawClient(nsqd.tcp) as p, RawClient(nsqd.tcp) as tls, RawClient(nsqd.tcp) as snappy, \
            RawClient(nsqd.tcp) as plain:
        for i in range(4):
            p.send(encode_pub("up", b"u%d" % i))
            p.expect_ok()
        held = []
        for c, (ctx, compression) in ((tls, (certs.client_context(), "")), (snappy, (None, "snappy"))):
            c.negotiate(ctx, compression)
            c.send(encode_sub("up", "c") + encode_rdy(2))
            c.expect_ok()
            held += c.read_messages(2)
        plain.subscribe("up", "c", rdy=0)
        started = time.monotonic()
        reload(nsqd)
        tls.expect_closed()
        snappy.expect_closed()
        plain.send(encode_rdy(10))
        again = plain.read_messages(4, timeout=10)
        assert {m.id for m in again} == {m.id for m in held} and {m.attempts for m in again} == {2}
        assert time.monotonic() - started < 30  # long before the 60 s timeout
    nsqd.wait_for_log(r"closed 2 connection\(s\) that cannot move \(TLS or compression\): 4 message\(s\)")


def _publish_through_a_reload(nsqd: Daemon, publish: Callable[[int, int], None]) -> int:
    """SIGHUP, then ``publish(i, i)`` for i = 0, 1, ... until the reload is done; how many."""
    before = supervisor(nsqd)["reloads"]
    nsqd.signal(signal.SIGHUP)
    n = 0
    deadline = time.monotonic() + scaled(60)
    while supervisor(nsqd)["reloads"] == before:
        assert time.monotonic() < deadline, "the reload did not finish"
        publish(n, n)
        n += 1
    return n


def test_http_keep_alive_publishers_are_never_refused_or_answered_with_an_error(node: NodeFactory) -> None:
    """Keep-alive HTTP publishers, idle and busy when the reload comes, keep publishing
    through it: every request is answered 200, none fails; a connection is given another
    shard between two requests, never in the middle of one."""
    nsqd = node("--shards=2")
    conns = [http.client.HTTPConnection(*nsqd.http, timeout=scaled(30)) for _ in range(4)]
    answers: list[int] = []

    def publish(i: int, n: int) -> None:
        conn = conns[i % len(conns)]
        conn.request("POST", f"/pub?topic=hp{i % 3}", body=b"m%d" % n)
        resp = conn.getresponse()
        resp.read()
        answers.append(resp.status)

    socks = []
    for i in range(len(conns)):
        publish(i, -1)
        socks.append(conns[i].sock)
    n = _publish_through_a_reload(nsqd, publish)
    for i in range(len(conns)):
        publish(i, n + i)
    assert set(answers) == {200} and len(answers) == n + 2 * len(conns)
    assert [c.sock for c in conns] == socks  # the same connections throughout
    for conn in conns:
        conn.close()


def test_https_keep_alive_publishers_are_told_to_reconnect_and_never_answered_with_an_error(
        node: NodeFactory, certs: Certs) -> None:
    """An HTTPS connection cannot move (its TLS state lives in the shard's process): each is
    answered ``Connection: close`` once it owes nothing more and its client opens a new one,
    which another shard serves; no request fails."""
    nsqd = node("--shards=2", *certs.server_args())
    wait_for(lambda: "HTTPS" in nsqd.addresses, 10, what="the HTTPS listener")
    conns = [http.client.HTTPSConnection(*nsqd.address("HTTPS"), timeout=scaled(30),
                                         context=certs.client_context()) for _ in range(3)]
    answers: list[int] = []
    closes = 0

    def publish(i: int, n: int) -> None:
        nonlocal closes
        conn = conns[i % len(conns)]
        conn.request("POST", f"/pub?topic=hs{i % 3}", body=b"m%d" % n)
        resp = conn.getresponse()
        resp.read()
        answers.append(resp.status)
        closes += resp.getheader("connection") == "close"

    for i in range(len(conns)):
        publish(i, -1)
    n = _publish_through_a_reload(nsqd, publish)
    assert set(answers) == {200} and len(answers) == n + len(conns)
    assert closes >= len(conns)  # each was told, in an answer, to reconnect
    for conn in conns:
        conn.close()


def test_a_reload_applies_changed_options_and_refuses_a_fixed_one(node: NodeFactory, tmp_path: Path) -> None:
    """The config file is read again: a changed option reaches the new shards (a RDY the
    old limit refused is accepted), one that cannot change without a restart refuses the
    whole reload with one line, and the node runs on as it was."""
    config = tmp_path / "nsqd.toml"
    config.write_text("max_rdy_count = 10\n")
    nsqd = node("--shards=2", f"--config={config}")
    with RawClient(nsqd.tcp) as c:
        c.subscribe("opt", "c")
        c.send(encode_rdy(50))
        c.expect_error("E_INVALID RDY count 50 out of range 0-10")
    config.write_text("max_rdy_count = 100\n")
    reload(nsqd)
    with RawClient(nsqd.tcp) as c:
        c.subscribe("opt", "c")
        c.send(encode_rdy(50) + encode_pub("opt", b"x"))
        frames = [c.read_frame(), c.read_frame()]
        assert sorted(kind for kind, _ in frames) == [FRAME_RESPONSE, FRAME_MESSAGE]  # OK, and no error
    running = pids(nsqd)
    config.write_text("max_rdy_count = 100\nmem_queue_bytes = 99999999\n")
    nsqd.signal(signal.SIGHUP)
    nsqd.wait_for_log(r"reload refused: --mem-queue-bytes cannot change without a restart")
    assert pids(nsqd) == running and supervisor(nsqd)["reloads"] == 1


def test_a_tcp_connection_handed_to_a_shard_that_dies_before_taking_it_goes_to_its_replacement(
        node: NodeFactory) -> None:
    """The supervisor keeps a handed-over connection until the shard says it has it: one
    handed to a stopped shard that is then killed is served, unread and unbroken, by the
    shard that replaces it."""
    nsqd = node("--shards=1")
    pid = pids(nsqd)[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        with RawClient(nsqd.tcp) as p:
            p.send(encode_pub("dying", b"x"))  # read by the supervisor, handed to the stopped shard
            wait_for(lambda: supervisor_handoffs_pending(pid), 10, what="the hand-off to reach the shard")
            os.kill(pid, signal.SIGKILL)
            p.expect_ok()  # answered by the restarted shard, on the same connection
    finally:
        with_suppressed(lambda: os.kill(pid, signal.SIGCONT))
    assert supervisor(nsqd)["shard_restarts"] == 1


def test_an_http_connection_handed_to_a_shard_that_dies_before_taking_it_is_served_by_another(
        node: NodeFactory) -> None:
    """The same for HTTP: a request on a connection handed to a shard that is killed before
    it took it is answered by another shard."""
    nsqd = node("--shards=2")
    victim = pids(nsqd)[0]
    os.kill(victim, signal.SIGSTOP)  # still beating for 1.5 s: the next connections go to it in turn
    try:
        conns = [socket.create_connection(nsqd.http, timeout=scaled(10)) for _ in range(2)]
        wait_for(lambda: supervisor_handoffs_pending(victim), 10, what="a hand-off to reach the stopped shard")
        os.kill(victim, signal.SIGKILL)
        for conn in conns:
            conn.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while b"\r\n\r\nOK" not in data:
                chunk = conn.recv(65536)
                assert chunk, f"connection closed after {data!r}"
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 OK")
            conn.close()
    finally:
        with_suppressed(lambda: os.kill(victim, signal.SIGCONT))


def supervisor_handoffs_pending(pid: int) -> bool:
    """A control message waits unread in the (stopped) shard ``pid``'s control socket."""
    out = subprocess.run(["ss", "-x", "-p", "-n"], capture_output=True, text=True, check=True).stdout
    return any(line.startswith("u_seq") and f"pid={pid}," in line and int(line.split()[2]) > 0
               for line in out.splitlines())


def with_suppressed(action: Callable[[], None]) -> None:
    try:
        action()
    except ProcessLookupError:
        pass


# --- upgrading the supervisor (SIGUSR2) ------------------------------------------------------

@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """A copy of the installed package to run a node from, so a test can change it under
    the running node, as an upgrade of the package does."""
    root = tmp_path / "installed"
    shutil.copytree(Path(pynsqd.__file__).parent, root / "pynsqd", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _node_from(installed: Path, tmp_path: Path, *args: str) -> Daemon:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    return Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                        f"--data-path={data}", *args], cwd=str(installed)).start()


def _set_version(installed: Path, version: str) -> None:
    init = installed / "pynsqd" / "__init__.py"
    init.write_text(re.sub(r'__version__ = "[^"]*"', f'__version__ = "{version}"', init.read_text()))


class Connector:
    """Opens a new TCP connection and publishes on it, again and again, on a thread: counts
    the attempts refused or failed and the publishes answered."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.refused: list[str] = []
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with RawClient(self.address) as c:
                    c.send(encode_pub("connector", b"x"))
                    c.expect_ok()
                self.answered += 1
            except (OSError, AssertionError) as exc:
                self.refused.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(scaled(30))


def test_an_upgrade_re_executes_the_installed_supervisor_in_place(installed: Path, tmp_path: Path) -> None:
    """SIGUSR2: the supervisor re-executes the installed code with the same pid, its
    listeners and shards inherited, then replaces the shards too; no connection attempt is
    refused at any point, and a consumer holding messages carries on as if nothing happened."""
    nsqd = _node_from(installed, tmp_path, "--shards=2", "--msg-timeout=60s")
    try:
        with RawClient(nsqd.tcp) as p, RawClient(nsqd.tcp) as c:
            c.subscribe("up", "c", rdy=0)
            for i in range(4):
                p.send(encode_pub("up", b"u%d" % i))
                p.expect_ok()
            c.send(encode_rdy(2))
            held = c.read_messages(2)
            before = supervisor(nsqd)
            _set_version(installed, "9.9.9")
            connector = Connector(nsqd.tcp)
            try:
                nsqd.signal(signal.SIGUSR2)
                wait_for(lambda: supervisor(nsqd)["upgrades"] == 1 and supervisor(nsqd)["reloads"] == 1, 90,
                         what="the upgrade and its reload")
                wait_for(lambda: connector.answered > 50, 30, what="connections after the upgrade")
            finally:
                connector.stop()
            assert connector.refused == []
            after = supervisor(nsqd)
            assert after["version"] == "9.9.9" and {s["version"] for s in after["shard_status"]} == {"9.9.9"}
            assert not {s["pid"] for s in after["shard_status"]} & {s["pid"] for s in before["shard_status"]}
            nsqd.wait_for_log(r"pynsqd 9\.9\.9 \(nsqd v")
            nsqd.wait_for_log(rf"upgraded: this supervisor \(pid {nsqd.pid}\) runs the installed code")
            assert _owner_locked(tmp_path / "data")  # the shared memory's owner record stayed locked
            for msg in held:
                c.send(encode_fin(msg.id))
            c.send(encode_rdy(10))
            rest = c.read_messages(2)
            assert {m.body for m in held + rest} == {b"u0", b"u1", b"u2", b"u3"}
            assert all(m.attempts == 1 for m in rest)
            p.send(encode_pub("up", b"after"))
            p.expect_ok()
            assert c.read_message().body == b"after"
            assert not any(kind == FRAME_ERROR for kind, _ in c.frames + p.frames)
    finally:
        nsqd.stop()
        remove_segments([nsqd])


def _owner_locked(data: Path) -> bool:
    """The node's shared-memory owner record is locked by a process (its supervisor)."""
    fd = os.open(f"/dev/shm/{node_prefix(str(data))}owner", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_an_upgrade_to_code_that_does_not_start_is_refused(installed: Path, tmp_path: Path) -> None:
    """The installed code is started first, apart: when it fails, the upgrade is refused
    with its error, and the node runs on untouched."""
    nsqd = _node_from(installed, tmp_path, "--shards=1")
    try:
        before = supervisor(nsqd)
        (installed / "pynsqd" / "shard" / "handover.py").write_text("def broken(:\n")
        nsqd.signal(signal.SIGUSR2)
        nsqd.wait_for_log(r"upgrade refused: pynsqd\.shard\.worker fails to start - SyntaxError", timeout=60)
        with RawClient(nsqd.tcp) as p:
            p.send(encode_pub("still", b"x"))
            p.expect_ok()
        after = supervisor(nsqd)
        assert after["upgrades"] == 0 and after["shard_status"] == before["shard_status"]
    finally:
        nsqd.stop()
        remove_segments([nsqd])

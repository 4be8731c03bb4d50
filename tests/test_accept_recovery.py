"""The supervisor's accept loops on real nodes: under ``prlimit --nofile`` a node runs out of
descriptors, logs it once, and serves again once they are free; a burst of connections
accepted at once reaches the shard whole."""

from __future__ import annotations

import os
import resource
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynsqd.supervisor.accept import RESERVE
from pynsqd.wire.commands import encode_pub
from testbed.harness import Daemon, connect, remove_segments, scaled, wait_for
from tests.support.rawclient import RawClient

pytestmark = pytest.mark.slow

NOFILE = 64
FLOOD = 120


@pytest.fixture
def limited_node(tmp_path: Path) -> Iterator[Daemon]:
    """A one-shard node whose processes may hold ``NOFILE`` descriptors each."""
    daemon = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                          f"--data-path={tmp_path}", "--shards=1"],
                    wrapper=["prlimit", f"--nofile={NOFILE}"])
    daemon.start()
    yield daemon
    daemon.stop()
    remove_segments([daemon])


def _flood(address: tuple[str, int]) -> list[socket.socket]:
    conns = []
    for _ in range(FLOOD):
        conns.append(connect(address))
    return conns


def _published(address: tuple[str, int]) -> bool:
    """A fresh connection publishes and gets ``OK``; False if the node closed it unanswered,
    as it does while the flood's last connections still hold its descriptors (a client
    connects again, and so does this)."""
    try:
        with RawClient(address) as client:
            client.send(encode_pub("accept_recovery", b"after"))
            client.expect_response(b"OK", timeout=scaled(5))
    except ConnectionError:
        return False
    return True


def _pinged(url: str) -> bool:
    with urllib.request.urlopen(url + "/ping", timeout=scaled(5)) as resp:
        return resp.read() == b"OK"


def test_tcp_accept_recovers_once_descriptors_free_up(limited_node: Daemon) -> None:
    """Silent connections stay with the supervisor until their hand-off, so a flood of them
    exhausts its descriptors: accept fails, is logged once, pauses; once the flood is
    closed, new connections are served again."""
    node = limited_node
    listener = "TCP"
    conns = _flood(node.tcp)
    try:
        line = node.wait_for_log(rf"{listener}: accept failed .*Too many open files", timeout=10)
        assert "retrying" in line
    finally:
        for conn in conns:
            conn.close()
    node.wait_for_log(rf"{listener}: accepting again", timeout=10)
    assert wait_for(lambda: _published(node.tcp), timeout=10, what="a TCP publish after the flood")
    assert wait_for(lambda: _pinged(node.http_url), timeout=10, what="an HTTP /ping after the flood")
    lines = node.output.splitlines()
    failures = [ln for ln in lines if f"{listener}: accept failed" in ln]
    recoveries = [ln for ln in lines if f"{listener}: accepting again" in ln]
    assert len(failures) == len(recoveries), failures  # once per spell, not once per attempt
    assert node.running


@pytest.fixture
def one_shard(tmp_path: Path) -> Iterator[Daemon]:
    daemon = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                          f"--data-path={tmp_path}", "--shards=1"])
    daemon.start()
    yield daemon
    daemon.stop()
    remove_segments([daemon])


def test_a_burst_of_http_connections_reaches_the_shard_whole(one_shard: Daemon) -> None:
    """60 connections queued while the supervisor is stopped are accepted in one wake-up and
    handed to the one shard in one control message: every one of them is served."""
    node = one_shard
    os.kill(node.pid, signal.SIGSTOP)
    try:
        conns = [connect(node.http) for _ in range(60)]
    finally:
        os.kill(node.pid, signal.SIGCONT)
    try:
        for conn in conns:
            conn.sendall(b"GET /ping HTTP/1.1\r\nHost: nsqd\r\n\r\n")
        answers = []
        for conn in conns:
            conn.settimeout(scaled(10))
            try:
                answers.append(conn.recv(1000).split(b"\r\n", 1)[0])
            except OSError as exc:
                answers.append(repr(exc).encode())
    finally:
        for conn in conns:
            conn.close()
    assert answers == [b"HTTP/1.1 200 OK"] * 60
    assert "descriptors sent with a message were lost" not in node.output


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_connections_a_shard_had_no_descriptors_for_are_not_kept_by_the_supervisor(limited_node: Daemon) -> None:
    """Silent connections go to the shard in waves until it runs out of descriptors and the
    kernel drops the ones sent to it: the shard says so, the supervisor tries again and
    gives each up, so once the clients are gone it holds no more than before (it used to
    keep each until a ten-minute answer deadline, and stopped accepting for good)."""
    node = limited_node
    before = _descriptors(node.pid)
    conns: list[socket.socket] = []
    try:
        for _ in range(FLOOD // 20):  # 20 at a time: the supervisor hands each wave on before the next
            conns += [connect(node.tcp) for _ in range(20)]
            wait_for(lambda: _descriptors(node.pid) <= before + 5, timeout=scaled(10),
                     what="the supervisor handing its connections on")
        node.wait_for_log(r"descriptors sent with a message were lost", timeout=10)
    finally:
        for conn in conns:
            conn.close()
    wait_for(lambda: _descriptors(node.pid) <= before, timeout=scaled(10),
             what=f"the supervisor back to its {before} descriptors")
    assert wait_for(lambda: _published(node.tcp), timeout=10, what="a TCP publish after the flood")


def test_accepting_stops_short_of_the_limit_keeping_descriptors_for_connections_handed_over(
        limited_node: Daemon) -> None:
    """The supervisor relays a replaced shard's connections (up to 253 in one message) and
    spawns processes: under a flood it stops accepting while the last quarter of its
    descriptors (up to ``RESERVE``) would be spent, rather than at the limit itself."""
    node = limited_node
    ceiling = NOFILE - min(RESERVE, NOFILE // 4)
    conns = _flood(node.tcp)
    try:
        node.wait_for_log(rf"TCP: accept failed - .*\({ceiling} in use; the rest are kept", timeout=10)
        seen = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # sampled through the flood: never up to the limit
            seen.append(_descriptors(node.pid))
        assert max(seen) < NOFILE - 4, max(seen)
    finally:
        for conn in conns:
            conn.close()
    assert wait_for(lambda: _published(node.tcp), timeout=10, what="a TCP publish after the flood")


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one_as_go_programs_do(tmp_path: Path) -> None:
    """Go's nsqd runs with its soft ``RLIMIT_NOFILE`` raised to the hard one (every Go program
    since Go 1.19 does so at start): so do the supervisor and, inheriting it, its shards."""
    daemon = Daemon("pynsqd.supervisor", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                          f"--data-path={tmp_path}", "--shards=2"],
                    wrapper=["prlimit", "--nofile=256:4096"])
    daemon.start()
    try:
        shards = Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read_text().split()
        assert len(shards) == 2
        for pid in [daemon.pid, *map(int, shards)]:
            assert resource.prlimit(pid, resource.RLIMIT_NOFILE) == (4096, 4096)
    finally:
        daemon.stop()
        remove_segments([daemon])


def test_connections_past_the_ceiling_wait_in_the_backlog_and_are_all_served(one_shard: Daemon) -> None:
    """With only the supervisor's limit lowered (its shard keeps room), a flood of connections
    that say nothing past the magic fills the supervisor up to its ceiling; the rest wait in
    the kernel's backlog, none is accepted only to be closed, and once they publish every one
    of them is answered ``OK``."""
    node = one_shard
    _, hard = resource.prlimit(node.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(node.pid, resource.RLIMIT_NOFILE, (NOFILE, hard))
    clients = [RawClient(node.tcp) for _ in range(FLOOD)]  # each sends the magic, then waits
    try:
        ceiling = NOFILE - min(RESERVE, NOFILE // 4)
        node.wait_for_log(rf"TCP: accept failed - .*\({ceiling} in use; the rest are kept", timeout=10)
        for client in clients:
            client.send(encode_pub("backlog", b"waited"))
        answers = []
        for client in clients:
            try:
                answers.append(client.expect_response(timeout=10))
            except (ConnectionError, TimeoutError) as exc:
                answers.append(repr(exc).encode())
    finally:
        for client in clients:
            client.close()
    assert answers == [b"OK"] * FLOOD

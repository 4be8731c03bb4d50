"""The supervisor's accept loops on real nodes: under ``prlimit --nofile`` a node runs out of
descriptors, logs it once, and serves again once they are free; a burst of connections
accepted at once reaches the shard whole."""

from __future__ import annotations

import os
import signal
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynsqd.wire.commands import encode_pub
from tests.support.harness import Daemon, connect, remove_segments, scaled, wait_for
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
    """A fresh connection publishes and gets ``OK``."""
    with RawClient(address) as client:
        client.send(encode_pub("accept_recovery", b"after"))
        client.expect_response(b"OK", timeout=scaled(5))
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
